//! The walk: `SCAN <prefix>b:*` on every scan target (the node, or each primary of a Redis
//! Cluster in turn: `SCAN` only sees the keys of the node it runs on), each bucket key taken
//! once (SCAN may return a key twice), and every bucket probed (or a reservoir sample of
//! `--sample` of them over all the nodes) `--batch` keys per round trip
//! (`RedisStore::bucket_stats`: `MEMORY USAGE`, `OBJECT ENCODING`, `HLEN` and the expired
//! count), paced to `--max-buckets-per-sec`. The probes add up into [`Totals`]; keys that are
//! not buckets of this keyspace are counted and named in warnings.

use std::collections::{BTreeMap, HashSet};

use anyhow::Context;
use indicatif::ProgressBar;
use namelist::store::Layout;
use namelist::store::redis::RedisStore;
use namelist::store::redis::bulk::BucketProbe;
use namelist::store::redis::conn::ScanTarget;

use super::{Args, EncodingStats, MAX_LISTED_BUCKETS, ProblemBucket};
use crate::pace::Pace;

/// One probed bucket.
pub(super) struct Probe {
    /// Index of the scan target the key was found on.
    node: usize,
    key: String,
    bytes: u64,
    encoding: String,
    fields: u64,
    expired: u64,
    never: u64,
    unreadable: u64,
}

enum Outcome {
    Probed(Probe),
    /// Deleted between the SCAN and the probe.
    Vanished,
    /// Not a hash: (key, the error).
    NotHash(String, String),
}

/// Running totals of one node.
#[derive(Default, Clone)]
pub(super) struct NodeTotals {
    pub(super) buckets: u64,
    pub(super) entries: u64,
    pub(super) bytes: u64,
    pub(super) over_limit: u64,
    pub(super) hashtable: u64,
}

/// Running totals of the walk.
#[derive(Default)]
pub(super) struct Totals {
    /// Per scan target, in the order of `scan_targets`.
    pub(super) nodes: Vec<NodeTotals>,
    pub(super) buckets: u64,
    pub(super) entries: u64,
    pub(super) bytes: u64,
    pub(super) key_name_bytes: u64,
    pub(super) fills: BTreeMap<u64, u64>,
    pub(super) encodings: BTreeMap<String, EncodingStats>,
    pub(super) over_limit: (u64, Vec<ProblemBucket>),
    pub(super) hashtable: (u64, Vec<ProblemBucket>),
    pub(super) problems: u64,
    pub(super) expired: u64,
    pub(super) never: u64,
    pub(super) unreadable: u64,
    pub(super) vanished: u64,
    pub(super) not_hash: Vec<String>,
    /// The first buckets probed, until they hold `--compare-sample` fields: the comparison's source.
    pub(super) compare_keys: Vec<String>,
    pub(super) compare_fields: u64,
}

impl Totals {
    /// Adds one probe; `limit` is the listpack limit of the bucket's own node.
    fn add(&mut self, p: Probe, limit: Option<u64>, compare_sample: u64) {
        if self.nodes.len() <= p.node {
            self.nodes.resize(p.node + 1, NodeTotals::default());
        }
        let node = &mut self.nodes[p.node];
        node.buckets += 1;
        node.entries += p.fields;
        node.bytes += p.bytes;
        self.buckets += 1;
        self.entries += p.fields;
        self.bytes += p.bytes;
        self.key_name_bytes += p.key.len() as u64;
        *self.fills.entry(p.fields).or_default() += 1;
        let enc = self.encodings.entry(p.encoding.clone()).or_default();
        enc.buckets += 1;
        enc.entries += p.fields;
        enc.bytes += p.bytes;
        self.expired += p.expired;
        self.never += p.never;
        self.unreadable += p.unreadable;
        let over_limit = limit.is_some_and(|l| p.fields > l);
        let hashtable = p.encoding == "hashtable";
        node.over_limit += u64::from(over_limit);
        node.hashtable += u64::from(hashtable);
        if over_limit || hashtable {
            self.problems += 1;
            let problem = ProblemBucket {
                key: p.key.clone(),
                fields: p.fields,
                encoding: p.encoding.clone(),
                bytes: p.bytes,
                over_limit,
            };
            for (flag, (count, list)) in [
                (over_limit, &mut self.over_limit),
                (hashtable, &mut self.hashtable),
            ] {
                if flag {
                    *count += 1;
                    if list.len() < MAX_LISTED_BUCKETS {
                        list.push(problem.clone());
                    }
                }
            }
        }
        if self.compare_fields < compare_sample && p.fields > 0 {
            self.compare_fields += p.fields;
            self.compare_keys.push(p.key);
        }
    }
}

/// Which bucket keys the SCAN already returned (SCAN may return a key twice).
struct Seen {
    bits: Vec<u64>,
    others: HashSet<String>,
}

impl Seen {
    fn new(buckets: u32) -> Self {
        Self {
            bits: vec![0; (buckets as usize).div_ceil(64)],
            others: HashSet::new(),
        }
    }

    /// Whether this is the first time; `n` is the bucket number parsed from `key`.
    fn first(&mut self, n: u32, key: &str) -> bool {
        let (word, bit) = (n as usize / 64, n % 64);
        match self.bits.get_mut(word) {
            Some(w) => {
                let fresh = *w & (1 << bit) == 0;
                *w |= 1 << bit;
                fresh
            }
            _ => self.others.insert(key.to_owned()),
        }
    }
}

/// A splitmix64 stream (sampling and scratch names; no cryptographic use).
pub(super) struct SplitMix(pub u64);

impl SplitMix {
    pub(super) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Probes a batch of bucket keys (node index, key) in one round trip (`RedisStore::bucket_stats`).
async fn probe_batch(store: &RedisStore, keys: &[(usize, String)]) -> anyhow::Result<Vec<Outcome>> {
    let names: Vec<&str> = keys.iter().map(|(_, k)| k.as_str()).collect();
    let probes = store.bucket_stats(&names).await?;
    Ok(keys
        .iter()
        .zip(probes)
        .map(|((node, k), p)| match p {
            BucketProbe::Stats(st) => Outcome::Probed(Probe {
                node: *node,
                key: k.clone(),
                bytes: st.bytes,
                encoding: st.encoding,
                fields: st.fields,
                expired: st.expired,
                never: st.never,
                unreadable: st.unreadable,
            }),
            BucketProbe::Vanished => Outcome::Vanished,
            BucketProbe::NotHash(e) => Outcome::NotHash(k.clone(), e),
        })
        .collect())
}

/// The walk's state: totals plus what the probes found that is not a bucket.
struct Walk<'a> {
    store: &'a RedisStore,
    opts: &'a Args,
    /// Per scan target.
    limits: Vec<Option<u64>>,
    totals: Totals,
    /// `--max-buckets-per-sec`.
    pace: Pace,
    progress: &'a ProgressBar,
}

impl Walk<'_> {
    async fn probe(&mut self, keys: &[(usize, String)]) -> anyhow::Result<()> {
        self.pace.take(keys.len() as u64).await;
        let outcomes = probe_batch(self.store, keys).await?;
        for o in outcomes {
            match o {
                Outcome::Probed(p) => {
                    let limit = self.limits.get(p.node).copied().flatten();
                    self.totals.add(p, limit, self.opts.compare_sample as u64)
                }
                Outcome::Vanished => self.totals.vanished += 1,
                Outcome::NotHash(k, e) => {
                    if self.totals.not_hash.len() < 20 {
                        self.totals.not_hash.push(format!("{k} ({e})"));
                    }
                }
            }
        }
        self.progress.inc(keys.len() as u64);
        Ok(())
    }
}

/// What the walk found: the totals of the probed buckets, and what the SCAN saw.
pub(super) struct Walked {
    pub(super) totals: Totals,
    /// Bucket keys the SCAN found (each once).
    pub(super) found: u64,
    /// ... per scan target.
    pub(super) found_on: Vec<u64>,
    /// Keys matching the pattern that are not bucket names: how many, and the first ten.
    foreign: (u64, Vec<String>),
    /// Bucket keys numbered at or past the keyspace's bucket count.
    out_of_range: u64,
}

/// SCANs every target for bucket keys and probes them all, or a reservoir sample of
/// `--sample` of them; `limits` are the targets' listpack limits, `seed` draws the sample.
pub(super) async fn walk(
    store: &RedisStore,
    layout: &Layout,
    opts: &Args,
    targets: &[ScanTarget],
    limits: Vec<Option<u64>>,
    seed: u64,
    progress: &ProgressBar,
) -> anyhow::Result<Walked> {
    let cluster = store.is_cluster();
    let batch = opts.batch.max(1);
    let mut walk = Walk {
        store,
        opts,
        limits,
        totals: Totals {
            nodes: vec![NodeTotals::default(); targets.len()],
            ..Totals::default()
        },
        pace: Pace::per_sec(opts.max_buckets_per_sec.unwrap_or(0)),
        progress,
    };
    let mut seen = Seen::new(layout.buckets());
    let mut found: u64 = 0;
    let mut found_on: Vec<u64> = vec![0; targets.len()];
    let mut foreign: (u64, Vec<String>) = (0, Vec::new());
    let mut out_of_range: u64 = 0;
    let mut pending: Vec<(usize, String)> = Vec::new();
    let mut reservoir: Vec<(usize, String)> = Vec::new();
    let mut rng = SplitMix(seed);
    match opts.sample {
        Some(_) => {
            progress.set_length(0);
            progress.set_message("scanning bucket names");
        }
        None => {
            progress.set_length(u64::from(layout.buckets()));
            progress.set_message("probing buckets");
        }
    }

    let count = u32::try_from(batch).unwrap_or(u32::MAX);
    for (node, target) in targets.iter().enumerate() {
        let mut cursor: u64 = 0;
        loop {
            let (next, keys) = store
                .scan_bucket_keys(target, cursor, count)
                .await
                .with_context(|| {
                    if cluster {
                        format!("SCAN on {target}")
                    } else {
                        "SCAN".to_owned()
                    }
                })?;
            for k in keys {
                let k = match String::from_utf8(k) {
                    Ok(k) => k,
                    Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
                };
                let Some(n) = layout.bucket_number(k.as_bytes()) else {
                    foreign.0 += 1;
                    if foreign.1.len() < 10 {
                        foreign.1.push(k);
                    }
                    continue;
                };
                if !seen.first(n, &k) {
                    continue;
                }
                found += 1;
                found_on[node] += 1;
                if n >= layout.buckets() {
                    out_of_range += 1;
                }
                match opts.sample {
                    // Algorithm R: after `found` keys each is kept with probability size/found.
                    Some(size) => {
                        if (reservoir.len() as u64) < size {
                            reservoir.push((node, k));
                        } else {
                            let j = rng.next() % found;
                            if j < size {
                                reservoir[j as usize] = (node, k);
                            }
                        }
                    }
                    None => pending.push((node, k)),
                }
            }
            while pending.len() as u64 >= batch {
                let chunk: Vec<(usize, String)> = pending.drain(..batch as usize).collect();
                walk.probe(&chunk).await?;
            }
            if next == 0 {
                break;
            }
            cursor = next;
        }
    }
    if opts.sample.is_some() {
        progress.set_length(reservoir.len() as u64);
        progress.set_message("probing sampled buckets");
        pending = reservoir;
    }
    for chunk in pending.chunks(batch as usize) {
        walk.probe(chunk).await?;
    }
    progress.finish_and_clear();
    Ok(Walked {
        totals: walk.totals,
        found,
        found_on,
        foreign,
        out_of_range,
    })
}

impl Walked {
    /// What the walk met that is not a readable bucket of this keyspace, said as warnings.
    pub(super) fn warnings(&self, store: &RedisStore, layout: &Layout) -> Vec<String> {
        let (foreign, out_of_range, totals) = (&self.foreign, self.out_of_range, &self.totals);
        let mut warnings = Vec::new();
        if foreign.0 > 0 {
            warnings.push(format!(
                "{} keys match {} but are not bucket names (ignored), e.g. {}",
                foreign.0,
                store.bucket_scan_pattern(),
                foreign.1.join(", ")
            ));
        }
        if out_of_range > 0 {
            warnings.push(format!(
                "{out_of_range} bucket keys have a number >= the {} buckets recorded in {}: no entry \
                 hashes there (left from another sizing?)",
                layout.buckets(),
                layout.meta_key()
            ));
        }
        if !totals.not_hash.is_empty() {
            warnings.push(format!(
                "bucket keys that are not hashes (skipped): {}",
                totals.not_hash.join(", ")
            ));
        }
        if totals.vanished > 0 {
            warnings.push(format!(
                "{} buckets vanished between the SCAN and the probe (emptied by deletes)",
                totals.vanished
            ));
        }
        if totals.unreadable > 0 {
            warnings.push(format!(
                "{} field values are not integer expiry codes",
                totals.unreadable
            ));
        }

        warnings
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seen_dedups_in_and_out_of_range() {
        let mut s = Seen::new(100);
        assert!(s.first(5, "b:5"));
        assert!(!s.first(5, "b:5"));
        assert!(s.first(99, "b:99"));
        assert!(s.first(100_000, "b:100000"));
        assert!(!s.first(100_000, "b:100000"));
    }
}
