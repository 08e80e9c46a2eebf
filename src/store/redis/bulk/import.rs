//! The bulk writes of `namelist-tools import`: prefix lengths registered before their
//! entries, then whole buckets, each built and `RESTORE`d when it does not exist (a compact
//! listpack in one command) or written with `HSET` when it does; and the proof, on probe keys,
//! that this server's `RESTORE` builds what `HSET` would.

use redis::RedisResult;

use super::{BulkError, redis_err};
use crate::store::StoreBase;
use crate::store::layout::{PrefixLen, Scope};
use crate::store::redis::RedisStore;
use crate::store::redis::conn::Keyed;
use crate::store::redis::dump::DumpFormat;

/// One bucket's entries to import: (field, expiry code) pairs, fields distinct.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketWrite {
    pub bucket: u32,
    pub pairs: Vec<(i64, i64)>,
}

/// What `write_buckets` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BucketWriteOutcome {
    /// Buckets created whole with `RESTORE` (they did not exist).
    pub restored: u64,
    /// Buckets written with `HSET` (they existed, or `RESTORE` is off).
    pub hset: u64,
    /// Entries written.
    pub entries: u64,
    /// Entries that created a field (every entry of a restored bucket; what `HSET` says).
    pub created: u64,
}

/// An `HSET` reply: the fields it created (0 for anything else).
fn new_fields(v: &redis::Value) -> u64 {
    redis::from_redis_value_ref::<u64>(v).unwrap_or(0)
}

fn hset(key: &str, pairs: &[(i64, i64)]) -> Keyed {
    let mut cmd = redis::cmd("HSET");
    cmd.arg(key);
    for (f, v) in pairs {
        cmd.arg(f).arg(v);
    }
    (key.as_bytes().to_vec(), cmd)
}

impl RedisStore {
    /// Adds prefix lengths to their scopes' registries (`SADD`), so that a range is
    /// registered before any of its entries is written. Idempotent.
    pub async fn register_prefix_lengths(
        &self,
        prefixes: &[(Scope, PrefixLen)],
    ) -> RedisResult<()> {
        let cmds = prefixes
            .iter()
            .map(|(Scope { list, sandbox }, len)| {
                let key = self.layout().registry_key(list, sandbox);
                let mut c = redis::cmd("SADD");
                c.arg(&key).arg(len.member());
                (key.into_bytes(), c)
            })
            .collect();
        self.connection().run_all(cmds).await.map(drop)
    }

    /// Writes one batch of buckets: with `format`, a bucket that does not exist is built
    /// whole and `RESTORE`d (a compact listpack in one command); every other bucket (or
    /// every one, without `format`) gets its fields with `HSET`. A bucket created by someone
    /// else between the check and the `RESTORE` (`BUSYKEY`) gets `HSET` too: nothing is lost.
    /// On a cluster the batch is split by slot and sent concurrently.
    pub async fn write_buckets(
        &self,
        format: Option<DumpFormat>,
        batch: &[BucketWrite],
    ) -> Result<BucketWriteOutcome, BulkError> {
        let conn = self.connection();
        let mut outcome = BucketWriteOutcome::default();
        let keys: Vec<String> = batch
            .iter()
            .map(|b| self.layout().bucket_key(b.bucket))
            .collect();
        let exists: Vec<bool> = match format {
            Some(_) => {
                let cmds = keys
                    .iter()
                    .map(|k| {
                        let mut c = redis::cmd("EXISTS");
                        c.arg(k);
                        (k.as_bytes().to_vec(), c)
                    })
                    .collect();
                conn.run_all(cmds)
                    .await
                    .map_err(redis_err("EXISTS"))?
                    .iter()
                    .map(|v| {
                        redis::from_redis_value_ref::<bool>(v)
                            .map_err(|e| redis_err("EXISTS reply")(e.into()))
                    })
                    .collect::<Result<_, _>>()?
            }
            None => vec![true; batch.len()],
        };
        let mut cmds = Vec::with_capacity(batch.len());
        let mut is_restore = Vec::with_capacity(batch.len());
        for (i, b) in batch.iter().enumerate() {
            outcome.entries += b.pairs.len() as u64;
            match format {
                Some(f) if !exists[i] => {
                    let mut c = redis::cmd("RESTORE");
                    c.arg(&keys[i]).arg(0).arg(f.hash_payload(&b.pairs)?);
                    cmds.push((keys[i].as_bytes().to_vec(), c));
                    is_restore.push(true);
                }
                _ => {
                    cmds.push(hset(&keys[i], &b.pairs));
                    is_restore.push(false);
                    outcome.hset += 1;
                }
            }
        }
        let results = conn.run(cmds).await.map_err(redis_err("writing buckets"))?;
        let mut fallback = Vec::new();
        for (i, r) in results.into_iter().enumerate() {
            match r {
                Ok(_) if is_restore[i] => {
                    outcome.restored += 1;
                    outcome.created += batch[i].pairs.len() as u64;
                }
                Ok(v) => outcome.created += new_fields(&v),
                Err(e) if is_restore[i] && e.to_string().contains("BUSYKEY") => fallback.push(i),
                Err(e) => return Err(redis_err(format!("writing {}", keys[i]))(e)),
            }
        }
        if !fallback.is_empty() {
            // Created by someone else since EXISTS: add our fields to it.
            let cmds = fallback
                .iter()
                .map(|&i| hset(&keys[i], &batch[i].pairs))
                .collect();
            let replies = conn
                .run_all(cmds)
                .await
                .map_err(redis_err("HSET fallback"))?;
            outcome.created += replies.iter().map(new_fields).sum::<u64>();
            outcome.hset += fallback.len() as u64;
        }
        Ok(outcome)
    }

    /// Learns the server's `DUMP` format and proves the `RESTORE` path on probe keys of this
    /// prefix (deleted afterwards): the restored content, encoding and `MEMORY USAGE` must
    /// equal an `HSET`-built twin's. An error means: write every bucket with `HSET`.
    pub async fn prove_restore(&self) -> Result<DumpFormat, BulkError> {
        let mut conn = self.connection();
        let conn = &mut conn;
        let prefix = self.layout().prefix();
        let pid = std::process::id();
        let (a, b, c) = (
            format!("{prefix}probe:{pid}:a"),
            format!("{prefix}probe:{pid}:b"),
            format!("{prefix}probe:{pid}:c"),
        );
        let pairs: Vec<(i64, i64)> = vec![
            (-6_917_529_027_641_081_856, 217_000_000),
            (5, 0),
            (-3000, 100),
            (30_000, 5_000_000),
            (i64::MAX, 8_000_000),
        ];
        let result: Result<DumpFormat, BulkError> = async {
            let e = redis_err;
            let _: () = redis::cmd("HSET")
                .arg(&a)
                .arg(1)
                .arg(2)
                .query_async(conn)
                .await
                .map_err(e("HSET probe"))?;
            let dump: Vec<u8> = redis::cmd("DUMP")
                .arg(&a)
                .query_async(conn)
                .await
                .map_err(e("DUMP probe"))?;
            let format = DumpFormat::learn(&dump)?;
            let _: () = redis::cmd("HSET")
                .arg(&b)
                .arg(&pairs)
                .query_async(conn)
                .await
                .map_err(e("HSET twin"))?;
            let _: () = redis::cmd("RESTORE")
                .arg(&c)
                .arg(0)
                .arg(format.hash_payload(&pairs)?)
                .query_async(conn)
                .await
                .map_err(e("RESTORE probe"))?;
            let twin: Vec<(i64, i64)> = redis::cmd("HGETALL")
                .arg(&b)
                .query_async(conn)
                .await
                .map_err(e("HGETALL twin"))?;
            let ours: Vec<(i64, i64)> = redis::cmd("HGETALL")
                .arg(&c)
                .query_async(conn)
                .await
                .map_err(e("HGETALL probe"))?;
            let enc: String = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(&c)
                .query_async(conn)
                .await
                .map_err(e("OBJECT ENCODING"))?;
            let mem = |k: &String| {
                redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(k)
                    .arg("SAMPLES")
                    .arg(0)
                    .clone()
            };
            let twin_mem: u64 = mem(&b).query_async(conn).await.map_err(e("MEMORY USAGE"))?;
            let our_mem: u64 = mem(&c).query_async(conn).await.map_err(e("MEMORY USAGE"))?;
            if twin != ours || enc != "listpack" || twin_mem != our_mem {
                return Err(BulkError::ProbeDiffers(format!(
                    "{ours:?} {enc} {our_mem} B vs {twin:?} {twin_mem} B"
                )));
            }
            Ok(format)
        }
        .await;
        // One key per DEL: on a cluster the probes live in different slots.
        for k in [&a, &b, &c] {
            let _: Result<(), _> = redis::cmd("DEL").arg(k).query_async(conn).await;
        }
        result
    }
}
