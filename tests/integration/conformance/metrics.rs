//! `MetricStore`, directly: what a backend must do with `MetricOp`s. Each family aggregates
//! exactly the sub-windows `[read_hi - slots + 1, read_hi]`; the updates carrying an event
//! are applied once, within a request too, while it is remembered; COUNT_DISTINCT keeps its newest members up to
//! the cap and says when it is at it. (The velocity service over these, against an oracle of
//! random event streams, is `tests/integration/velocity/oracle.rs`.)

use namelist::domain::now_ms;
use namelist::store::{EventMark, MetricAnswer, MetricFamily, MetricOp, MetricReading};

use crate::conformance::{Harness, deadline};

/// One-minute sub-windows, five to a window.
const RESOLUTION_MS: i64 = 60_000;
const SLOTS: i64 = 5;

/// The present sub-window.
fn present() -> i64 {
    now_ms() / RESOLUTION_MS
}

fn op(family: MetricFamily, key: &str) -> MetricOp {
    let now = present();
    MetricOp {
        family,
        key: key.to_owned(),
        slots: SLOTS,
        resolution_ms: RESOLUTION_MS,
        update: None,
        read_hi: now,
        trim_hi: now,
        cap: 10_000,
        event: None,
        read: false,
    }
}

fn update(family: MetricFamily, key: &str, sub: i64, value: i64) -> MetricOp {
    MetricOp {
        update: Some((sub, value)),
        ..op(family, key)
    }
}

fn read(family: MetricFamily, key: &str, read_hi: i64) -> MetricOp {
    MetricOp {
        read_hi,
        read: true,
        ..op(family, key)
    }
}

async fn run(h: &Harness, ops: &[MetricOp]) -> Vec<MetricAnswer> {
    let answers = h.store.metric_ops(ops, deadline()).await.unwrap();
    assert_eq!(answers.len(), ops.len(), "one answer per op");
    answers
}

async fn reading(h: &Harness, op: MetricOp) -> MetricReading {
    run(h, &[op]).await[0].reading.expect("a read op reads")
}

async fn each_family_aggregates_its_window(h: &Harness) {
    use MetricFamily::*;
    let layout = h.store.layout();
    let now = present();
    let key = |family: &str| layout.metric_key(family, 1, &["entity"]);
    let members = [layout.distinct_member("m1"), layout.distinct_member("m2")];
    // Values 5, 7 and 11 four, one and zero sub-windows ago; members m1, m2, m1 again.
    let mut ops = Vec::new();
    for family in [Sum, Avg, Min, Max] {
        let k = key(&format!("{family:?}"));
        for (sub, value) in [(now - 4, 5), (now - 1, 7), (now, 11)] {
            ops.push(update(family, &k, sub, value));
        }
    }
    for family in [Distinct, Approx] {
        let k = key(&format!("{family:?}"));
        for (sub, member) in [
            (now - 4, members[0]),
            (now - 1, members[1]),
            (now, members[0]),
        ] {
            ops.push(update(family, &k, sub, member));
        }
    }
    let answers = run(h, &ops).await;
    assert!(
        answers.iter().all(|a| !a.duplicate && a.reading.is_none()),
        "updates without an event, read nothing: {answers:?}"
    );

    // The whole window; its last three sub-windows and two empty ones to come; none of it.
    let cases: [(i64, [MetricReading; 6]); 3] = [
        (
            now,
            [
                MetricReading::Sum(23),
                MetricReading::Avg { sum: 23, count: 3 },
                MetricReading::Extreme(Some(5)),
                MetricReading::Extreme(Some(11)),
                MetricReading::Distinct {
                    count: 2,
                    capped: false,
                },
                MetricReading::Distinct {
                    count: 2,
                    capped: false,
                },
            ],
        ),
        (
            now + 3,
            [
                MetricReading::Sum(18),
                MetricReading::Avg { sum: 18, count: 2 },
                MetricReading::Extreme(Some(7)),
                MetricReading::Extreme(Some(11)),
                // m1 was seen last in the present sub-window, m2 one ago.
                MetricReading::Distinct {
                    count: 2,
                    capped: false,
                },
                MetricReading::Distinct {
                    count: 2,
                    capped: false,
                },
            ],
        ),
        (
            now + SLOTS,
            [
                MetricReading::Sum(0),
                MetricReading::Avg { sum: 0, count: 0 },
                MetricReading::Extreme(None),
                MetricReading::Extreme(None),
                MetricReading::Distinct {
                    count: 0,
                    capped: false,
                },
                MetricReading::Distinct {
                    count: 0,
                    capped: false,
                },
            ],
        ),
    ];
    for (read_hi, expected) in cases {
        for (family, want) in [Sum, Avg, Min, Max, Distinct, Approx]
            .into_iter()
            .zip(expected)
        {
            let got = reading(h, read(family, &key(&format!("{family:?}")), read_hi)).await;
            assert_eq!(
                got,
                want,
                "{family:?} read at {} sub-windows on",
                read_hi - now
            );
        }
    }
    // Only m1 was seen in the present sub-window (m2 one before it).
    for family in [Distinct, Approx] {
        let got = reading(
            h,
            read(family, &key(&format!("{family:?}")), now + SLOTS - 1),
        )
        .await;
        assert_eq!(
            got,
            MetricReading::Distinct {
                count: 1,
                capped: false
            },
            "{family:?}"
        );
    }
}

async fn an_event_is_applied_once(h: &Harness) {
    let layout = h.store.layout();
    let now = present();
    // Two metrics of one entity (one slot, on a cluster too), and one without events.
    let (a, b, plain) = (
        layout.metric_key("count", 1, &["e"]),
        layout.metric_key("sum", 1, &["e"]),
        layout.metric_key("count", 1, &["plain"]),
    );
    let mark = |id: &str, seq: u32, keep_ms: i64| EventMark {
        hash: layout.event_hash("tx", id),
        keep_until_ms: now_ms() + keep_ms,
        seq,
    };
    let with = |key: &str, mark: EventMark| MetricOp {
        event: Some(mark),
        ..update(MetricFamily::Sum, key, now, 1)
    };
    let dup = |answers: Vec<MetricAnswer>| -> Vec<bool> {
        answers.into_iter().map(|a| a.duplicate).collect()
    };
    let e1 = mark("e1", 0, 60_000);
    assert_eq!(
        dup(run(h, &[with(&a, e1), with(&b, e1)]).await),
        [false, false]
    );
    assert_eq!(
        dup(run(h, &[with(&a, e1), with(&b, e1)]).await),
        [true, true],
        "a replay"
    );
    assert_eq!(
        dup(run(h, &[with(&b, mark("e1", 3, 60_000))]).await),
        [true],
        "a replay at another place in its request, updating fewer metrics"
    );
    let (first, again) = (mark("e2", 0, 60_000), mark("e2", 1, 60_000));
    assert_eq!(
        dup(run(
            h,
            &[
                with(&a, first),
                with(&b, first),
                with(&a, again),
                with(&b, again)
            ]
        )
        .await),
        [false, false, true, true],
        "twice in one request: the second is the replay"
    );
    let twice = update(MetricFamily::Sum, &plain, now, 1);
    assert_eq!(
        dup(run(h, &[twice.clone(), twice]).await),
        [false, false],
        "no event, no memory of it"
    );
    // Remembered until a time already past: never remembered.
    let gone = mark("e3", 0, -1_000);
    for _ in 0..2 {
        assert_eq!(dup(run(h, &[with(&a, gone)]).await), [false], "forgotten");
    }
    for (key, count) in [(&a, 4), (&b, 2), (&plain, 2)] {
        assert_eq!(
            reading(h, read(MetricFamily::Sum, key, now)).await,
            MetricReading::Sum(count),
            "{key}"
        );
    }
    let replay = MetricOp {
        read: true,
        ..with(&a, e1)
    };
    let answer = run(h, &[replay]).await[0];
    assert_eq!(
        answer,
        MetricAnswer {
            duplicate: true,
            reading: Some(MetricReading::Sum(4))
        },
        "a replayed update still reads"
    );
}

async fn the_distinct_cap_keeps_the_newest(h: &Harness) {
    let layout = h.store.layout();
    let now = present();
    let key = layout.metric_key("capped", 1, &["entity"]);
    let ops: Vec<MetricOp> = (0..5)
        .map(|i| MetricOp {
            cap: 3,
            ..update(
                MetricFamily::Distinct,
                &key,
                now - 4 + i,
                layout.distinct_member(&format!("member-{i}")),
            )
        })
        .collect();
    run(h, &ops).await;
    let read_at = |read_hi: i64| MetricOp {
        cap: 3,
        ..read(MetricFamily::Distinct, &key, read_hi)
    };
    assert_eq!(
        reading(h, read_at(now)).await,
        MetricReading::Distinct {
            count: 3,
            capped: true
        },
        "3 kept of 5, and said so"
    );
    assert_eq!(
        reading(h, read_at(now + 2)).await,
        MetricReading::Distinct {
            count: 3,
            capped: true
        },
        "the newest three (2, 1 and 0 sub-windows ago) were kept"
    );
    assert_eq!(
        reading(h, read_at(now + 3)).await,
        MetricReading::Distinct {
            count: 2,
            capped: true
        }
    );
}

conformance!(
    each_family_aggregates_its_window,
    an_event_is_applied_once,
    the_distinct_cap_keeps_the_newest,
);
