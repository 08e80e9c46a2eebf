//! The audit's arithmetic, pure functions over what the walk measured: fill percentiles and
//! the histogram, buckets near the listpack limit, and `INFO memory` read and summed over the
//! nodes of a cluster.

use std::collections::BTreeMap;

use super::walk::Totals;
use super::{FillBin, FillStats, HISTOGRAM_BINS, NEAR_LIMIT_PERCENT, ServerMemory};

/// Nearest-rank percentile of a fill → count histogram.
pub(super) fn percentile(fills: &BTreeMap<u64, u64>, total: u64, p: f64) -> u64 {
    if total == 0 {
        return 0;
    }
    let rank = ((p * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    for (&fill, &count) in fills {
        seen += count;
        if seen >= rank {
            return fill;
        }
    }
    fills.keys().next_back().copied().unwrap_or(0)
}

/// Up to `HISTOGRAM_BINS` equal bins from the smallest fill to a little past the 99th
/// percentile (and past the listpack limit when it is at most twice the largest fill, so the
/// chart shows the headroom), then one overflow bin for anything larger: a single runaway
/// bucket does not flatten the chart.
pub(super) fn histogram(fills: &BTreeMap<u64, u64>, limit: Option<u64>) -> Vec<FillBin> {
    let (Some(&min), Some(&max)) = (fills.keys().next(), fills.keys().next_back()) else {
        return Vec::new();
    };
    let total = fills.values().sum();
    let p99 = percentile(fills, total, 0.99);
    let mut lo = min;
    let mut hi = (p99 + (p99 - min) / 4 + 1).min(max + 1);
    if let Some(l) = limit
        && l <= max.saturating_mul(2)
    {
        hi = hi.max(l + 2);
        lo = lo.min(l);
    }
    let width = (hi - lo).div_ceil(HISTOGRAM_BINS).max(1);
    let bins = (hi - lo).div_ceil(width);
    let end = lo + bins * width;
    let mut out: Vec<FillBin> = (0..bins)
        .map(|i| FillBin {
            from: lo + i * width,
            to: lo + (i + 1) * width,
            buckets: 0,
            overflow: false,
        })
        .collect();
    if max >= end {
        out.push(FillBin {
            from: end,
            to: max + 1,
            buckets: 0,
            overflow: true,
        });
    }
    for (&fill, &count) in fills {
        let i = (((fill - lo) / width) as usize).min(out.len() - 1);
        out[i].buckets += count;
    }
    out
}

/// Buckets from [`NEAR_LIMIT_PERCENT`] of the limit up to the limit (none when it is unknown).
pub(super) fn near_limit(fills: &BTreeMap<u64, u64>, limit: Option<u64>) -> u64 {
    limit.map_or(0, |l| {
        fills
            .range((l * NEAR_LIMIT_PERCENT).div_ceil(100)..=l)
            .map(|(_, n)| n)
            .sum()
    })
}

/// Fill statistics of the probed buckets.
pub(super) fn fill_stats(t: &Totals) -> FillStats {
    FillStats {
        min: t.fills.keys().next().copied().unwrap_or(0),
        p50: percentile(&t.fills, t.buckets, 0.50),
        p99: percentile(&t.fills, t.buckets, 0.99),
        max: t.fills.keys().next_back().copied().unwrap_or(0),
        mean: t.entries as f64 / t.buckets.max(1) as f64,
    }
}

/// The figures of one node's `INFO memory`.
pub(super) fn server_memory(info: &BTreeMap<String, String>) -> ServerMemory {
    let get = |k: &str| info.get(k).cloned();
    let num = |k: &str| info.get(k).and_then(|v| v.parse::<u64>().ok());
    let ratio = |k: &str| info.get(k).and_then(|v| v.parse::<f64>().ok());
    ServerMemory {
        used_memory: num("used_memory"),
        used_memory_rss: num("used_memory_rss"),
        mem_fragmentation_ratio: ratio("mem_fragmentation_ratio"),
        allocator_frag_ratio: ratio("allocator_frag_ratio"),
        mem_allocator: get("mem_allocator"),
        maxmemory: num("maxmemory"),
        maxmemory_policy: get("maxmemory_policy"),
    }
}

/// Every distinct value, comma-separated (`None` if there is none).
pub(super) fn distinct(values: impl IntoIterator<Item = Option<String>>) -> Option<String> {
    let mut seen: Vec<String> = Vec::new();
    for v in values.into_iter().flatten() {
        if !seen.contains(&v) {
            seen.push(v);
        }
    }
    (!seen.is_empty()).then(|| seen.join(", "))
}

/// The memory of several nodes as one: the node itself when there is one; else used_memory,
/// used_memory_rss and maxmemory summed (each `None` unless every node answered; maxmemory 0,
/// no limit, if any node has none), the fragmentation ratio of the sums (rss / used), the
/// worst allocator fragmentation, every distinct allocator and policy.
pub fn combined_memory(nodes: &[ServerMemory]) -> ServerMemory {
    if let [one] = nodes {
        return one.clone();
    }
    let sum = |f: fn(&ServerMemory) -> Option<u64>| -> Option<u64> {
        if nodes.is_empty() {
            return None;
        }
        nodes.iter().map(f).sum()
    };
    let used = sum(|m| m.used_memory);
    let rss = sum(|m| m.used_memory_rss);
    let maxmemory = sum(|m| m.maxmemory).map(|total| {
        if nodes.iter().any(|m| m.maxmemory == Some(0)) {
            0
        } else {
            total
        }
    });
    ServerMemory {
        used_memory: used,
        used_memory_rss: rss,
        mem_fragmentation_ratio: match (rss, used) {
            (Some(r), Some(u)) if u > 0 => Some(((r as f64 / u as f64) * 100.0).round() / 100.0),
            _ => None,
        },
        allocator_frag_ratio: nodes
            .iter()
            .filter_map(|m| m.allocator_frag_ratio)
            .reduce(f64::max),
        mem_allocator: distinct(nodes.iter().map(|m| m.mem_allocator.clone())),
        maxmemory,
        maxmemory_policy: distinct(nodes.iter().map(|m| m.maxmemory_policy.clone())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_of_several_nodes() {
        let node = |used, rss, max, frag| ServerMemory {
            used_memory: Some(used),
            used_memory_rss: Some(rss),
            mem_fragmentation_ratio: Some(rss as f64 / used as f64),
            allocator_frag_ratio: Some(frag),
            mem_allocator: Some("jemalloc-5.3.0".to_owned()),
            maxmemory: Some(max),
            maxmemory_policy: Some("noeviction".to_owned()),
        };
        let one = node(100, 200, 0, 1.1);
        let same = combined_memory(std::slice::from_ref(&one));
        assert_eq!(same.used_memory, Some(100));
        assert_eq!(same.mem_fragmentation_ratio, Some(2.0));
        let both = combined_memory(&[node(100, 200, 1000, 1.1), node(300, 300, 3000, 1.3)]);
        assert_eq!(both.used_memory, Some(400));
        assert_eq!(both.used_memory_rss, Some(500));
        assert_eq!(both.mem_fragmentation_ratio, Some(1.25));
        assert_eq!(both.allocator_frag_ratio, Some(1.3), "the worst node");
        assert_eq!(both.maxmemory, Some(4000));
        assert_eq!(both.mem_allocator.as_deref(), Some("jemalloc-5.3.0"));
        let unlimited = combined_memory(&[node(100, 200, 1000, 1.1), node(300, 300, 0, 1.3)]);
        assert_eq!(unlimited.maxmemory, Some(0), "one node without a limit");
        let refused = combined_memory(&[node(100, 200, 1000, 1.1), ServerMemory::default()]);
        assert_eq!(refused.used_memory, None, "a node did not answer");
        assert_eq!(
            distinct([
                Some("a".to_owned()),
                None,
                Some("b".to_owned()),
                Some("a".to_owned())
            ]),
            Some("a, b".to_owned())
        );
    }

    #[test]
    fn percentiles_and_histogram() {
        let fills: BTreeMap<u64, u64> = [(10, 50), (20, 49), (500, 1)].into_iter().collect();
        assert_eq!(percentile(&fills, 100, 0.5), 10);
        assert_eq!(percentile(&fills, 100, 0.51), 20);
        assert_eq!(percentile(&fills, 100, 0.99), 20);
        assert_eq!(percentile(&fills, 100, 1.0), 500);
        let h = histogram(&fills, Some(512));
        assert!(h.len() as u64 <= HISTOGRAM_BINS);
        assert_eq!(h.iter().map(|b| b.buckets).sum::<u64>(), 100);
        assert_eq!(h[0].from, 10);
        assert!(
            h.last().unwrap().to > 512,
            "the chart reaches past the limit"
        );
        assert!(histogram(&BTreeMap::new(), None).is_empty());
        let one: BTreeMap<u64, u64> = [(400, 3)].into_iter().collect();
        let h = histogram(&one, Some(100_000));
        assert_eq!(h.len(), 1);
        assert_eq!(h[0].buckets, 3);
    }
}
