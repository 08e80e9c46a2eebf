//! Property tests of the name-list domain rules (API.md, "Name-lists", under rules 1) and of the storage
//! layout (`store::layout`): value normalisation, the Redis field and bucket of an entry in both
//! layout formats (held to independent implementations of their documented hashing), the
//! expiry encoding and IP ranges. No store, no network: these run in a second or two.
//!
//! Failures are not persisted to `proptest-regressions/`: a failing case is printed, shrunk,
//! and belongs in a unit test next to the code it breaks.
//!
//! This module holds the configuration and small helpers (rules 1's parsers among them);
//! `forms` the generators of valid values, canonical and decorated; then the properties:
//! `normalisation` (1), `layout` (2 and 3: the field and the bucket), `expiry` (4), `ip` (5),
//! `segments` (6: phone segments and e-mail domains).

mod expiry;
mod forms;
mod ip;
mod layout;
mod normalisation;
mod segments;

use namelist::domain::{Dimension, Norm, ValidationError, Value};
use proptest::prelude::*;
use proptest::sample::select;

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// 2021-01-01T00:00:00Z, in Unix ms.
const Y2021_MS: i64 = 1_609_459_200_000;
/// 2088-01-01T00:00:00Z, in Unix ms.
const Y2088_MS: i64 = 3_723_753_600_000;
/// 2100-01-01T00:00:00Z, in Unix ms.
const Y2100_MS: i64 = 4_102_444_800_000;
/// 2150-01-01T00:00:00Z, in Unix ms.
const Y2150_MS: i64 = 5_680_281_600_000;

// The rules of the table in API.md's "Name-lists" as keyspaces made before issue 29 keep
// them: rules 1 (rules 2's own properties are in `src/domain/rules.rs`).
fn entry(dim: &Dimension, raw: &str) -> Result<Value, ValidationError> {
    Value::parse_entry_with(dim, raw, Norm::V1)
}

fn check(dim: &Dimension, raw: &str) -> Result<Value, ValidationError> {
    Value::parse_check_with(dim, raw, Norm::V1)
}

/// The canonical text of a parse result, or the error code, for readable assertion output.
fn shown(r: &Result<Value, ValidationError>) -> Result<String, String> {
    match r {
        Ok(v) => Ok(v.to_string()),
        Err(e) => Err(format!("{}: {}", e.code, e.message)),
    }
}

/// Every built-in dimension plus a custom one.
fn all_dimensions() -> Vec<Dimension> {
    let mut dims = Dimension::BUILT_IN.to_vec();
    dims.push(Dimension::Custom("merchant_id".into()));
    dims
}

/// A built-in dimension or a random custom name.
fn dimension() -> impl Strategy<Value = Dimension> {
    prop_oneof![
        3 => select(all_dimensions()),
        1 => "[a-z][a-z0-9_]{0,31}".prop_map(|s| s.parse::<Dimension>().expect("a dimension name")),
    ]
}

/// Whitespace that `str::trim` removes, including the ideographic space of CJK keyboards.
fn ws() -> impl Strategy<Value = String> {
    prop::collection::vec(
        select(vec![' ', '\t', '\n', '\r', '\u{3000}', '\u{a0}']),
        0..3,
    )
    .prop_map(String::from_iter)
}

/// Random ASCII case: character `i` is upper-cased when `flips[i % len]`.
fn random_case(s: &str, flips: &[bool]) -> String {
    s.chars()
        .enumerate()
        .map(|(i, c)| {
            if flips[i % flips.len()] {
                c.to_ascii_uppercase()
            } else {
                c.to_ascii_lowercase()
            }
        })
        .collect()
}

/// `seps[i % len]` before every character of `s` and one more after the last.
fn interleave(s: &str, seps: &[String]) -> String {
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        out.push_str(&seps[i % seps.len()]);
        out.push(c);
    }
    out.push_str(&seps[s.chars().count() % seps.len()]);
    out
}

fn flips() -> impl Strategy<Value = Vec<bool>> {
    prop::collection::vec(any::<bool>(), 1..20)
}

/// A canonical value and 1-4 differently typed forms of it, as (canonical text, forms).
type Forms = (String, Vec<String>);
