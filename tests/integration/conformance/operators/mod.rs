//! What operators read (issues 13 and 24), on every backend: the lists' approximate counts
//! (`EntryStore::count_changes`, `list_counts`, kept by `NameLists`), paged with every filter
//! and gone at zero; one identity looked up on every list of a sandbox (its lists only, at
//! most 1,000); and the audit trail paged and filtered (`EntryStore::audit_read` merged by
//! `AuditTrail`): searched through its index by value, who and list, it answers exactly what
//! a scan of the whole trail filtered by hand does (generated histories and searches, across
//! the trim of a small cap), its index holds exactly the records kept, and a cursor with
//! nothing older is an empty last page.
//!
//! The cases live by theme in `counts`, `lookup`, `audit` and `audit_index`; this module holds
//! the helpers they share and runs every case on every backend (`conformance!` below, so the
//! tests are named `conformance::operators::<backend>::<case>`).

mod audit;
mod audit_index;
mod counts;
mod lookup;

use namelist::audit_trail::{AuditEntry, AuditQuery, AuditTrail, RawAuditQuery};
use namelist::domain::{Dimension, Expiry, ListName, Value};
use namelist::lists::{EntryRef, NewEntry};
use namelist::store::CountChange;
use namelist::store::Scope;

use crate::conformance::Harness;

use audit::{
    audit_cursors_with_nothing_older_end_the_trail, audit_matches_a_value_by_fingerprint,
    audit_pages_cover_the_trail_once, audit_pages_read_ahead_past_the_first_chunk,
};
use audit_index::audit_index_finds_what_a_scan_finds;
use counts::{
    a_count_at_zero_disappears, counts_page_through_every_filter_once_in_order,
    list_counts_follow_writes_and_deletes,
};
use lookup::{lookup_everywhere_finds_every_list, lookup_everywhere_reads_only_the_sandbox_lists};

fn list(s: &str) -> ListName {
    s.parse().unwrap()
}

fn new(dim: &str, value: &str, sb: &str, expiry: Expiry) -> NewEntry {
    let dimension: Dimension = dim.parse().unwrap();
    NewEntry {
        value: Value::parse_entry(&dimension, value).unwrap(),
        dimension,
        sandbox: sb.parse().unwrap(),
        expiry,
        reason: None,
    }
}

fn entry_ref(dim: &str, value: &str, sb: &str) -> EntryRef {
    let dimension: Dimension = dim.parse().unwrap();
    EntryRef {
        value: Value::parse_entry(&dimension, value).unwrap(),
        dimension,
        sandbox: sb.parse().unwrap(),
    }
}

/// Adds `delta` to each (list, sandbox) count at `at_ms`, straight through the store.
async fn change(h: &Harness, changes: &[(&str, &str, i64)], at_ms: i64) {
    let changes: Vec<CountChange> = changes
        .iter()
        .map(|(l, s, delta)| CountChange {
            scope: Scope::new(&list(l), &s.parse().unwrap()),
            delta: *delta,
        })
        .collect();
    h.store
        .count_changes(&changes, at_ms, crate::conformance::deadline())
        .await
        .unwrap();
}

fn raw(pairs: &[(&str, &str)]) -> RawAuditQuery {
    let mut q = RawAuditQuery::default();
    for (k, v) in pairs {
        let v = Some((*v).to_owned());
        match *k {
            "list" => q.list = v,
            "sandbox" => q.sandbox = v,
            "dimension" => q.dimension = v,
            "value" => q.value = v,
            "who" => q.who = v,
            "op" => q.op = v,
            "since" => q.since = v,
            "until" => q.until = v,
            "limit" => q.limit = v,
            "cursor" => q.cursor = v,
            other => panic!("{other}"),
        }
    }
    q
}

async fn read_all(trail: &AuditTrail, pairs: &[(&str, &str)]) -> Vec<AuditEntry> {
    let mut out = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1000 {
        let mut p: Vec<(&str, &str)> = pairs.to_vec();
        if let Some(c) = &cursor {
            p.push(("cursor", c.as_str()));
        }
        let page = trail
            .page(&AuditQuery::try_from(raw(&p)).unwrap())
            .await
            .unwrap();
        out.extend(page.records);
        match page.next_cursor {
            Some(c) => cursor = Some(c),
            None => return out,
        }
    }
    panic!("the cursor never ended");
}

conformance!(
    list_counts_follow_writes_and_deletes,
    counts_page_through_every_filter_once_in_order,
    a_count_at_zero_disappears,
    lookup_everywhere_finds_every_list,
    lookup_everywhere_reads_only_the_sandbox_lists,
    audit_pages_cover_the_trail_once,
    audit_pages_read_ahead_past_the_first_chunk,
    audit_matches_a_value_by_fingerprint,
    audit_cursors_with_nothing_older_end_the_trail,
    audit_index_finds_what_a_scan_finds,
);
