//! The walk of the keyspace the sweep makes, node by node: the nodes to visit, a `SCAN` step
//! over the buckets (of entries and of event ids, told apart by [`Bucket`]), an `HSCAN` step
//! over one bucket's fields, a bucket's size, and compare-and-delete of the expired fields
//! (`scripts::COMPARE_AND_DELETE`). The audit walks the same nodes (`scan_targets`,
//! `run_id`).

use std::borrow::Cow;

use redis::{FromRedisValue, RedisResult, ToRedisArgs};
use serde::Serialize;

use super::glob_escape;
use crate::store::StoreBase;
use crate::store::layout::{CLUSTER_SLOTS, Layout, key_slot};
use crate::store::redis::RedisStore;
use crate::store::redis::conn::{RedisConn, ScanTarget};
use crate::store::redis::scripts::{COMPARE_AND_DELETE, COMPARE_AND_DELETE_SCRIPT};

/// A hash of this keyspace whose fields are signed decimal i64 and whose values are expiry
/// codes: what the sweep reads a step at a time and deletes expired fields from.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Bucket {
    /// The bucket of entries `Layout::bucket_key(n)`.
    Entries(u32),
    /// A bucket of remembered event ids.
    EventIds(EventBucket),
}

impl Bucket {
    /// The bucket's key.
    pub fn key(&self, layout: &Layout) -> Cow<'_, str> {
        match self {
            Bucket::Entries(n) => Cow::Owned(layout.bucket_key(*n)),
            Bucket::EventIds(e) => Cow::Borrowed(&e.key),
        }
    }
}

/// A bucket of remembered event ids of this keyspace, `<prefix>e{<tag>}<b>`: built only from
/// a key `Layout::is_event_bucket` accepts, so nothing that merely looks like one is touched.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct EventBucket {
    key: String,
    index: u64,
}

impl EventBucket {
    /// The bucket whose key is exactly `key`, if it is a bucket of event ids of `layout`.
    pub fn parse(layout: &Layout, key: &[u8]) -> Option<Self> {
        if !layout.is_event_bucket(key) {
            return None;
        }
        // `is_event_bucket` checked the shape: the prefix, `e{`, a tag, `}`, a number.
        let key = String::from_utf8(key.to_vec()).ok()?;
        let (tag, b) = key[layout.prefix().len() + 2..].split_once('}')?;
        // Each slot has exactly one tag, so (slot, b) names the bucket.
        let slot = u64::from(key_slot(tag.as_bytes()));
        let index = slot * Self::per_slot(layout) + b.parse::<u64>().ok()?;
        Some(Self { key, index })
    }

    /// How many numbers [`index`](Self::index) spans for `layout`'s event buckets.
    pub fn count(layout: &Layout) -> u64 {
        u64::from(CLUSTER_SLOTS) * Self::per_slot(layout)
    }

    /// A number of this bucket, unique among `layout`'s event buckets, below
    /// [`count`](Self::count) (for a tool's bit set of buckets seen).
    pub fn index(&self) -> u64 {
        self.index
    }

    pub fn key(&self) -> &str {
        &self.key
    }

    fn per_slot(layout: &Layout) -> u64 {
        u64::from(layout.event_buckets()).div_ceil(u64::from(CLUSTER_SLOTS))
    }
}

/// One `SCAN` step over the keys the sweep walks on one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketScan {
    /// The cursor to continue from; 0 once the node is done.
    pub next: u64,
    /// Buckets of this keyspace found, of entries or event ids, in `SCAN` order (`SCAN` may
    /// return one twice, across steps too).
    pub buckets: Vec<Bucket>,
    /// Keys matching the pattern ([`RedisStore::sweep_scan_pattern`]) that are neither.
    pub skipped: u64,
}

/// One `HSCAN` step over a bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FieldScan {
    /// The cursor to continue from; 0 once the bucket is done.
    pub next: u64,
    /// Raw (field, value) pairs, as stored (`Layout::parse_entry` says which are entries).
    pub pairs: Vec<(Vec<u8>, Vec<u8>)>,
}

/// What compare-and-delete did to one bucket.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct CasOutcome {
    /// Fields deleted: they still held the expected value.
    pub deleted: u64,
    /// Fields left alone: present with another value.
    pub refreshed: u64,
}

/// Deletes each `(field, expected)` of bucket `key` only if the field still holds `expected`
/// (`scripts::COMPARE_AND_DELETE`, one `EVALSHA`, loading the script after a `NOSCRIPT`).
/// Fields already gone count in neither figure. Pass at most a few thousand pairs per call.
pub async fn compare_and_delete<C, K, F, V>(
    conn: &mut C,
    key: K,
    expected: &[(F, V)],
) -> RedisResult<CasOutcome>
where
    C: redis::aio::ConnectionLike,
    K: ToRedisArgs,
    F: ToRedisArgs,
    V: ToRedisArgs,
{
    if expected.is_empty() {
        return Ok(CasOutcome::default());
    }
    let mut call = COMPARE_AND_DELETE_SCRIPT.prepare_invoke();
    call.key(key);
    for (field, value) in expected {
        call.arg(field).arg(value);
    }
    let (deleted, refreshed): (u64, u64) = call.invoke_async(conn).await?;
    Ok(CasOutcome { deleted, refreshed })
}

impl RedisStore {
    /// The nodes a walk of the keyspace visits: the node, or every cluster primary.
    pub async fn scan_targets(&self) -> RedisResult<Vec<ScanTarget>> {
        self.connection().scan_targets().await
    }

    /// Whether the store is a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.connection().is_cluster()
    }

    /// One `SCAN` step on `target`, from `cursor`, about `count` keys, for the buckets of
    /// entries and of event ids together ([`sweep_scan_pattern`](Self::sweep_scan_pattern)).
    pub async fn scan_buckets(
        &self,
        target: &ScanTarget,
        cursor: u64,
        count: u32,
    ) -> RedisResult<BucketScan> {
        let layout = self.layout();
        let (next, keys) = self
            .connection()
            .scan(target, cursor, &self.sweep_scan_pattern(), count)
            .await?;
        let mut out = BucketScan {
            next,
            ..BucketScan::default()
        };
        for key in keys {
            if let Some(n) = layout.parse_bucket_key(&key) {
                out.buckets.push(Bucket::Entries(n));
            } else if let Some(e) = EventBucket::parse(layout, &key) {
                out.buckets.push(Bucket::EventIds(e));
            } else {
                out.skipped += 1;
            }
        }
        Ok(out)
    }

    /// One `HSCAN` step over `bucket`, about `count` fields; `None` if the key holds something
    /// other than a hash (not ours: leave it alone). A missing bucket is an empty last step.
    pub async fn scan_fields(
        &self,
        bucket: &Bucket,
        cursor: u64,
        count: u32,
    ) -> RedisResult<Option<FieldScan>> {
        let mut cmd = redis::cmd("HSCAN");
        cmd.arg(bucket.key(self.layout()).as_ref())
            .arg(cursor)
            .arg("COUNT")
            .arg(count);
        let (next, flat): (u64, Vec<Vec<u8>>) = match self.query(&cmd).await {
            Err(e) if e.code() == Some("WRONGTYPE") => return Ok(None),
            r => r?,
        };
        let mut pairs = Vec::with_capacity(flat.len() / 2);
        let mut it = flat.into_iter();
        while let (Some(f), Some(v)) = (it.next(), it.next()) {
            pairs.push((f, v));
        }
        Ok(Some(FieldScan { next, pairs }))
    }

    /// What `bucket` takes in Redis memory (`MEMORY USAGE … SAMPLES 0`: exact, O(fields)); 0
    /// if it does not exist.
    pub async fn bucket_memory(&self, bucket: &Bucket) -> RedisResult<u64> {
        let mut cmd = redis::cmd("MEMORY");
        cmd.arg("USAGE")
            .arg(bucket.key(self.layout()).as_ref())
            .arg("SAMPLES")
            .arg(0);
        let bytes: Option<u64> = self.query(&cmd).await?;
        Ok(bytes.unwrap_or(0))
    }

    /// Deletes each `(field, expected code)` of `bucket` that still holds exactly the value
    /// read (an entry or id refreshed since survives): `compare_and_delete` on this keyspace.
    pub async fn delete_if_unchanged(
        &self,
        bucket: &Bucket,
        expected: &[(Vec<u8>, Vec<u8>)],
    ) -> RedisResult<CasOutcome> {
        let key = bucket.key(self.layout());
        compare_and_delete(&mut self.connection(), key.as_ref(), expected).await
    }

    /// Loads the compare-and-delete script on `target` (before a walk that deletes, so that
    /// the first call on each node does not pay a `NOSCRIPT`).
    pub async fn load_compare_and_delete(&self, target: &ScanTarget) -> RedisResult<()> {
        let mut load = redis::cmd("SCRIPT");
        load.arg("LOAD").arg(COMPARE_AND_DELETE);
        let _sha: String = self.connection().on_target(target, &load).await?;
        Ok(())
    }

    /// The `run_id` of the Redis process on `target` (`None` if `INFO` is refused): a scan
    /// cursor means something only to the process that returned it.
    pub async fn run_id(&self, target: &ScanTarget) -> Option<String> {
        let info: String = self
            .connection()
            .on_target(target, redis::cmd("INFO").arg("server"))
            .await
            .ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("run_id:"))
            .map(|s| s.trim().to_owned())
    }

    async fn query<T: FromRedisValue>(&self, cmd: &redis::Cmd) -> RedisResult<T> {
        let mut conn: RedisConn = self.connection();
        cmd.query_async(&mut conn).await
    }
}

impl RedisStore {
    /// The `SCAN MATCH` pattern of the sweep, the prefix's glob characters escaped:
    /// `<prefix>[be][:{]*`, the buckets of entries (`b:`) and of event ids (`e{`) in one walk
    /// (plus `b{…` and `e:…`, which no layout writes: skipped like any foreign key).
    pub fn sweep_scan_pattern(&self) -> String {
        format!("{}[be][:{{]*", glob_escape(self.layout().prefix()))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;

    use super::*;
    use crate::store::Hashing;

    #[test]
    fn event_buckets_parse_to_distinct_indices_below_the_count() {
        for n in [1u32, 3, 16_384, 16_385, 50_000] {
            let l = Layout::new("nl:", 1, Hashing::Unkeyed).with_velocity(2, n);
            let mut seen = HashSet::new();
            for h in (0..200_000i64).step_by(7).chain([i64::MIN, -1, i64::MAX]) {
                for slot in [None, Some(0), Some(9_999), Some(16_383)] {
                    let key = l.event_bucket_key(h, slot);
                    let e = EventBucket::parse(&l, key.as_bytes()).expect(&key);
                    assert_eq!(e.key(), key);
                    assert!(e.index() < EventBucket::count(&l), "{key} of {n}");
                    seen.insert((e.index(), key));
                }
            }
            let indices: HashSet<u64> = seen.iter().map(|(i, _)| *i).collect();
            assert_eq!(indices.len(), seen.len(), "one index per key ({n} buckets)");
        }
        let l = Layout::new("nl:", 1, Hashing::Unkeyed).with_velocity(2, 50_000);
        for foreign in ["nl:e{notatag}0", "nl:e{3560}9", "nl:b:0", "other:e{3560}0"] {
            assert_eq!(
                EventBucket::parse(&l, foreign.as_bytes()),
                None,
                "{foreign}"
            );
        }
    }
}
