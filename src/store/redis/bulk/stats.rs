//! The bucket audit's reads (`namelist-tools audit`): the keys shaped like bucket keys on
//! each node, what a node says of itself (`INFO`, its listpack limit), and each bucket's
//! size, encoding, fill and expiry counts, probed in one round trip per batch (the
//! expiry-count script, `scripts::COUNT_EXPIRED_LUA`, reloaded after a `NOSCRIPT`).

use std::collections::BTreeMap;

use redis::{RedisResult, Value};

use super::{BulkError, glob_escape, redis_err};
use crate::domain::now_ms;
use crate::store::StoreBase;
use crate::store::expiry::ExpiryCode;
use crate::store::redis::RedisStore;
use crate::store::redis::conn::{Keyed, ScanTarget};
use crate::store::redis::scripts::{self, COUNT_EXPIRED_LUA, COUNT_EXPIRED_SCRIPT};

/// What the audit learns of one bucket key in one round trip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BucketProbe {
    Stats(BucketStats),
    /// Deleted (or emptied) between the `SCAN` and the probe.
    Vanished,
    /// Not a hash (the server's error): not ours.
    NotHash(String),
}

/// One bucket's size, encoding and expiry counts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketStats {
    /// `MEMORY USAGE … SAMPLES 0`: exact.
    pub bytes: u64,
    /// `listpack` or `hashtable` (`?` if the server did not say).
    pub encoding: String,
    pub fields: u64,
    /// Entries expired as of the probe.
    pub expired: u64,
    /// Entries that never expire.
    pub never: u64,
    /// Values that are not integers (not what the layout writes).
    pub unreadable: u64,
}

/// The four probe commands of one bucket key (`MEMORY USAGE`, `OBJECT ENCODING`, `HLEN` and
/// the expiry count); the script call last.
fn probe_cmds(key: &str, now: i64) -> [Keyed; 4] {
    let keyed = |build: &dyn Fn(&mut redis::Cmd)| {
        let mut cmd = redis::Cmd::new();
        build(&mut cmd);
        (key.as_bytes().to_vec(), cmd)
    };
    [
        keyed(&|c| {
            c.arg("MEMORY").arg("USAGE").arg(key).arg("SAMPLES").arg(0);
        }),
        keyed(&|c| {
            c.arg("OBJECT").arg("ENCODING").arg(key);
        }),
        keyed(&|c| {
            c.arg("HLEN").arg(key);
        }),
        count_expired(key, now),
    ]
}

/// The expiry-count script's call for `key` as of `now` (`ExpiryCode::script_now`).
fn count_expired(key: &str, now: i64) -> Keyed {
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(COUNT_EXPIRED_SCRIPT.get_hash())
        .arg(1)
        .arg(key)
        .arg(now);
    (key.as_bytes().to_vec(), cmd)
}

fn int(v: &Value) -> Option<u64> {
    redis::from_redis_value_ref::<u64>(v).ok()
}

impl RedisStore {
    /// The `SCAN MATCH` pattern of bucket keys, the prefix's glob characters escaped.
    pub fn bucket_scan_pattern(&self) -> String {
        format!("{}b:*", glob_escape(self.layout().prefix()))
    }

    /// One `SCAN` step for keys shaped like bucket keys on `target`, raw (the audit reports
    /// the ones that are not buckets of this keyspace; `Layout::bucket_number` tells them).
    pub async fn scan_bucket_keys(
        &self,
        target: &ScanTarget,
        cursor: u64,
        count: u32,
    ) -> RedisResult<(u64, Vec<Vec<u8>>)> {
        self.connection()
            .scan(target, cursor, &self.bucket_scan_pattern(), count)
            .await
    }

    /// `INFO <section>` of one node as (name, value) pairs; empty if refused.
    pub async fn node_info(&self, target: &ScanTarget, section: &str) -> BTreeMap<String, String> {
        let text: String = match self
            .connection()
            .on_target(target, redis::cmd("INFO").arg(section))
            .await
        {
            Ok(t) => t,
            Err(_) => return BTreeMap::new(),
        };
        text.lines()
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
            .collect()
    }

    /// One node's `hash-max-listpack-entries` (or the pre-7 `hash-max-ziplist-entries`):
    /// the fill past which a bucket stops being a listpack; `None` if refused.
    pub async fn listpack_limit(&self, target: &ScanTarget) -> Option<u64> {
        let conn = self.connection();
        for name in ["hash-max-listpack-entries", "hash-max-ziplist-entries"] {
            let reply: RedisResult<Vec<String>> = conn
                .on_target(target, redis::cmd("CONFIG").arg("GET").arg(name))
                .await;
            if let Some(limit) = reply
                .ok()
                .and_then(|v| v.get(1).and_then(|s| s.parse().ok()))
            {
                return Some(limit);
            }
        }
        None
    }

    /// Loads the expiry-count script on the node, or on every primary of a cluster (the nodes
    /// its calls go to), one by one.
    pub async fn load_count_expired(&self) -> RedisResult<()> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(COUNT_EXPIRED_LUA.as_str());
        self.connection()
            .on_every_primary::<String>(&load)
            .await
            .map(drop)
    }

    /// Probes bucket keys in one round trip (one pipeline on a node, per-slot pipelines on a
    /// cluster): size, encoding, fill and expiry counts as of now; one answer per key, in
    /// order. Read-only. After a `NOSCRIPT` (a restarted node, a failover, a `SCRIPT FLUSH`)
    /// the script is loaded again and only the calls that failed are sent again.
    pub async fn bucket_stats(&self, keys: &[&str]) -> Result<Vec<BucketProbe>, BulkError> {
        const WHAT: &str = "probing buckets (MEMORY USAGE, OBJECT ENCODING, HLEN, EVALSHA)";
        let conn = self.connection();
        let now = ExpiryCode::script_now(now_ms());
        let cmds: Vec<Keyed> = keys.iter().flat_map(|k| probe_cmds(k, now)).collect();
        let mut replies = conn.run(cmds).await.map_err(redis_err(WHAT))?;
        if replies.len() != keys.len() * 4 {
            return Err(BulkError::Reply(format!(
                "probing buckets: {} replies to {} commands",
                replies.len(),
                keys.len() * 4
            )));
        }
        for attempt in 0.. {
            let again: Vec<usize> = (0..replies.len())
                .filter(|&i| replies[i].as_ref().is_err_and(scripts::is_noscript))
                .collect();
            if again.is_empty() {
                break;
            }
            if attempt == 2 {
                return Err(BulkError::Reply(
                    "NOSCRIPT three times in a row: is something flushing the script cache (SCRIPT FLUSH)?"
                        .to_owned(),
                ));
            }
            self.load_count_expired().await.map_err(redis_err(
                "reloading the expiry-count script (SCRIPT LOAD) after NOSCRIPT",
            ))?;
            let redo = again
                .iter()
                .map(|&i| count_expired(keys[i / 4], now))
                .collect();
            let redone = conn.run(redo).await.map_err(redis_err(WHAT))?;
            for (i, r) in again.into_iter().zip(redone) {
                replies[i] = r;
            }
        }
        let mut out = Vec::with_capacity(keys.len());
        let mut replies = replies.into_iter();
        for k in keys {
            let r: Vec<RedisResult<Value>> = replies.by_ref().take(4).collect();
            if let Some(e) = r.iter().find_map(|r| r.as_ref().err()) {
                if e.code() == Some("WRONGTYPE") {
                    out.push(BucketProbe::NotHash(e.to_string()));
                    continue;
                }
                return Err(BulkError::Reply(format!("probing {k}: {e}")));
            }
            let r: Vec<Value> = r.into_iter().map(|v| v.expect("no error")).collect();
            let (Some(bytes), Some(fields)) = (int(&r[0]), int(&r[2])) else {
                out.push(BucketProbe::Vanished);
                continue;
            };
            if fields == 0 {
                out.push(BucketProbe::Vanished);
                continue;
            }
            let encoding: String = redis::from_redis_value_ref::<Option<String>>(&r[1])
                .ok()
                .flatten()
                .unwrap_or_else(|| "?".to_owned());
            let counts: Vec<u64> = redis::from_redis_value_ref(&r[3]).map_err(|e| {
                BulkError::Reply(format!("the expiry-count script's reply for {k}: {e}"))
            })?;
            let [expired, never, unreadable] = counts[..] else {
                return Err(BulkError::Reply(format!(
                    "the expiry-count script returned {counts:?} for {k}"
                )));
            };
            out.push(BucketProbe::Stats(BucketStats {
                bytes,
                encoding,
                fields,
                expired,
                never,
                unreadable,
            }));
        }
        Ok(out)
    }
}
