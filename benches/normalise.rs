//! Normalise + fingerprint + bucket: the CPU work a check does per subject value before it
//! touches the cache or the store. `Value::parse_check` then `Layout::entry_key` for each of
//! the seven built-in dimensions, on a 1,000,000-entry layout (5,000 buckets).
//!
//! `cargo bench --bench normalise`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use namelist::domain::{Dimension, ListName, Sandbox, Value};
use namelist::store::{EntryKey, Layout};

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

fn key_of(
    layout: &Layout,
    list: &ListName,
    sandbox: &Sandbox,
    dim: &Dimension,
    raw: &str,
) -> EntryKey {
    let value = Value::parse_check(dim, raw).expect("valid subject value");
    layout.entry_key(list, dim, sandbox, &value)
}

fn normalise(c: &mut Criterion) {
    let layout = Layout::new("nl:", 5000);
    let list: ListName = "black".parse().expect("list name");
    let sandbox: Sandbox = "loan".parse().expect("sandbox");

    c.bench_function("normalise/subject_7_dimensions", |b| {
        b.iter(|| {
            let mut keys = [EntryKey {
                bucket: 0,
                field: 0,
            }; 7];
            for (slot, (dim, raw)) in keys.iter_mut().zip(SUBJECT.iter()) {
                *slot = key_of(&layout, &list, &sandbox, dim, black_box(raw));
            }
            black_box(keys)
        })
    });

    let mut group = c.benchmark_group("normalise/dimension");
    for (dim, raw) in SUBJECT.iter() {
        group.bench_function(dim.as_str(), |b| {
            b.iter(|| black_box(key_of(&layout, &list, &sandbox, dim, black_box(raw))))
        });
    }
    group.finish();
}

criterion_group!(benches, normalise);
criterion_main!(benches);
