//! Issue 14 through the operator tools: `gen` writes phone segments, addresses and domain
//! entries; `import` loads them (registering their lengths); the running service lists every
//! one of them (a segment through a phone inside it, a domain through an address below it)
//! and none of `gen`'s non-members; `audit` counts them as entries like any other.

// The service crate's test helpers, shared by path.
use crate::common;
use crate::shared::{Probe, check_all, generate, tools};

use std::path::Path;

use common::{RedisServer, redis_settings, spawn_app};
use namelist::domain::{Dimension, Value};
use serde_json::Value as Json;

/// Every row of a gen file, with a value inside each segment or domain to check it by.
fn probes(path: &Path) -> Vec<Probe> {
    let mut r = csv::Reader::from_path(path).unwrap();
    r.records()
        .map(|rec| {
            let rec = rec.unwrap();
            let d: Dimension = rec[1].parse().unwrap();
            let value = Value::parse_entry(&d, &rec[2]).unwrap();
            let check = match &value {
                // A phone of the segment's length plus enough digits to be 11 (after +86).
                Value::PhoneSegment(s) => {
                    let digits = s.strip_prefix("+86").unwrap_or(s).len();
                    format!("{s}{}", "7".repeat(11 - digits))
                }
                Value::EmailDomain(domain) => format!("someone@deep.{domain}"),
                _ => rec[2].to_owned(),
            };
            let sandbox = if rec[3].is_empty() {
                "default"
            } else {
                &rec[3]
            };
            Probe {
                list: rec[0].to_owned(),
                sandbox: sandbox.to_owned(),
                dimension: rec[1].to_owned(),
                check,
                shown: value.to_string(),
            }
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gen_import_check_audit_with_segments_addresses_and_domains() {
    let redis = RedisServer::start_with(&["--sanitize-dump-payload", "yes"]);
    let settings = redis_settings(&redis);
    let prefix = settings.key_prefix.clone();
    let dir = tempfile::tempdir().unwrap();
    let (members, non_members) = (dir.path().join("m.csv"), dir.path().join("n.csv"));
    let said = generate(
        &[
            "--rows",
            "20000",
            "--non-member-rows",
            "20000",
            "--mix",
            "phone=3,email=3,uid=1",
            "--segment-share",
            "0.2",
            "--domain-share",
            "0.2",
        ],
        &members,
        &non_members,
    );
    assert!(
        said.contains("phone segments") && said.contains("email domains"),
        "{said}"
    );

    let summary: Json = serde_json::from_str(&tools(
        &redis,
        &prefix,
        &[
            "--expected-entries",
            "20000",
            "import",
            members.to_str().unwrap(),
            "--quiet",
            "--json",
        ],
    ))
    .unwrap();
    assert_eq!(summary["rows_rejected"], 0, "{summary}");
    assert_eq!(summary["entries_written"], 20_000, "{summary}");

    // The import registered the lengths in use, beside the entries.
    let mut conn = redis.conn();
    let members_of: Vec<String> = redis::cmd("SMEMBERS")
        .arg(format!("{prefix}p:black:loan"))
        .query(&mut conn)
        .unwrap();
    assert!(
        members_of.iter().any(|m| m.starts_with("phone/"))
            && members_of.iter().any(|m| m.starts_with("email/")),
        "{members_of:?}"
    );

    let app = spawn_app(settings).await;
    let rows = probes(&members);
    let segments = rows.iter().filter(|r| r.shown.ends_with('*')).count();
    let domains = rows.iter().filter(|r| r.shown.starts_with('@')).count();
    assert!(
        segments > 1_000 && domains > 1_000,
        "{segments} segments, {domains} domains"
    );
    let (missing, _) = check_all(&app, &rows).await;
    assert!(
        missing.is_empty(),
        "{} false negatives, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(5)]
    );
    let outsiders = probes(&non_members);
    let (_, hits) = check_all(&app, &outsiders).await;
    assert!(
        hits.is_empty(),
        "{} false positives, e.g. {:?}",
        hits.len(),
        hits.first()
    );

    // Segments and domains are entries like any other to the audit.
    let audit: Json = serde_json::from_str(&tools(
        &redis,
        &prefix,
        &["audit", "--json", "--compare-sample", "0"],
    ))
    .unwrap();
    assert_eq!(audit["entries"], 20_000, "{audit}");
    assert_eq!(audit["hashtable_buckets"].as_array().map_or(0, Vec::len), 0);
}
