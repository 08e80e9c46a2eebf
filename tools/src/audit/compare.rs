//! The layout comparison: the same entries, measured in the layouts of seed 004.
//!
//! Takes up to `--compare-sample` real (field, expiry code) pairs from the first buckets the
//! walk probed, then, one layout at a time, writes them under `<prefix>audit-scratch:<pid>:`,
//! sums `MEMORY USAGE key SAMPLES 0` over the keys it wrote and deletes them (also when writing
//! or measuring failed). Nothing is estimated from a formula. Every command names one key
//! (`DEL` too: one per key) and goes through `RedisConn::run`, so on a Redis Cluster the
//! scratch keys spread over the primaries like any keys. The layouts:
//!
//! * `ours_rebuilt`: this layout again, the same fields and codes in `round(n / mean fill)`
//!   buckets `…b:<field mod N>`, so the sample sits at the keyspace's own mean fill;
//! * `seed_plain_key`: one string key per entry, `…deviceHash-3-<hex>-<sandbox>` = the expiry
//!   in Unix ms (the seed's 136 B key); ten entries share one hex identity (derived from the
//!   first one's field), sandboxes `100000`..`100009`, as in the seed's example;
//! * `seed_identity_hash`: one hash per identity, `…deviceHash-3-<hex>`, field = sandbox,
//!   value = ms (the seed's old service, 296 B for ten sandboxes);
//! * `seed_bucket_ms`: the seed's bucket, `…bucket_<crc32(plain key name) % N>` with
//!   `N = ceil(n / 512)`, field = the low 32 bits of the fingerprint as an i32 (a Java
//!   `hashCode`), value = ms.
//!
//! The key name counts in `MEMORY USAGE`, so the per-identity names keep the seed's lengths
//! (84 B plain, 77 B identity hash): the scratch prefix takes the place of as many of the
//! seed's 64 hex digits (at least 16 remain; a prefix over 48 B makes the names longer, and
//! the note says so). "Never" is written as 2100-01-01 in ms (13 digits like any expiry).

use std::collections::BTreeMap;

use anyhow::{Context, bail};
use serde::Serialize;

use super::walk::SplitMix;
use namelist::store::ExpiryCode;
use namelist::store::layout::Layout;
use namelist::store::redis::RedisStore;
use namelist::store::redis::bulk::ScratchValue;

/// 2100-01-01T00:00:00Z in Unix ms: "never" in the millisecond layouts.
const NEVER_MS: i64 = 4_102_444_800_000;
/// The seed's entries per bucket.
const SEED_BUCKET_FILL: usize = 512;
/// Hex digits of the seed's device fingerprint.
const SEED_HEX: usize = 64;
/// Hex digits an identity keeps however long the scratch prefix is.
const MIN_HEX: usize = 16;
/// Sandboxes per identity in the seed's example.
const SANDBOXES: usize = 10;

/// What one layout costs for the sample's entries.
#[derive(Debug, Clone, Serialize)]
pub struct LayoutCost {
    /// `ours`, `ours_rebuilt`, `seed_plain_key`, `seed_identity_hash`, `seed_bucket_ms`.
    pub layout: String,
    pub label: String,
    pub keys: u64,
    pub entries: u64,
    /// Sum of `MEMORY USAGE key SAMPLES 0`.
    pub bytes: u64,
    pub bytes_per_entry: f64,
    /// Mean key name length (the key name counts in `MEMORY USAGE`).
    pub key_name_bytes: f64,
    /// Keys `OBJECT ENCODING` reported as `hashtable`.
    pub hashtable_keys: u64,
    /// What the seed's article measured for this layout (no scratch prefix), for reference.
    pub seed_reported_bytes_per_entry: Option<f64>,
}

/// The same entries in every layout.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Entries in the sample (every scratch layout holds exactly these).
    pub entries: u64,
    /// Buckets the sample was read from.
    pub source_buckets: u64,
    pub scratch_prefix: String,
    /// `ours` (the audited keyspace itself) first, then the scratch layouts.
    pub layouts: Vec<LayoutCost>,
    /// Scratch keys still present after the deletes (0 unless a delete failed).
    pub scratch_keys_left: u64,
    pub notes: Vec<String>,
}

struct ScratchLayout {
    layout: &'static str,
    label: String,
    keys: Vec<(String, ScratchValue)>,
    seed_reported: Option<f64>,
}

/// The expiry code as Unix ms.
fn code_ms(code: u32) -> i64 {
    ExpiryCode::new(code).decode().unwrap_or(NEVER_MS)
}

/// An identity of `len` hex digits (the seed's device fingerprint) derived from a field.
fn identity_hex(field: i64, len: usize) -> String {
    let mut r = SplitMix(field as u64 ^ 0x6465_7669_6365_4861);
    let mut hex = String::with_capacity(len + 16);
    while hex.len() < len {
        hex.push_str(&format!("{:016x}", r.next()));
    }
    hex.truncate(len);
    hex
}

/// Hex digits that keep `<scratch>deviceHash-3-<hex>` as long as the seed's names.
fn hex_len(scratch: &str) -> usize {
    SEED_HEX.saturating_sub(scratch.len()).max(MIN_HEX)
}

fn hash_layout(
    layout: &'static str,
    label: String,
    map: BTreeMap<String, Vec<(i64, i64)>>,
    seed_reported: Option<f64>,
) -> ScratchLayout {
    ScratchLayout {
        layout,
        label,
        keys: map
            .into_iter()
            .map(|(k, v)| (k, ScratchValue::Hash(v)))
            .collect(),
        seed_reported,
    }
}

/// The four scratch layouts of the sample `pairs`.
fn layouts(scratch: &str, pairs: &[(i64, u32)], mean_fill: f64) -> Vec<ScratchLayout> {
    let n = pairs.len();
    // Entry i is sandbox i % 10 of identity i / 10.
    let identities: Vec<String> = pairs
        .chunks(SANDBOXES)
        .map(|c| identity_hex(c[0].0, hex_len(scratch)))
        .collect();
    let plain_name = |i: usize| {
        format!(
            "deviceHash-3-{}-{}",
            identities[i / SANDBOXES],
            100_000 + i % SANDBOXES
        )
    };

    let ours_buckets = ((n as f64 / mean_fill.max(1.0)).round() as u64).max(1);
    let mut ours: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    let mut plain = Vec::with_capacity(n);
    let mut identity: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    let seed_buckets = n.div_ceil(SEED_BUCKET_FILL).max(1) as u32;
    let mut seed: BTreeMap<String, Vec<(i64, i64)>> = BTreeMap::new();
    for (i, &(field, code)) in pairs.iter().enumerate() {
        let ms = code_ms(code);
        ours.entry(format!("{scratch}b:{}", field as u64 % ours_buckets))
            .or_default()
            .push((field, i64::from(code)));
        let name = plain_name(i);
        identity
            .entry(format!(
                "{scratch}deviceHash-3-{}",
                identities[i / SANDBOXES]
            ))
            .or_default()
            .push(((100_000 + i % SANDBOXES) as i64, ms));
        seed.entry(format!(
            "{scratch}bucket_{}",
            crc32fast::hash(name.as_bytes()) % seed_buckets
        ))
        .or_default()
        .push((i64::from(field as i32), ms));
        plain.push((format!("{scratch}{name}"), ScratchValue::Plain(ms)));
    }
    vec![
        hash_layout(
            "ours_rebuilt",
            format!("ours: the sample rebuilt, {ours_buckets} buckets"),
            ours,
            None,
        ),
        ScratchLayout {
            layout: "seed_plain_key",
            label: "seed: one string key per entry".to_owned(),
            keys: plain,
            seed_reported: Some(136.0),
        },
        hash_layout(
            "seed_identity_hash",
            "seed: one hash per identity (10 sandboxes)".to_owned(),
            identity,
            Some(29.6),
        ),
        hash_layout(
            "seed_bucket_ms",
            format!("seed: bucket_<crc32 % {seed_buckets}>, i32 field, ms value"),
            seed,
            None,
        ),
    ]
}

/// Writes, measures and deletes each layout of a sample of the entries in `source_keys`.
pub(super) async fn compare(
    store: &RedisStore,
    layout: &Layout,
    source_keys: &[String],
    sample: usize,
    mean_fill: f64,
    batch: usize,
) -> anyhow::Result<Comparison> {
    let (pairs, source_buckets) = store.sample_entries(source_keys, sample).await?;
    if pairs.is_empty() {
        bail!("the sampled buckets hold no readable (integer field, expiry code) pairs");
    }
    let scratch = format!("{}audit-scratch:{}:", layout.prefix(), std::process::id());
    let n = pairs.len() as u64;
    let mut out = Comparison {
        entries: n,
        source_buckets,
        scratch_prefix: scratch.clone(),
        layouts: Vec::new(),
        scratch_keys_left: 0,
        notes: Vec::new(),
    };
    for l in layouts(&scratch, &pairs, mean_fill) {
        let names: Vec<&str> = l.keys.iter().map(|(k, _)| k.as_str()).collect();
        let measured = async {
            store
                .write_scratch(&l.keys)
                .await
                .with_context(|| format!("writing the {} sample", l.layout))?;
            store
                .measure_keys(&names, batch)
                .await
                .with_context(|| format!("measuring the {} sample", l.layout))
        }
        .await;
        let left = store.delete_keys(&names).await;
        let (bytes, hashtable_keys) = match (measured, left) {
            (Ok(m), Ok(left)) => {
                out.scratch_keys_left += left;
                m
            }
            (Err(e), Ok(_)) => return Err(e),
            (Ok(_), Err(d)) => {
                return Err(
                    anyhow::Error::new(d).context(format!("scratch keys {scratch}* may be left"))
                );
            }
            (Err(e), Err(d)) => {
                return Err(e.context(format!(
                    "and deleting the scratch keys failed too ({d:#}): delete {scratch}* by hand"
                )));
            }
        };
        let key_name_bytes =
            names.iter().map(|k| k.len() as u64).sum::<u64>() as f64 / names.len().max(1) as f64;
        out.layouts.push(LayoutCost {
            layout: l.layout.to_owned(),
            label: l.label,
            keys: names.len() as u64,
            entries: n,
            bytes,
            bytes_per_entry: bytes as f64 / n as f64,
            key_name_bytes,
            hashtable_keys,
            seed_reported_bytes_per_entry: l.seed_reported,
        });
    }

    let excess = scratch.len().saturating_sub(SEED_HEX - MIN_HEX);
    out.notes.push(if excess == 0 {
        format!(
            "the per-key layouts' names keep the seed's lengths (84 B, 77 B): the scratch prefix {scratch} \
             stands in for {} of the seed's 64 hex digits",
            scratch.len()
        )
    } else {
        format!(
            "the per-key layouts' names are {excess} B longer than the seed's (84 B, 77 B): the scratch prefix \
             {scratch} is too long to stand in for the seed's hex digits, and longer names cost more"
        )
    });
    if let Some(seed) = out.layouts.iter().find(|l| l.layout == "seed_bucket_ms")
        && seed.hashtable_keys > 0
    {
        out.notes.push(format!(
            "{} of the {} seed buckets became hashtables: the seed sizes buckets for a mean of 512 entries, \
             so a bucket above the mean exceeds the default hash-max-listpack-entries of 512",
            seed.hashtable_keys, seed.keys
        ));
    }
    if out.scratch_keys_left > 0 {
        out.notes.push(format!(
            "{} scratch keys could not be deleted: delete {scratch}* by hand",
            out.scratch_keys_left
        ));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scratch_layouts_hold_every_entry() {
        let pairs: Vec<(i64, u32)> = (0..1234)
            .map(|i| (-(i as i64) * 7_919_000_000_123, i as u32 % 3))
            .collect();
        let ls = layouts("nl:audit-scratch:1:", &pairs, 400.0);
        assert_eq!(ls.len(), 4);
        for l in &ls {
            let entries: usize = l
                .keys
                .iter()
                .map(|(_, p)| match p {
                    ScratchValue::Plain(_) => 1,
                    ScratchValue::Hash(v) => v.len(),
                })
                .sum();
            assert_eq!(entries, pairs.len(), "{}", l.layout);
        }
        let plain = &ls[1].keys[0].0;
        assert_eq!(plain.len(), 84, "the seed's name length: {plain}");
        assert_eq!(ls[2].keys[0].0.len(), 77);
        let long = "x".repeat(60);
        assert_eq!(hex_len(&long), MIN_HEX);
        assert_eq!(identity_hex(5, 40).len(), 40);
        assert_eq!(ls[2].keys.len(), 124, "one hash per ten entries");
        assert_eq!(ls[3].keys.len(), 3, "ceil(1234 / 512) buckets");
        assert_eq!(code_ms(0), NEVER_MS);
        assert_eq!(code_ms(1), 1_577_836_801_000, "one second after 2020");
    }
}
