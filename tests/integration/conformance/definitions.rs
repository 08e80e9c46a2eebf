//! `DefinitionStore`: versions kept while a definition is unchanged, bumped when it changes,
//! never reused after a delete; metrics and rules apart; one read as the list reads it; every
//! change published, naming its definition.

use std::collections::BTreeMap;

use namelist::store::{DefinitionKind, Invalidation, NewDefinition};

use crate::conformance::{Harness, deadline, next_message};

/// A definition of `kind` to store.
fn definition<'a>(
    kind: DefinitionKind,
    id: &'a str,
    fingerprint: &'a str,
    body: &'a str,
) -> NewDefinition<'a> {
    NewDefinition {
        kind,
        id,
        fingerprint,
        body,
    }
}

/// Live definitions of a kind: id → (version, body).
async fn live(h: &Harness, kind: DefinitionKind) -> BTreeMap<String, (u64, String)> {
    h.store
        .definitions(kind)
        .await
        .unwrap()
        .into_iter()
        .map(|d| (d.id, (d.version, d.body)))
        .collect()
}

async fn versions_are_kept_bumped_and_never_reused(h: &Harness) {
    let metric = DefinitionKind::Metric;
    let put = |fingerprint: &'static str, body: &'static str| async move {
        h.store
            .put_definition(definition(metric, "m", fingerprint, body), deadline())
            .await
            .unwrap()
    };
    assert_eq!(put("a", "A").await, 1, "a new id starts at 1");
    assert_eq!(
        put("a", "A again").await,
        1,
        "same fingerprint, same version"
    );
    assert_eq!(
        live(h, metric).await["m"],
        (1, "A again".to_owned()),
        "the body is the latest"
    );
    assert_eq!(put("b", "B").await, 2, "a changed definition is bumped");
    assert!(
        h.store
            .delete_definition(metric, "m", deadline())
            .await
            .unwrap(),
        "it existed"
    );
    assert!(
        !h.store
            .delete_definition(metric, "m", deadline())
            .await
            .unwrap(),
        "deleted already"
    );
    assert!(
        !live(h, metric).await.contains_key("m"),
        "gone from the list"
    );
    assert_eq!(
        put("a", "A").await,
        3,
        "after a delete, even the first fingerprint gets a new version"
    );
    assert!(
        !h.store
            .delete_definition(metric, "never-defined", deadline())
            .await
            .unwrap()
    );
}

async fn metrics_and_rules_are_apart(h: &Harness) {
    let (metric, rule) = (DefinitionKind::Metric, DefinitionKind::Rule);
    for (kind, id, body) in [
        (metric, "x", "X"),
        (metric, "y", "Y"),
        (rule, "x", "rule X"),
    ] {
        let version = h
            .store
            .put_definition(definition(kind, id, body, body), deadline())
            .await
            .unwrap();
        assert_eq!(version, 1, "{kind:?} {id}: versions are per kind");
    }
    let metrics = live(h, metric).await;
    assert_eq!(
        metrics,
        BTreeMap::from([
            ("x".to_owned(), (1, "X".to_owned())),
            ("y".to_owned(), (1, "Y".to_owned())),
        ])
    );
    assert_eq!(
        live(h, rule).await,
        BTreeMap::from([("x".to_owned(), (1, "rule X".to_owned()))])
    );
    assert!(
        h.store
            .delete_definition(rule, "x", deadline())
            .await
            .unwrap()
    );
    assert_eq!(
        live(h, metric).await,
        metrics,
        "deleting a rule leaves the metric"
    );
}

async fn every_change_is_published(h: &Harness) {
    let mut stream = h.store.subscribe().await.unwrap();
    let kind = DefinitionKind::Metric;
    let named = Invalidation::definition(kind, "p");
    h.store
        .put_definition(definition(kind, "p", "a", "A"), deadline())
        .await
        .unwrap();
    assert_eq!(next_message(&mut stream).await, named);
    h.store
        .put_definition(definition(kind, "p", "b", "B"), deadline())
        .await
        .unwrap();
    assert_eq!(next_message(&mut stream).await, named);
    h.store
        .delete_definition(DefinitionKind::Rule, "p", deadline())
        .await
        .unwrap();
    h.store
        .delete_definition(kind, "p", deadline())
        .await
        .unwrap();
    assert_eq!(
        next_message(&mut stream).await,
        named,
        "a delete of nothing is no change"
    );
}

async fn one_definition_reads_as_the_list_does(h: &Harness) {
    let (metric, rule) = (DefinitionKind::Metric, DefinitionKind::Rule);
    let one = |kind, id: &'static str| async move {
        h.store
            .definition(kind, id)
            .await
            .unwrap()
            .map(|d| (d.id, d.version, d.body))
    };
    assert_eq!(one(metric, "o").await, None, "never defined");
    for body in ["A", "B"] {
        h.store
            .put_definition(definition(metric, "o", body, body), deadline())
            .await
            .unwrap();
    }
    assert_eq!(one(metric, "o").await, Some(("o".into(), 2, "B".into())));
    assert_eq!(one(rule, "o").await, None, "kinds apart");
    assert!(
        h.store
            .delete_definition(metric, "o", deadline())
            .await
            .unwrap()
    );
    assert_eq!(one(metric, "o").await, None, "deleted");
}

conformance!(
    versions_are_kept_bumped_and_never_reused,
    metrics_and_rules_are_apart,
    every_change_is_published,
    one_definition_reads_as_the_list_does,
);
