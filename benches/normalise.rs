//! Normalise + fingerprint + bucket: the CPU work a check does per subject value before it
//! touches the cache or the store. `Value::parse_check` then `Layout::entry_key` for each of
//! the seven built-in dimensions, on a 1,000,000-entry layout (5,000 buckets).
//!
//! * `normalise/subject_7_dimensions`: the default, a keyed (format 2) layout: SipHash-2-4-128
//!   under the fingerprint key.
//! * `normalise/subject_7_dimensions_unkeyed`: format 1 (xxh3-64 field, crc32 bucket), what
//!   keyspaces made before keyed fingerprints use.
//! * `normalise/subject_7_dimensions_blake3`: the same work with keyed BLAKE3 as the PRF, the
//!   candidate not chosen (measured, not used: see `store::fingerprint`).
//! * `fingerprint/*`: the three hash functions alone over the subject's 7 canonical byte
//!   strings, so their difference is not lost in the normalisation's noise.
//! * `normalise/dimension/*`: each dimension alone (keyed), and the phone typed without its
//!   country code (`phone_national`) and one the parser cannot make valid
//!   (`phone_not_valid`). Each repeats one value, so a phone is answered from the memory of
//!   recent phones (`domain::rules`); `phone_never_seen` is a new mobile number each time (the
//!   fast path's cost: what a new identity pays), `phone_never_seen_fixed_line` a new fixed
//!   line written with its national prefix (the phone crate's cost),
//!   `phone_never_seen_not_valid` a new number of a prefix no CN number has (the fast path's
//!   "not valid").
//! * `normalise/rules1/*`: the subject and each dimension under rules 1, what keyspaces made
//!   before issue 29 use (no phone parser, no check digits): the before of rules 2's after.
//!
//! Everything else runs under rules 2, a new keyspace's.
//!
//! `cargo bench --bench normalise`

#[path = "../tests/common/mod.rs"]
mod common;

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use namelist::domain::{Dimension, ListName, Norm, Sandbox, Value};
use namelist::store::layout::{canonical, write_canonical};
use namelist::store::{EntryKey, Hashing, Layout};

/// A 7-dimension subject as a risk engine sends it (raw, un-normalised).
const SUBJECT: [(Dimension, &str); 7] = [
    (Dimension::Uid, "u1234567890"),
    (Dimension::Phone, "+86 138-0000-0000"),
    (Dimension::IdCard, "11010519491231002x"),
    (Dimension::Device, "d-8f3a9c2e5b7d4f10"),
    (Dimension::Imei, "490154203237518"),
    (Dimension::WifiMac, "AA-BB-CC-DD-EE-FF"),
    (Dimension::Ip, "10.1.2.3"),
];

const BUCKETS: u32 = 5000;

fn key_of(
    layout: &Layout,
    list: &ListName,
    sandbox: &Sandbox,
    dim: &Dimension,
    raw: &str,
    norm: Norm,
) -> EntryKey {
    let value = Value::parse_check_with(dim, raw, norm).expect("valid subject value");
    layout.entry_key(list, dim, sandbox, &value)
}

/// The subject through `layout`, as a check computes it under `norm`.
fn subject(layout: &Layout, list: &ListName, sandbox: &Sandbox, norm: Norm) -> [EntryKey; 7] {
    let mut keys = [EntryKey {
        bucket: 0,
        field: 0,
    }; 7];
    for (slot, (dim, raw)) in keys.iter_mut().zip(SUBJECT.iter()) {
        *slot = key_of(layout, list, sandbox, dim, black_box(raw), norm);
    }
    keys
}

/// Keyed BLAKE3 in place of SipHash: the same split of its first 128 bits.
fn blake3_key(key: &[u8; 32], canonical: &[u8]) -> EntryKey {
    let h = blake3::keyed_hash(key, canonical);
    let b = h.as_bytes();
    let lo = u64::from_le_bytes(b[..8].try_into().expect("8 bytes"));
    let hi = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
    EntryKey {
        bucket: (hi % u64::from(BUCKETS)) as u32,
        field: lo as i64,
    }
}

fn normalise(c: &mut Criterion) {
    let keyed = Layout::new("nl:", BUCKETS, common::keyed());
    let unkeyed = Layout::new("nl:", BUCKETS, Hashing::Unkeyed);
    let list: ListName = "black".parse().expect("list name");
    let sandbox: Sandbox = "loan".parse().expect("sandbox");
    let blake_key = [0x5a_u8; 32];

    let v2 = Norm::LATEST;
    c.bench_function("normalise/subject_7_dimensions", |b| {
        b.iter(|| black_box(subject(&keyed, &list, &sandbox, v2)))
    });
    c.bench_function("normalise/rules1/subject_7_dimensions", |b| {
        b.iter(|| black_box(subject(&keyed, &list, &sandbox, Norm::V1)))
    });
    c.bench_function("normalise/subject_7_dimensions_unkeyed", |b| {
        b.iter(|| black_box(subject(&unkeyed, &list, &sandbox, v2)))
    });
    c.bench_function("normalise/subject_7_dimensions_blake3", |b| {
        let mut buf = Vec::with_capacity(128);
        b.iter(|| {
            let mut keys = [EntryKey {
                bucket: 0,
                field: 0,
            }; 7];
            for (slot, (dim, raw)) in keys.iter_mut().zip(SUBJECT.iter()) {
                let value = Value::parse_check(dim, black_box(raw)).expect("valid subject value");
                write_canonical(&mut buf, &list, dim, &sandbox, &value);
                *slot = blake3_key(&blake_key, &buf);
            }
            black_box(keys)
        })
    });

    // The hash functions alone, over the subject's canonical bytes.
    let canon: Vec<Vec<u8>> = SUBJECT
        .iter()
        .map(|(dim, raw)| {
            let value = Value::parse_check(dim, raw).expect("valid subject value");
            canonical(&list, dim, &sandbox, &value)
        })
        .collect();
    let mut group = c.benchmark_group("fingerprint");
    for (name, layout) in [("siphash24_128", &keyed), ("xxh3_crc32", &unkeyed)] {
        group.bench_function(name, |b| {
            b.iter(|| {
                for bytes in &canon {
                    black_box(layout.key_of(black_box(bytes)));
                }
            })
        });
    }
    group.bench_function("blake3_keyed", |b| {
        b.iter(|| {
            for bytes in &canon {
                black_box(blake3_key(&blake_key, black_box(bytes)));
            }
        })
    });
    group.finish();

    let mut group = c.benchmark_group("normalise/dimension");
    let phones = [
        ("phone_national", "13800000000"),
        ("phone_not_valid", "12345678"),
    ];
    let cases = SUBJECT
        .iter()
        .map(|(d, raw)| (d.as_str().to_owned(), d.clone(), *raw))
        .chain(
            phones
                .iter()
                .map(|(name, raw)| (name.to_string(), Dimension::Phone, *raw)),
        );
    for (name, dim, raw) in cases {
        group.bench_function(&name, |b| {
            b.iter(|| black_box(key_of(&keyed, &list, &sandbox, &dim, black_box(raw), v2)))
        });
    }
    // A phone never seen before (a new number each time: past the memory of recent phones),
    // the cost a new identity pays; the cases above repeat one value, so they measure a
    // phone seen again. `phone_never_seen`: mobile numbers of every CN prefix 130–199 (the
    // engine's traffic; the fast path, `domain::phone`); `phone_never_seen_fixed_line`:
    // Shenzhen fixed lines written with the national prefix (`0755…`, which the fast path
    // leaves to the phone crate: what such numbers, or a client sending them, cost).
    let mut never_seen = |name: &str, number: fn(u64) -> String| {
        group.bench_function(name, |b| {
            let mut n = 0u64;
            b.iter(|| {
                n = n
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                let raw = number(n >> 20);
                black_box(key_of(
                    &keyed,
                    &list,
                    &sandbox,
                    &Dimension::Phone,
                    black_box(&raw),
                    v2,
                ))
            })
        });
    };
    never_seen("phone_never_seen", |r| {
        format!("1{}{:08}", 30 + r % 70, (r / 70) % 100_000_000)
    });
    never_seen("phone_never_seen_fixed_line", |r| {
        format!("0755{:08}", r % 100_000_000)
    });
    // `140…`: a prefix no CN number has (like a quarter of `gen`'s phones): decided "not
    // valid" by the fast path, without the crate.
    never_seen("phone_never_seen_not_valid", |r| {
        format!("140{:08}", r % 100_000_000)
    });
    group.finish();
    let mut group = c.benchmark_group("normalise/rules1");
    for (dim, raw) in SUBJECT.iter() {
        group.bench_function(dim.as_str(), |b| {
            b.iter(|| {
                black_box(key_of(
                    &keyed,
                    &list,
                    &sandbox,
                    dim,
                    black_box(raw),
                    Norm::V1,
                ))
            })
        });
    }
    group.finish();
}

criterion_group!(benches, normalise);
criterion_main!(benches);
