//! Typed bulk operations of the Redis store, for the operator tools (`namelist-tools`): walk
//! the keyspace's buckets node by node with resumable cursors, read a bucket's fields a step
//! at a time, measure a bucket, and delete expired fields with compare-and-delete.
//!
//! Invariant: the tools never name a Redis command or hold Lua; they speak in bucket numbers
//! and cursors, and every key these operations touch is one `Layout` names (`parse_bucket_key`
//! keeps out keys that merely look like buckets). Each method is one command (one round trip),
//! so a tool can pace its commands one by one; none waits for replicas (bulk work is
//! housekeeping; see each tool's help for what it costs against a live store).

use redis::{FromRedisValue, RedisResult, ToRedisArgs};
use serde::Serialize;

use super::Store;
use super::conn::{RedisConn, ScanTarget};
use super::redis::RedisStore;
use super::scripts::{COMPARE_AND_DELETE, COMPARE_AND_DELETE_SCRIPT};

/// One `SCAN` step over the bucket keys of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BucketScan {
    /// The cursor to continue from; 0 once the node is done.
    pub next: u64,
    /// Buckets of this keyspace found (SCAN may return one twice, across steps too).
    pub buckets: Vec<u32>,
    /// Keys matching the bucket pattern that are not a bucket of this keyspace.
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

    /// One `SCAN` step for bucket keys on `target`, from `cursor`, about `count` keys.
    pub async fn scan_buckets(
        &self,
        target: &ScanTarget,
        cursor: u64,
        count: u32,
    ) -> RedisResult<BucketScan> {
        let layout = self.layout();
        let (next, keys) = self
            .connection()
            .scan(target, cursor, &layout.bucket_pattern(), count)
            .await?;
        let mut out = BucketScan {
            next,
            ..BucketScan::default()
        };
        for key in keys {
            match layout.parse_bucket_key(&key) {
                Some(n) => out.buckets.push(n),
                None => out.skipped += 1,
            }
        }
        Ok(out)
    }

    /// One `HSCAN` step over `bucket`, about `count` fields; `None` if the key holds something
    /// other than a hash (not ours: leave it alone). A missing bucket is an empty last step.
    pub async fn scan_fields(
        &self,
        bucket: u32,
        cursor: u64,
        count: u32,
    ) -> RedisResult<Option<FieldScan>> {
        let mut cmd = redis::cmd("HSCAN");
        cmd.arg(self.layout().bucket_key(bucket))
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
    pub async fn bucket_memory(&self, bucket: u32) -> RedisResult<u64> {
        let mut cmd = redis::cmd("MEMORY");
        cmd.arg("USAGE")
            .arg(self.layout().bucket_key(bucket))
            .arg("SAMPLES")
            .arg(0);
        let bytes: Option<u64> = self.query(&cmd).await?;
        Ok(bytes.unwrap_or(0))
    }

    /// Deletes each `(field, expected code)` of `bucket` that still holds exactly the value
    /// read (an entry refreshed since survives): `compare_and_delete` on this keyspace.
    pub async fn delete_if_unchanged(
        &self,
        bucket: u32,
        expected: &[(Vec<u8>, Vec<u8>)],
    ) -> RedisResult<CasOutcome> {
        let key = self.layout().bucket_key(bucket);
        compare_and_delete(&mut self.connection(), key, expected).await
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
