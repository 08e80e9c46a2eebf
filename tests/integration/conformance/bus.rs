//! `InvalidationBus`: every subscriber hears every message published while it is subscribed;
//! entry writes and deletes publish their changes (with the new codes) themselves, lazy
//! expiry publishes nothing.

use namelist::domain::{Dimension, ListName, Sandbox, Value};
use namelist::store::Scope;
use namelist::store::{EntryKey, Invalidation, PrefixLen, RemoveBatch, WriteBatch};

use crate::conformance::{Harness, deadline, next_message};

/// What a message says, without `atomic` (whether it went out in one step with its write is
/// the backend's business: one Redis node yes, a cluster or the embedded store no).
fn changes(message: Invalidation) -> Vec<(EntryKey, Option<u32>)> {
    match message {
        Invalidation::Changes { changes, .. } => changes,
        other => panic!("expected changes, got {other:?}"),
    }
}

async fn every_subscriber_hears_every_message(h: &Harness) {
    let mut a = h.store.subscribe().await.unwrap();
    let mut b = h.store.subscribe().await.unwrap();
    let sent = [
        Invalidation::Bulk,
        Invalidation::Scopes(vec![("black".into(), "loan".into())]),
        Invalidation::Definitions,
    ];
    for m in &sent {
        h.store.publish(m).await.unwrap();
    }
    for stream in [&mut a, &mut b] {
        let mut heard = Vec::new();
        for _ in 0..sent.len() {
            heard.push(next_message(stream).await);
        }
        // One publisher, in order on one node; a cluster may deliver through another node.
        for m in &sent {
            assert!(heard.contains(m), "{m:?} not heard: {heard:?}");
        }
    }
}

async fn writes_and_deletes_publish_their_changes(h: &Harness) {
    let layout = h.store.layout();
    let (black, loan) = (
        "black".parse::<ListName>().unwrap(),
        "loan".parse::<Sandbox>().unwrap(),
    );
    let key = |v: &str| layout.entry_key(&black, &Dimension::Device, &loan, &Value::Text(v.into()));
    let (k1, k2) = (key("bus-1"), key("bus-2"));
    let mut stream = h.store.subscribe().await.unwrap();

    // Codes: 0 never expires; 2e9 is seconds after 2020, live for decades.
    let (never, later) = (0, 2_000_000_000);
    let range = PrefixLen {
        kind: namelist::store::PrefixKind::V4,
        len: 24,
    };
    h.store
        .write(
            WriteBatch {
                entries: vec![(k1, never), (k2, later)],
                prefixes: vec![(Scope::new(&black, &loan), range)],
                ..WriteBatch::default()
            },
            deadline(),
        )
        .await
        .unwrap();
    assert_eq!(
        next_message(&mut stream).await,
        Invalidation::Scopes(vec![("black".into(), "loan".into())]),
        "a new prefix length is announced first"
    );
    assert_eq!(
        changes(next_message(&mut stream).await),
        vec![(k1, Some(never)), (k2, Some(later))],
        "the upsert's new codes, in the order written"
    );

    let removed = h
        .store
        .remove(
            RemoveBatch {
                keys: &[k1],
                now_ms: namelist::domain::now_ms(),
                audit: Vec::new(),
            },
            deadline(),
        )
        .await
        .unwrap();
    assert_eq!(removed, vec![namelist::store::Removed::Live]);
    assert_eq!(changes(next_message(&mut stream).await), vec![(k1, None)]);

    // Lazy expiry is housekeeping: the field was already answered as absent. A marker
    // published after it must be the next message.
    assert!(
        h.store
            .remove_if_unchanged(k2, later, deadline())
            .await
            .unwrap()
    );
    h.store.publish(&Invalidation::Bulk).await.unwrap();
    assert_eq!(next_message(&mut stream).await, Invalidation::Bulk);
}

conformance!(
    every_subscriber_hears_every_message,
    writes_and_deletes_publish_their_changes,
);
