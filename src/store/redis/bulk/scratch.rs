//! The bucket audit's layout comparison (`namelist-tools audit`): a sample of entries read,
//! written again as scratch keys of other layouts (under the caller's own scratch prefix),
//! measured and deleted.

use redis::Value;

use super::{BulkError, redis_err};
use crate::store::redis::RedisStore;
use crate::store::redis::conn::Keyed;

/// A scratch key's content (the audit's layout comparison): a plain integer or hash pairs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScratchValue {
    Plain(i64),
    Hash(Vec<(i64, i64)>),
}

/// Field/value pairs per scratch `HSET`.
const HSET_PAIRS: usize = 500;
/// Commands per scratch write pipeline.
const WRITE_COMMANDS: usize = 1000;

/// A command on one key (every scratch command touches exactly one key, so a cluster routes
/// each by its own slot).
fn on_key(key: &str, build: impl FnOnce(&mut redis::Cmd)) -> Keyed {
    let mut cmd = redis::Cmd::new();
    build(&mut cmd);
    (key.as_bytes().to_vec(), cmd)
}

/// `<command> <key>` on each of `keys`.
fn on_each_key(command: &str, keys: &[impl AsRef<str>]) -> Vec<Keyed> {
    keys.iter()
        .map(|k| {
            let k = k.as_ref();
            on_key(k, |c| {
                c.arg(command).arg(k);
            })
        })
        .collect()
}

// The audit's layout comparison: reads a sample of entries, writes them as scratch keys of
// other layouts, measures and deletes them. Keys are the caller's (its own scratch prefix).
impl RedisStore {
    /// Up to `n` (field, code) pairs from `keys` (HGETALL, a few buckets per round trip).
    pub async fn sample_entries(
        &self,
        keys: &[String],
        n: usize,
    ) -> Result<(Vec<(i64, u32)>, u64), BulkError> {
        let conn = self.connection();
        let mut pairs = Vec::with_capacity(n);
        let mut used = 0;
        for chunk in keys.chunks(20) {
            let cmds = on_each_key("HGETALL", chunk);
            let replies: Vec<Value> = conn
                .run_all(cmds)
                .await
                .map_err(redis_err("reading the comparison sample (HGETALL)"))?;
            for reply in replies {
                let flat: Vec<(Value, Value)> = match reply {
                    Value::Map(m) => m,
                    Value::Array(items) => {
                        let mut it = items.into_iter();
                        std::iter::from_fn(|| Some((it.next()?, it.next()?))).collect()
                    }
                    _ => Vec::new(),
                };
                used += 1;
                for (f, v) in flat {
                    if let (Ok(f), Ok(v)) = (
                        redis::from_redis_value::<i64>(f),
                        redis::from_redis_value::<u32>(v),
                    ) {
                        pairs.push((f, v));
                    }
                }
                if pairs.len() >= n {
                    pairs.truncate(n);
                    return Ok((pairs, used));
                }
            }
        }
        Ok((pairs, used))
    }

    /// Writes the scratch keys: `SET` or multi-field `HSET`s, one key per command, about
    /// [`WRITE_COMMANDS`] commands per batch.
    pub async fn write_scratch(&self, keys: &[(String, ScratchValue)]) -> Result<(), BulkError> {
        let conn = self.connection();
        let mut cmds: Vec<Keyed> = Vec::new();
        let mut queued = 0;
        for (name, payload) in keys {
            match payload {
                ScratchValue::Plain(v) => {
                    cmds.push(on_key(name, |c| {
                        c.arg("SET").arg(name).arg(*v);
                    }));
                    queued += 1;
                }
                ScratchValue::Hash(pairs) => {
                    for chunk in pairs.chunks(HSET_PAIRS) {
                        cmds.push(on_key(name, |c| {
                            c.arg("HSET").arg(name);
                            for (f, v) in chunk {
                                c.arg(*f).arg(*v);
                            }
                        }));
                        queued += 1 + chunk.len() / 20;
                    }
                }
            }
            if queued >= WRITE_COMMANDS {
                conn.run_all(std::mem::take(&mut cmds))
                    .await
                    .map_err(redis_err("writing scratch keys"))?;
                queued = 0;
            }
        }
        if !cmds.is_empty() {
            conn.run_all(cmds)
                .await
                .map_err(redis_err("writing scratch keys"))?;
        }
        Ok(())
    }

    /// (bytes, hashtable keys) of the scratch keys.
    pub async fn measure_keys(
        &self,
        names: &[&str],
        batch: usize,
    ) -> Result<(u64, u64), BulkError> {
        let conn = self.connection();
        let (mut bytes, mut hashtables) = (0, 0);
        for chunk in names.chunks(batch.max(1)) {
            let cmds = chunk
                .iter()
                .flat_map(|k| {
                    [
                        on_key(k, |c| {
                            c.arg("MEMORY").arg("USAGE").arg(*k).arg("SAMPLES").arg(0);
                        }),
                        on_key(k, |c| {
                            c.arg("OBJECT").arg("ENCODING").arg(*k);
                        }),
                    ]
                })
                .collect();
            let replies = conn
                .run_all(cmds)
                .await
                .map_err(redis_err("measuring scratch keys"))?;
            for (k, r) in chunk.iter().zip(replies.chunks(2)) {
                let reply = |e: redis::ParsingError| BulkError::Reply(format!("{k}: {e}"));
                let size: Option<u64> = redis::from_redis_value_ref(&r[0]).map_err(reply)?;
                let encoding: Option<String> = redis::from_redis_value_ref(&r[1]).map_err(reply)?;
                let Some(size) = size else {
                    return Err(BulkError::Reply(format!(
                        "scratch key {k} vanished before it was measured (evicted?)"
                    )));
                };
                bytes += size;
                hashtables += u64::from(encoding.as_deref() == Some("hashtable"));
            }
        }
        Ok((bytes, hashtables))
    }

    /// Deletes the scratch keys (one `DEL` per key); how many are still there afterwards.
    /// Every key's `DEL` is sent even if some fail.
    pub async fn delete_keys(&self, names: &[&str]) -> Result<u64, BulkError> {
        let conn = self.connection();
        let mut failed: Option<BulkError> = None;
        for chunk in names.chunks(10_000) {
            let cmds = on_each_key("DEL", chunk);
            let replies = match conn.run(cmds).await {
                Ok(r) => r,
                Err(e) => {
                    failed.get_or_insert(redis_err("deleting scratch keys")(e));
                    continue;
                }
            };
            if let Some(Err(e)) = replies.into_iter().find(Result::is_err) {
                failed.get_or_insert(redis_err("deleting scratch keys")(e));
            }
        }
        if let Some(e) = failed {
            return Err(e);
        }
        let mut left = 0;
        for chunk in names.chunks(10_000) {
            let cmds = on_each_key("EXISTS", chunk);
            let counts = conn
                .run_all(cmds)
                .await
                .map_err(redis_err("checking the scratch keys are gone"))?;
            for c in &counts {
                left += redis::from_redis_value_ref::<u64>(c)
                    .map_err(|e| BulkError::Reply(format!("EXISTS: {e}")))?;
            }
        }
        Ok(left)
    }
}
