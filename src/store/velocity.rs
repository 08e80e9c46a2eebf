//! What `MetricStore` and `DefinitionStore` take and give: metric ops (the family, the
//! update and read of one entity, its event), their answers, and stored definitions.

/// How a metric entity is kept: one family per Lua script.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricFamily {
    /// COUNT and SUM: a hash of sub-window → total.
    Sum,
    /// AVG: a hash of `2i` → sum, `2i+1` → count.
    Avg,
    /// MIN: a hash of sub-window → minimum.
    Min,
    /// MAX: a hash of sub-window → maximum.
    Max,
    /// COUNT_DISTINCT: a sorted set of member → last sub-window seen, capped.
    Distinct,
    /// APPROX_COUNT_DISTINCT: a HyperLogLog per sub-window.
    Approx,
}

/// One update and/or read of one metric entity (see `layout` for what each family stores).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricOp {
    pub family: MetricFamily,
    /// The entity's key (`Layout::metric_key`).
    pub key: String,
    /// Sub-windows in the window (`W / r`).
    pub slots: i64,
    pub resolution_ms: i64,
    /// An update: (sub-window, value). The value is the increment (COUNT: 1, SUM/AVG: the
    /// scaled amount), the observed scaled amount (MIN/MAX) or the member's hash (distinct).
    pub update: Option<(i64, i64)>,
    /// The value returned aggregates sub-windows `[read_hi - slots + 1, read_hi]`.
    pub read_hi: i64,
    /// Updates trim sub-windows older than `trim_hi - slots + 1` (`trim_hi` = the present).
    pub trim_hi: i64,
    /// COUNT_DISTINCT: most members kept (the oldest go first).
    pub cap: u32,
    /// The event an update comes from, if it has an id: an event already applied is not
    /// applied again (checked in the same atomic call as its updates).
    pub event: Option<EventMark>,
    /// Whether to read the value back.
    pub read: bool,
}

/// The event of a metric update with an id: what is remembered, until when, and which
/// event of the request it is (ops of one event share it; the same id twice in a request is
/// two events, the second a replay of the first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventMark {
    /// The keyed hash of (type, id): `Layout::event_hash`.
    pub hash: i64,
    /// Unix ms until which it is remembered (`layout`, *Event ids*).
    pub keep_until_ms: i64,
    /// Its position in the request.
    pub seq: u32,
}

/// How far ahead of a store's clock the newest metric data may be: events up to 5 minutes in
/// the future (`velocity::MAX_FUTURE_MS`) and a minute of clock difference between instances.
pub const MAX_FUTURE_MARGIN_MS: i64 = 6 * 60_000;

impl MetricOp {
    /// When the entity's data written by this op stops being readable.
    pub fn expire_at(&self) -> Option<i64> {
        self.update
            .map(|(sub, _)| (sub + self.slots) * self.resolution_ms)
    }

    /// An expiry for the entity's key that no update any instance may make needs moved
    /// later: past the newest sub-window one could write (`trim_hi` and
    /// `MAX_FUTURE_MARGIN_MS`), so it can be set without reading the key's current one.
    /// APPROX_COUNT_DISTINCT keys hold one sub-window each: theirs is `expire_at`.
    pub fn key_expire_at(&self) -> Option<i64> {
        let (sub, _) = self.update?;
        if self.family == MetricFamily::Approx {
            return self.expire_at();
        }
        let r = self.resolution_ms.max(1);
        let ahead = (MAX_FUTURE_MARGIN_MS + r - 1) / r + 1;
        Some((sub.max(self.trim_hi + ahead) + self.slots) * self.resolution_ms)
    }
}

/// What a metric op read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricReading {
    /// COUNT, SUM: the total (0 when empty).
    Sum(i64),
    /// AVG: total and count.
    Avg { sum: i64, count: i64 },
    /// MIN, MAX: `None` when empty.
    Extreme(Option<i64>),
    /// COUNT_DISTINCT, APPROX_COUNT_DISTINCT; `capped` when the member cap is reached.
    Distinct { count: i64, capped: bool },
}

/// What a metric op did: whether its update was a replay, and the value it read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricAnswer {
    pub duplicate: bool,
    pub reading: Option<MetricReading>,
}

/// Metric or rule definitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum DefinitionKind {
    Metric,
    Rule,
}

impl DefinitionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DefinitionKind::Metric => "metric",
            DefinitionKind::Rule => "rule",
        }
    }

    /// The kind `as_str` names.
    pub fn parse(s: &str) -> Option<Self> {
        [DefinitionKind::Metric, DefinitionKind::Rule]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

/// A definition to store (`DefinitionStore::put_definition`): its kind, its id, the
/// fingerprint that tells a change from the same definition again (which decides whether the
/// version moves), and its JSON body. One value so that the trait, both stores and the
/// service name these four once, in one order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NewDefinition<'a> {
    pub kind: DefinitionKind,
    pub id: &'a str,
    pub fingerprint: &'a str,
    pub body: &'a str,
}

/// A live definition as stored: its id, version and JSON body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredDefinition {
    pub id: String,
    pub version: u64,
    pub body: String,
}
