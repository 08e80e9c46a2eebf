//! `MetricStore` on the embedded store: velocity metric entities and remembered event ids.
//!
//! Velocity metrics follow the Lua scripts of `store::redis` step for step (the conformance
//! suite holds both to the same oracle); APPROX_COUNT_DISTINCT is counted exactly here.

use std::collections::{BTreeMap, HashMap, HashSet};

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use super::MemoryStore;
use super::persist::{encode, event_row};
use crate::domain::now_ms;
use crate::store::durable::Table;
use crate::store::{
    Deadline, MetricAnswer, MetricFamily, MetricOp, MetricReading, MetricStore, StoreResult,
};

/// One metric entity, as Redis would keep it (see `layout`).
#[derive(Serialize, Deserialize)]
pub(super) struct MetricState {
    /// Unix ms; the APPROX family keeps one per sub-window instead.
    expire_at: i64,
    data: MetricData,
}

#[derive(Serialize, Deserialize)]
enum MetricData {
    /// Hash of integer fields (SUM, AVG, MIN, MAX).
    Hash(BTreeMap<i64, i64>),
    /// Sorted set: member → score (COUNT_DISTINCT).
    Zset(HashMap<i64, i64>),
    /// One set per sub-window, each with its own expiry (APPROX_COUNT_DISTINCT, counted
    /// exactly here: within any HyperLogLog error bound).
    Subs(BTreeMap<i64, (i64, HashSet<i64>)>),
}

impl MetricState {
    fn new(op: &MetricOp) -> Self {
        Self {
            expire_at: i64::MAX,
            data: match op.family {
                MetricFamily::Distinct => MetricData::Zset(HashMap::new()),
                MetricFamily::Approx => MetricData::Subs(BTreeMap::new()),
                _ => MetricData::Hash(BTreeMap::new()),
            },
        }
    }

    fn is_empty(&self) -> bool {
        match &self.data {
            MetricData::Hash(h) => h.is_empty(),
            MetricData::Zset(z) => z.is_empty(),
            MetricData::Subs(s) => s.is_empty(),
        }
    }

    /// Applies one op with the semantics of the Lua script in `store::redis::scripts`;
    /// `duplicate`: its event was already applied, so only its read runs.
    fn apply(&mut self, op: &MetricOp, now: i64, duplicate: bool) -> MetricAnswer {
        let n = op.slots;
        let floor = op.trim_hi - n + 1;
        let (lo, hi) = (op.read_hi - n + 1, op.read_hi);
        let update = if duplicate { None } else { op.update };
        if let Some((sub, value)) = update {
            let at = op.expire_at().unwrap_or(i64::MAX);
            match &mut self.data {
                MetricData::Hash(h) => {
                    match op.family {
                        MetricFamily::Sum => *h.entry(sub).or_default() += value,
                        MetricFamily::Avg => {
                            *h.entry(2 * sub).or_default() += value;
                            *h.entry(2 * sub + 1).or_default() += 1;
                        }
                        MetricFamily::Min => {
                            let e = h.entry(sub).or_insert(value);
                            *e = (*e).min(value);
                        }
                        _ => {
                            let e = h.entry(sub).or_insert(value);
                            *e = (*e).max(value);
                        }
                    }
                    let per = if op.family == MetricFamily::Avg { 2 } else { 1 };
                    if h.len() as i64 > per * n {
                        h.retain(|f, _| f.div_euclid(per) >= floor);
                    }
                }
                MetricData::Zset(z) => {
                    // `ZADD GT CH`: at the cap, members that left the window go first, then
                    // the oldest; only when a member was added or moved, as the script does.
                    let changed = z.get(&value).is_none_or(|s| sub > *s);
                    if changed {
                        z.insert(value, sub);
                    }
                    let cap = op.cap as usize;
                    if changed && z.len() >= cap {
                        z.retain(|_, s| *s >= floor);
                    }
                    if changed && z.len() > cap {
                        // ZPOPMIN: lowest score first, then the smallest member as a string.
                        let mut order: Vec<(i64, String, i64)> =
                            z.iter().map(|(m, s)| (*s, m.to_string(), *m)).collect();
                        order.sort();
                        for (_, _, m) in order.into_iter().take(z.len() - cap) {
                            z.remove(&m);
                        }
                    }
                }
                MetricData::Subs(subs) => {
                    let e = subs.entry(sub).or_insert((at, HashSet::new()));
                    e.0 = e.0.max(at);
                    e.1.insert(value);
                }
            }
            if !matches!(self.data, MetricData::Subs(_)) {
                self.expire_at = if self.expire_at == i64::MAX {
                    at
                } else {
                    self.expire_at.max(at)
                };
            }
        }
        if let MetricData::Subs(subs) = &mut self.data {
            subs.retain(|_, (at, _)| *at > now);
        }
        if !op.read {
            return MetricAnswer {
                duplicate,
                reading: None,
            };
        }
        let in_range = |f: i64| f >= lo && f <= hi;
        let reading = match (&self.data, op.family) {
            (MetricData::Hash(h), MetricFamily::Sum) => MetricReading::Sum(
                h.iter()
                    .filter(|(f, _)| in_range(**f))
                    .map(|(_, v)| v)
                    .sum(),
            ),
            (MetricData::Hash(h), MetricFamily::Avg) => {
                let (mut sum, mut count) = (0, 0);
                for (f, v) in h.iter().filter(|(f, _)| in_range(f.div_euclid(2))) {
                    if f % 2 == 0 {
                        sum += v;
                    } else {
                        count += v;
                    }
                }
                MetricReading::Avg { sum, count }
            }
            (MetricData::Hash(h), MetricFamily::Min) => MetricReading::Extreme(
                h.iter()
                    .filter(|(f, _)| in_range(**f))
                    .map(|(_, v)| *v)
                    .min(),
            ),
            (MetricData::Hash(h), _) => MetricReading::Extreme(
                h.iter()
                    .filter(|(f, _)| in_range(**f))
                    .map(|(_, v)| *v)
                    .max(),
            ),
            (MetricData::Zset(z), _) => MetricReading::Distinct {
                count: z.values().filter(|s| in_range(**s)).count() as i64,
                capped: z.len() >= op.cap as usize,
            },
            (MetricData::Subs(subs), _) => {
                let mut all: HashSet<i64> = HashSet::new();
                for (_, (_, set)) in subs.range(lo..=hi) {
                    all.extend(set);
                }
                MetricReading::Distinct {
                    count: all.len() as i64,
                    capped: false,
                }
            }
        };
        MetricAnswer {
            duplicate,
            reading: Some(reading),
        }
    }
}

/// A metric entity's bytes, for `canonical_state`.
pub(super) fn encode_canonical(m: &MetricState) -> String {
    match &m.data {
        MetricData::Hash(h) => format!("{} {h:?}", m.expire_at),
        MetricData::Zset(z) => {
            let mut z: Vec<_> = z.iter().collect();
            z.sort();
            format!("{} {z:?}", m.expire_at)
        }
        MetricData::Subs(s) => {
            let s: Vec<_> = s
                .iter()
                .map(|(k, (e, set))| {
                    let mut set: Vec<_> = set.iter().collect();
                    set.sort();
                    (k, e, set)
                })
                .collect();
            format!("{} {s:?}", m.expire_at)
        }
    }
}

#[async_trait]
impl MetricStore for MemoryStore {
    async fn metric_ops(
        &self,
        ops: &[MetricOp],
        _deadline: Deadline,
    ) -> StoreResult<Vec<MetricAnswer>> {
        let now = now_ms();
        let writes = ops.iter().any(|op| op.update.is_some());
        let (answers, pending) = {
            let mut guard = self.lock();
            if writes {
                self.writable()?;
            }
            let st = &mut *guard;
            let durable = self.durable.is_some();
            let mut rows = Vec::new();
            st.ops_since_purge += ops.len() as u64;
            if st.ops_since_purge > 4096 {
                st.ops_since_purge = 0;
                let gone: Vec<String> = st
                    .metrics
                    .iter()
                    .filter(|(_, m)| m.expire_at <= now || m.is_empty())
                    .map(|(k, _)| k.clone())
                    .collect();
                for k in gone {
                    st.metrics.remove(&k);
                    if durable {
                        rows.push((Table::Metrics, k.into_bytes(), None));
                    }
                }
                let gone: Vec<i64> = st
                    .events
                    .iter()
                    .filter(|(_, until)| **until <= now)
                    .map(|(h, _)| *h)
                    .collect();
                for h in gone {
                    st.events.remove(&h);
                    if durable {
                        rows.push((Table::Events, event_row(h), None));
                    }
                }
            }
            // Whether each event (of this call) is a replay, decided at its first op.
            let mut replay: HashMap<(u32, i64), bool> = HashMap::new();
            let mut touched: Vec<&str> = Vec::new();
            let answers = ops
                .iter()
                .map(|op| {
                    let duplicate = match (op.update, op.event) {
                        (Some(_), Some(e)) => *replay.entry((e.seq, e.hash)).or_insert_with(|| {
                            match st.events.get(&e.hash) {
                                Some(until) if *until > now => true,
                                _ => {
                                    st.events.insert(e.hash, e.keep_until_ms);
                                    if durable {
                                        rows.push((
                                            Table::Events,
                                            event_row(e.hash),
                                            Some(encode(&e.keep_until_ms)),
                                        ));
                                    }
                                    false
                                }
                            }
                        }),
                        _ => false,
                    };
                    let state = st
                        .metrics
                        .entry(op.key.clone())
                        .or_insert_with(|| MetricState::new(op));
                    if state.expire_at <= now {
                        *state = MetricState::new(op);
                    }
                    let r = state.apply(op, now, duplicate);
                    if state.is_empty() {
                        st.metrics.remove(&op.key);
                    }
                    if durable && op.update.is_some() && !duplicate {
                        touched.push(&op.key);
                    }
                    r
                })
                .collect::<Vec<_>>();
            // Each entity an update changed, once, as it is now.
            touched.sort_unstable();
            touched.dedup();
            for k in touched {
                let value = st.metrics.get(k).map(encode);
                rows.push((Table::Metrics, k.as_bytes().to_vec(), value));
            }
            let pending = if rows.is_empty() {
                None
            } else {
                self.record(rows)
            };
            (answers, pending)
        };
        Self::durable(pending).await?;
        Ok(answers)
    }
}
