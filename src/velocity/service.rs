//! The velocity service: definitions (kept in the store, cached here, reloaded on every
//! change any instance makes), event ingestion, feature reads and rule evaluation.
//!
//! Ingestion of a batch: validate everything first (a bad event changes nothing), drop the
//! updates that are too old for their metric (an event late for every metric of its type is
//! counted `late`), then every metric update in one pipelined round trip: one script call
//! per event (per event and hash slot on a Redis Cluster), id-less updates in chunks. An
//! event with an id is remembered once, in the same atomic call as its updates, for
//! `dedupe_window` at most and no longer than a replay could still count (`EventMark`): a
//! replay within that time is not applied again (counted in `duplicates`), and a retry after
//! a failure or a timeout applies exactly the calls that did not land. Exactly once per
//! event (per event and slot on a cluster). A replay after the event was forgotten is
//! counted again where it is not late.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use futures::{FutureExt, StreamExt};
use serde_json::Value as Json;

mod definitions;

use super::expr::Aggregation;
use super::model::{AMOUNT_SCALE, Amount, MetricDef, MetricSpec, RuleDef, amount_json};
use super::rules::{self, Decision, Rule};
use crate::background::BackgroundTasks;
use crate::domain::{ErrorCode, EventType, FieldName, MetricId, RuleId, ValidationError, now_ms};
use crate::instrumented::Instrumented;
use crate::invalidation::unhurried;
use crate::lists::FailMode;
use crate::metrics::{Metrics, StoreOp};
use crate::store::{
    Deadline, DefinitionKind, DefinitionStore, EventMark, Invalidation, InvalidationBus,
    MetricAnswer, MetricFamily, MetricOp, MetricReading, MetricStore, StoreError, StoredDefinition,
};

/// Events further in the future than this are refused.
pub const MAX_FUTURE_MS: i64 = 5 * 60_000;
// The store's key expiry covers events this far ahead, and a minute of clock difference.
const _: () = assert!(MAX_FUTURE_MS + 60_000 <= crate::store::MAX_FUTURE_MARGIN_MS);
/// Most events in one request.
pub const MAX_EVENTS_PER_REQUEST: usize = 1_000;
/// Longest event id and field value, in bytes.
pub const MAX_VALUE_LEN: usize = 256;
/// Most metrics (or rules) one read may name.
pub const MAX_NAMED: usize = 64;
/// Most updates in one wave of a batch of events (`Velocity::in_waves`).
pub const WAVE_OPS: usize = 1_024;

/// Updates cut into consecutive ranges of whole events (`of[i]` is update i's event, in
/// order), each of at most `most` updates unless one event alone has more.
fn waves(of: &[usize], most: usize) -> Vec<std::ops::Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0;
    let mut i = 0;
    while i < of.len() {
        let len = of[i..].iter().take_while(|&&e| e == of[i]).count();
        if i > start && i + len - start > most {
            out.push(start..i);
            start = i;
        }
        i += len;
    }
    if start < of.len() {
        out.push(start..of.len());
    }
    out
}

/// Refuses a batch of more than `MAX_EVENTS_PER_REQUEST` events (`too_many_events`): checked
/// by the route before any event is parsed, and again by `ingest` for other callers.
pub fn check_event_count(n: usize) -> Result<(), ValidationError> {
    ValidationError::check_count(
        n,
        MAX_EVENTS_PER_REQUEST,
        ErrorCode::TooManyEvents,
        "events",
    )
}

/// A metric that is not defined: a 400 where a request names it, a 404 where it is the
/// resource asked for (`definitions`).
fn undefined_metric(id: &MetricId) -> ValidationError {
    ValidationError::new(
        ErrorCode::UnknownMetric,
        format!("metric {id} is not defined"),
    )
}

/// A rule that is not defined (as `undefined_metric`).
fn undefined_rule(id: &RuleId) -> ValidationError {
    ValidationError::new(ErrorCode::UnknownRule, format!("rule {id} is not defined"))
}

fn too_many(what: &str, n: usize) -> VelocityError {
    VelocityError::Invalid(ValidationError::new(
        ErrorCode::TooManyNames,
        format!("{n} {what} named; at most {MAX_NAMED}"),
    ))
}

/// Tuning of the velocity service.
#[derive(Debug, Clone)]
pub struct VelocitySettings {
    /// Deadline of feature reads and of `evaluate`'s store work.
    pub read_deadline: Duration,
    /// Deadline of event ingestion and definition changes.
    pub write_deadline: Duration,
    pub fail_mode: FailMode,
    /// Most members a COUNT_DISTINCT entity keeps.
    pub distinct_cap: u32,
    /// Longest an event id is remembered (see `EventMark::keep_until_ms`).
    pub dedupe_window: Duration,
    /// How many definitions this instance lets be made.
    pub limits: DefinitionLimits,
}

/// How many definitions may be made (`too_many_definitions` past them). Every definition
/// costs each instance a parse at each full load (start-up, a new subscription, the 30 s
/// backstop: ~5 µs a definition), and every metric on an event type is one more update in
/// each event of that type, all in one script call (~8 µs of Redis each): without a bound,
/// one admin client could make every load, and every event, as slow as it liked.
///
/// Checked against this instance's definitions as it last heard them, so definitions made
/// at the same moment on several instances may pass a limit by as many as are made at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefinitionLimits {
    /// Most metrics one event type feeds (`max_metrics_per_event`).
    pub metrics_per_event: usize,
    /// Most metrics, and most rules, defined (`max_definitions`).
    pub definitions: usize,
}

impl Default for DefinitionLimits {
    fn default() -> Self {
        Self {
            metrics_per_event: 256,
            definitions: 4_096,
        }
    }
}

/// Why a velocity operation failed.
#[derive(Debug, thiserror::Error)]
pub enum VelocityError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error("{0}")]
    NotFound(ValidationError),
    #[error("{0}")]
    Conflict(ValidationError),
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// A field value of an event: text, or a number kept as its JSON text (exact).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FieldValue {
    Text(String),
    Number(String),
}

impl FieldValue {
    pub fn text(&self) -> &str {
        match self {
            FieldValue::Text(s) | FieldValue::Number(s) => s,
        }
    }
}

/// Field values by name.
pub type Fields = BTreeMap<String, FieldValue>;

/// One event as posted.
#[derive(Debug, Clone)]
pub struct EventInput {
    pub id: Option<String>,
    pub event_type: EventType,
    pub ts: Option<i64>,
    pub fields: Fields,
}

/// What an ingestion did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
pub struct IngestOutcome {
    /// Metric updates applied.
    pub applied: u64,
    /// Events skipped because their id was seen within the longest window.
    pub duplicates: u64,
    /// Events too old for every metric of their type.
    pub late: u64,
}

/// Feature values by metric id, and the metrics whose distinct-member cap was reached.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Features {
    pub values: BTreeMap<MetricId, Json>,
    /// Numbers for rules (`None`: no value).
    pub numbers: BTreeMap<MetricId, Option<f64>>,
    pub capped: Vec<MetricId>,
}

/// The loaded definitions.
#[derive(Default, Clone)]
struct Definitions {
    metrics: BTreeMap<MetricId, Arc<MetricDef>>,
    by_event: HashMap<EventType, Vec<Arc<MetricDef>>>,
    rules: BTreeMap<RuleId, Arc<(RuleDef, Rule)>>,
}

/// A planned update: which event, which metric, where and what.
struct Planned {
    event: usize,
    metric: Arc<MetricDef>,
    key: String,
    sub: i64,
    value: i64,
    /// The event, when it has an id (idempotency).
    mark: Option<EventMark>,
}

/// Where an event sits in a request, for error messages: `events[3].` or `event.`.
type EventPath<'a> = &'a dyn Fn(usize) -> String;

/// The velocity service of one instance.
pub struct Velocity {
    /// The counts: every update and read of a metric entity.
    counts: Instrumented<dyn MetricStore>,
    definitions: Instrumented<dyn DefinitionStore>,
    /// Where definition changes made by any instance are heard.
    bus: Instrumented<dyn InvalidationBus>,
    defs: RwLock<Arc<Definitions>>,
    /// Reloads asked for, numbered as asked (`reload`).
    reloads: std::sync::atomic::AtomicU64,
    /// Held while one load runs (one at a time); the last number a load started after.
    loaded: tokio::sync::Mutex<u64>,
    /// Held while a wave of a batch of events is in flight (`in_waves`).
    batch_turn: tokio::sync::Semaphore,
    settings: VelocitySettings,
    metrics: Arc<Metrics>,
    tasks: BackgroundTasks,
}

fn family(a: Aggregation) -> MetricFamily {
    match a {
        Aggregation::Count | Aggregation::Sum => MetricFamily::Sum,
        Aggregation::Avg => MetricFamily::Avg,
        Aggregation::Min => MetricFamily::Min,
        Aggregation::Max => MetricFamily::Max,
        Aggregation::CountDistinct => MetricFamily::Distinct,
        Aggregation::ApproxCountDistinct => MetricFamily::Approx,
    }
}

/// A stored metric definition, parsed; `None` (said at ERROR) if it cannot be read, which
/// leaves it out as if it were not defined.
fn parse_metric(stored: StoredDefinition) -> Option<Arc<MetricDef>> {
    let (Ok(id), Ok(spec)) = (
        MetricId::try_from(stored.id.clone()),
        serde_json::from_str::<MetricSpec>(&stored.body),
    ) else {
        tracing::error!(id = stored.id, "unreadable metric definition skipped");
        return None;
    };
    Some(Arc::new(MetricDef {
        id,
        version: stored.version,
        spec,
    }))
}

/// A stored rule, parsed (as `parse_metric`).
fn parse_rule(stored: StoredDefinition) -> Option<Arc<(RuleDef, Rule)>> {
    #[derive(serde::Deserialize)]
    struct Body {
        expr: String,
    }
    let parsed = RuleId::try_from(stored.id.clone()).ok().and_then(|id| {
        let body: Body = serde_json::from_str(&stored.body).ok()?;
        let rule = rules::parse(&body.expr).ok()?;
        Some((id, body.expr, rule))
    });
    let Some((id, expr, rule)) = parsed else {
        tracing::error!(id = stored.id, "unreadable rule definition skipped");
        return None;
    };
    let def = RuleDef {
        id,
        version: stored.version,
        expr,
        metrics: rule.metrics().into_iter().collect(),
    };
    Some(Arc::new((def, rule)))
}

impl Definitions {
    fn add_metric(&mut self, def: Arc<MetricDef>) {
        let on_event = self.by_event.entry(def.spec.event.clone()).or_default();
        // In id order, as a load makes them.
        let at = on_event.partition_point(|d| d.id < def.id);
        on_event.insert(at, def.clone());
        self.metrics.insert(def.id.clone(), def);
    }

    fn remove_metric(&mut self, id: &MetricId) {
        let Some(old) = self.metrics.remove(id) else {
            return;
        };
        if let Some(on_event) = self.by_event.get_mut(&old.spec.event) {
            on_event.retain(|d| d.id != *id);
            if on_event.is_empty() {
                self.by_event.remove(&old.spec.event);
            }
        }
    }

    /// One definition as read again (`None`: deleted or unreadable).
    fn apply(&mut self, kind: DefinitionKind, id: &str, stored: Option<StoredDefinition>) {
        match kind {
            DefinitionKind::Metric => {
                if let Ok(id) = MetricId::try_from(id.to_owned()) {
                    self.remove_metric(&id);
                }
                if let Some(def) = stored.and_then(parse_metric) {
                    self.add_metric(def);
                }
            }
            DefinitionKind::Rule => {
                if let Ok(id) = RuleId::try_from(id.to_owned()) {
                    self.rules.remove(&id);
                }
                if let Some(rule) = stored.and_then(parse_rule) {
                    self.rules.insert(rule.0.id.clone(), rule);
                }
            }
        }
    }
}

/// Reads every definition, by `deadline`.
async fn load(
    store: &Instrumented<dyn DefinitionStore>,
    deadline: Deadline,
) -> Result<Definitions, StoreError> {
    let read = |kind| store.call(StoreOp::Definitions, deadline, move |s| s.definitions(kind));
    let mut d = Definitions::default();
    for def in read(DefinitionKind::Metric)
        .await?
        .into_iter()
        .filter_map(parse_metric)
    {
        d.add_metric(def);
    }
    for rule in read(DefinitionKind::Rule)
        .await?
        .into_iter()
        .filter_map(parse_rule)
    {
        d.rules.insert(rule.0.id.clone(), rule);
    }
    Ok(d)
}

/// What the change messages heard ask this instance to read again.
#[derive(Debug, PartialEq, Eq)]
enum Wanted {
    /// These definitions, each named by its message.
    These(std::collections::BTreeSet<(DefinitionKind, String)>),
    /// Every definition: a message from an older build, which names none, or more named
    /// at once than are worth reading one by one.
    All,
}

/// Most definitions read one by one after a burst of messages; more is one load of all.
const MOST_READ_ONE_BY_ONE: usize = 64;

/// What `first` and the messages `stream` already holds ask for (at most 10,000 taken: a
/// flood that never pauses still gets its reads); true if the stream ended.
fn wanted<S>(first: Invalidation, stream: &mut S) -> (Wanted, bool)
where
    S: futures::Stream<Item = Invalidation> + Unpin,
{
    let mut these = std::collections::BTreeSet::new();
    let mut all = false;
    let mut take = |m: Invalidation| match m {
        Invalidation::Definition { kind, id } => {
            these.insert((kind, id));
        }
        Invalidation::Definitions => all = true,
        _ => {}
    };
    take(first);
    let mut ended = false;
    for _ in 0..10_000 {
        match stream.next().now_or_never() {
            Some(Some(m)) => take(m),
            Some(None) => {
                ended = true;
                break;
            }
            None => break,
        }
    }
    if all || these.len() > MOST_READ_ONE_BY_ONE {
        (Wanted::All, ended)
    } else {
        (Wanted::These(these), ended)
    }
}

impl Velocity {
    /// Loads the definitions and starts listening for changes. Must run inside a Tokio
    /// runtime. The three stores are, outside tests, one backend seen through each trait.
    pub async fn new(
        counts: Arc<dyn MetricStore>,
        definitions: Arc<dyn DefinitionStore>,
        bus: Arc<dyn InvalidationBus>,
        settings: VelocitySettings,
        metrics: Arc<Metrics>,
    ) -> Result<Arc<Self>, StoreError> {
        let counts = Instrumented::new(counts, metrics.clone());
        let definitions = Instrumented::new(definitions, metrics.clone());
        let bus = Instrumented::new(bus, metrics.clone());
        let defs = load(&definitions, Deadline::after(settings.write_deadline)).await?;
        let v = Arc::new(Self {
            counts,
            definitions,
            bus,
            defs: RwLock::new(Arc::new(defs)),
            reloads: std::sync::atomic::AtomicU64::new(0),
            loaded: tokio::sync::Mutex::new(0),
            batch_turn: tokio::sync::Semaphore::new(1),
            settings,
            metrics,
            tasks: BackgroundTasks::default(),
        });
        let weak = Arc::downgrade(&v);
        let task = tokio::spawn(async move {
            let mut backoff = Duration::from_millis(20);
            loop {
                let Some(this) = weak.upgrade() else { return };
                let stream = unhurried(&this.bus, StoreOp::Subscribe, |b| b.subscribe()).await;
                drop(this);
                if let Ok(mut stream) = stream {
                    // Whatever changed while nobody listened.
                    if let Some(this) = weak.upgrade() {
                        this.reload().await;
                    }
                    backoff = Duration::from_millis(20);
                    loop {
                        // A periodic reload backs the subscription up.
                        let next =
                            tokio::time::timeout(Duration::from_secs(30), stream.next()).await;
                        let Some(this) = weak.upgrade() else { return };
                        match next {
                            Ok(Some(first)) => {
                                // What came while the last one was read is read with it.
                                let (wanted, ended) = wanted(first, &mut stream);
                                this.catch_up(wanted).await;
                                if ended {
                                    break;
                                }
                            }
                            Err(_) => this.reload().await,
                            Ok(None) => break,
                        }
                    }
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        });
        v.tasks.push(task);
        Ok(v)
    }

    /// Stops the definitions listener and waits until it has ended, as
    /// `NameLists::stop_background` does and for the same reason: a stopped instance reads
    /// nothing more. Later calls do nothing; dropping the service aborts it too.
    pub async fn stop_background(&self) {
        self.tasks.stop().await;
    }

    fn defs(&self) -> Arc<Definitions> {
        self.defs.read().expect("definitions lock").clone()
    }

    // ---- events ----

    /// Validates events and plans their updates; nothing touches the store.
    fn plan(
        &self,
        defs: &Definitions,
        events: &[EventInput],
        now: i64,
        path: EventPath<'_>,
    ) -> Result<(Vec<Planned>, Vec<bool>), ValidationError> {
        let mut planned = Vec::new();
        let mut late = vec![false; events.len()];
        for (i, e) in events.iter().enumerate() {
            let at = |what: &str| format!("{}{what}", path(i));
            let layout = self.counts.layout();
            // What an entity remembers of the event (keyed: an id may be an identifier).
            let hash =
                e.id.as_ref()
                    .map(|id| layout.event_hash(e.event_type.as_str(), id));
            let ts = e.ts.unwrap_or(now);
            if ts > now + MAX_FUTURE_MS {
                return Err(ValidationError::new(
                    ErrorCode::EventInFuture,
                    "more than 5 minutes in the future",
                )
                .at(at("ts")));
            }
            if ts < 0 {
                return Err(ValidationError::new(ErrorCode::InvalidTs, "before 1970").at(at("ts")));
            }
            if let Some(id) = &e.id
                && (id.is_empty() || id.len() > MAX_VALUE_LEN)
            {
                return Err(ValidationError::new(
                    ErrorCode::InvalidEventId,
                    format!("must be 1 to {MAX_VALUE_LEN} bytes"),
                )
                .at(at("id")));
            }
            for (name, v) in &e.fields {
                if v.text().len() > MAX_VALUE_LEN {
                    return Err(ValidationError::new(
                        ErrorCode::InvalidField,
                        format!("longer than {MAX_VALUE_LEN} bytes"),
                    )
                    .at(at(&format!("fields.{}", crate::domain::shown_key(name)))));
                }
            }
            let mut applicable = 0;
            let mut fresh = 0;
            let first = planned.len();
            for m in defs.by_event.get(&e.event_type).into_iter().flatten() {
                let Some(values) = group_values(&m.spec.group_by, &e.fields) else {
                    continue;
                };
                let value = match (&m.spec.field, m.spec.aggregation) {
                    (None, _) => 1,
                    (Some(f), agg) => match e.fields.get(f.as_str()) {
                        None => continue,
                        Some(v) if agg.numeric() => {
                            Amount::parse(v.text())
                                .map_err(|why| {
                                    ValidationError::new(
                                        ErrorCode::InvalidAmount,
                                        format!("{why} (metric {})", m.id),
                                    )
                                    .at(at(&format!("fields.{f}")))
                                })?
                                .0
                        }
                        // Distinct counts keep a keyed hash of the value, never the value.
                        Some(v) => layout.distinct_member(v.text()),
                    },
                };
                applicable += 1;
                if m.is_late(ts, now) {
                    continue;
                }
                fresh += 1;
                planned.push(Planned {
                    event: i,
                    key: layout.metric_key(m.id.as_str(), m.version, &values),
                    sub: m.sub(ts),
                    value,
                    metric: m.clone(),
                    mark: None,
                });
            }
            late[i] = applicable > 0 && fresh == 0;
            // Remembered while a replay could still count (the longest window of the metrics
            // it updates, and a sub-window), and never past the dedupe window.
            if let Some(hash) = hash {
                let ops = &mut planned[first..];
                let longest = ops
                    .iter()
                    .map(|p| (p.metric.slots() + 1) * p.metric.spec.resolution_ms)
                    .max()
                    .unwrap_or(0);
                let window =
                    i64::try_from(self.settings.dedupe_window.as_millis()).unwrap_or(i64::MAX);
                let mark = EventMark {
                    hash,
                    keep_until_ms: now.saturating_add(window).min(ts.saturating_add(longest)),
                    seq: u32::try_from(i).unwrap_or(u32::MAX),
                };
                for p in ops {
                    p.mark = Some(mark);
                }
            }
        }
        Ok((planned, late))
    }

    fn op(&self, m: &MetricDef, key: String, at: i64, now: i64) -> MetricOp {
        MetricOp {
            family: family(m.spec.aggregation),
            key,
            slots: m.slots(),
            resolution_ms: m.spec.resolution_ms,
            update: None,
            read_hi: m.sub(at),
            trim_hi: m.sub(now),
            cap: self.settings.distinct_cap,
            event: None,
            read: true,
        }
    }

    /// The op of a planned update; `read` to have its value back.
    fn update_op(&self, p: &Planned, now: i64, read: bool) -> MetricOp {
        MetricOp {
            update: Some((p.sub, p.value)),
            event: p.mark,
            read,
            ..self.op(&p.metric, p.key.clone(), now, now)
        }
    }

    /// Which events were replays: every one of their updates found the event already applied.
    fn duplicates(n: usize, planned: &[Planned], answers: &[MetricAnswer]) -> Vec<bool> {
        let mut dup = vec![None::<bool>; n];
        for (p, a) in planned.iter().zip(answers) {
            let d = dup[p.event].get_or_insert(true);
            *d &= a.duplicate;
        }
        dup.into_iter().map(|d| d.unwrap_or(false)).collect()
    }

    /// Applies a batch of events (at most 1,000): every update in one pipelined round trip,
    /// each exactly once per (event id, metric entity).
    pub async fn ingest(&self, events: &[EventInput]) -> Result<IngestOutcome, VelocityError> {
        check_event_count(events.len())?;
        let now = now_ms();
        let defs = self.defs();
        let (planned, late) = self.plan(&defs, events, now, &|i| format!("events[{i}]."))?;
        let ops: Vec<MetricOp> = planned
            .iter()
            .map(|p| self.update_op(p, now, false))
            .collect();
        let deadline = Deadline::after(self.settings.write_deadline);
        let answers = if ops.is_empty() {
            Vec::new()
        } else if ops.len() <= self.settings.limits.metrics_per_event {
            self.counts
                .call(StoreOp::Events, deadline, |s| s.metric_ops(&ops, deadline))
                .await?
        } else {
            self.in_waves(&planned, &ops, deadline).await?
        };
        let dup = Self::duplicates(events.len(), &planned, &answers);
        let outcome = IngestOutcome {
            applied: answers.iter().filter(|a| !a.duplicate).count() as u64,
            duplicates: dup.iter().filter(|d| **d).count() as u64,
            late: late.iter().filter(|l| **l).count() as u64,
        };
        let m = &self.metrics;
        m.events
            .with_label_values(&["applied"])
            .inc_by(outcome.applied);
        m.events
            .with_label_values(&["duplicate"])
            .inc_by(outcome.duplicates);
        m.events.with_label_values(&["late"]).inc_by(outcome.late);
        Ok(outcome)
    }

    /// A batch's updates, in waves of whole events of at most `WAVE_OPS` updates, each wave
    /// sent only when no other batch's is in flight on this instance (`batch_turn`, first
    /// come first served). So however many batches one client posts at once, Redis holds at
    /// most one wave of them at a time (~4 ms at 1,024 id-less updates), and a request that
    /// makes no more updates than one event may (`max_metrics_per_event`: the risk engine's
    /// single events, `evaluate`'s event, a few events at once), which `ingest` never makes
    /// wait for a turn, queues behind that at most. A batch that cannot have every wave sent by `deadline`
    /// is a 503 like any store failure, its earlier waves applied: a retry with event ids
    /// applies the rest once.
    async fn in_waves(
        &self,
        planned: &[Planned],
        ops: &[MetricOp],
        deadline: Deadline,
    ) -> Result<Vec<MetricAnswer>, StoreError> {
        let mut answers = Vec::with_capacity(ops.len());
        let of: Vec<usize> = planned.iter().map(|p| p.event).collect();
        for wave in waves(&of, WAVE_OPS) {
            let turn = tokio::time::timeout(deadline.remaining(), self.batch_turn.acquire()).await;
            let Ok(Ok(_turn)) = turn else {
                return Err(StoreError::Timeout(self.settings.write_deadline));
            };
            let part = &ops[wave];
            answers.extend(
                self.counts
                    .call(StoreOp::Events, deadline, |s| s.metric_ops(part, deadline))
                    .await?,
            );
        }
        Ok(answers)
    }

    // ---- features ----

    /// Read ops for `metrics` at `at` with `fields`; every group-by field must be present.
    fn read_ops(
        &self,
        defs: &Definitions,
        metrics: &[MetricId],
        fields: &Fields,
        at: i64,
        now: i64,
    ) -> Result<Vec<(Arc<MetricDef>, MetricOp)>, VelocityError> {
        if metrics.len() > MAX_NAMED {
            return Err(too_many("metrics", metrics.len()));
        }
        let mut out: Vec<(Arc<MetricDef>, MetricOp)> = Vec::with_capacity(metrics.len());
        for id in metrics {
            // A metric named twice is read once (a HyperLogLog's window can cost Redis
            // milliseconds: 64 names of one must not cost 64 times).
            if out.iter().any(|(m, _)| m.id == *id) {
                continue;
            }
            let m = defs
                .metrics
                .get(id)
                .ok_or_else(|| VelocityError::Invalid(undefined_metric(id)))?;
            let values = group_values(&m.spec.group_by, fields).ok_or_else(|| {
                let missing = m
                    .spec
                    .group_by
                    .iter()
                    .find(|g| !fields.contains_key(g.as_str()))
                    .expect("a missing field");
                ValidationError::new(
                    ErrorCode::MissingField,
                    format!("fields.{missing} is needed by metric {id} (grouped by it)"),
                )
            })?;
            let key = self
                .counts
                .layout()
                .metric_key(id.as_str(), m.version, &values);
            out.push((m.clone(), self.op(m, key, at, now)));
        }
        Ok(out)
    }

    /// The values of `metrics` for the entity `fields` at `at` (default now).
    pub async fn features(
        &self,
        metrics: &[MetricId],
        fields: &Fields,
        at: Option<i64>,
    ) -> Result<Features, VelocityError> {
        let now = now_ms();
        let defs = self.defs();
        let reads = self.read_ops(&defs, metrics, fields, at.unwrap_or(now), now)?;
        let ops: Vec<MetricOp> = reads.iter().map(|(_, op)| op.clone()).collect();
        let deadline = Deadline::after(self.settings.read_deadline);
        let readings: Vec<MetricReading> = self
            .counts
            .call(StoreOp::Features, deadline, |s| {
                s.metric_ops(&ops, deadline)
            })
            .await?
            .into_iter()
            .map(|a| a.reading.unwrap_or(MetricReading::Sum(0)))
            .collect();
        Ok(self.note_caps(features_of(
            reads.iter().map(|(m, _)| m.as_ref()).zip(readings),
        )))
    }

    /// Evaluates rules on feature numbers, without a list decision (a comparison of
    /// `decision` is false).
    pub fn evaluate_rules(
        &self,
        rules: &[RuleId],
        numbers: &BTreeMap<MetricId, Option<f64>>,
    ) -> BTreeMap<RuleId, bool> {
        self.evaluate_rules_deciding(rules, numbers, None)
    }

    /// Evaluates rules on feature numbers and the list `decision` of the request (`None`
    /// when it gave no precedence; see `rules`).
    pub fn evaluate_rules_deciding(
        &self,
        rules: &[RuleId],
        numbers: &BTreeMap<MetricId, Option<f64>>,
        decision: Decision<'_>,
    ) -> BTreeMap<RuleId, bool> {
        let defs = self.defs();
        rules
            .iter()
            .filter_map(|id| defs.rules.get(id).map(|r| (id, r)))
            .map(|(id, r)| {
                let value = |m: &MetricId| numbers.get(m).copied().flatten();
                (id.clone(), r.1.eval_with(&value, decision))
            })
            .collect()
    }

    /// The metrics the rules read, checking every rule exists.
    pub fn rule_metrics(&self, rules: &[RuleId]) -> Result<Vec<MetricId>, VelocityError> {
        if rules.len() > MAX_NAMED {
            return Err(too_many("rules", rules.len()));
        }
        let defs = self.defs();
        let mut out = Vec::new();
        for id in rules {
            let r = defs
                .rules
                .get(id)
                .ok_or_else(|| VelocityError::Invalid(undefined_rule(id)))?;
            out.extend(r.0.metrics.iter().cloned());
        }
        Ok(out)
    }

    /// The store work of `evaluate`: applies `event` (if any) and reads `metrics` for `fields`
    /// in one round trip (two with an event id), within the read deadline.
    pub async fn apply_and_read(
        &self,
        event: Option<&EventInput>,
        metrics: &[MetricId],
        fields: &Fields,
    ) -> Result<Features, VelocityError> {
        let now = now_ms();
        let defs = self.defs();
        let deadline = Deadline::after(self.settings.read_deadline);
        let events: Vec<EventInput> = event.into_iter().cloned().collect();
        let (planned, _) = self.plan(&defs, &events, now, &|_| "event.".to_owned())?;
        if metrics.len() > 2 * MAX_NAMED {
            return Err(too_many("metrics", metrics.len()));
        }
        let mut wanted: Vec<MetricId> = Vec::new();
        for m in metrics {
            if !wanted.contains(m) {
                wanted.push(m.clone());
            }
        }
        let reads = self.read_ops(&defs, &wanted, fields, now, now)?;
        // Updates read their value back: a metric the event updates for the same entity
        // needs no separate read. A replayed event's update is skipped but still reads.
        let mut ops: Vec<MetricOp> = Vec::with_capacity(planned.len() + reads.len());
        let mut answer_of: Vec<Option<usize>> = vec![None; reads.len()];
        for p in &planned {
            let read = reads.iter().any(|(_, op)| op.key == p.key);
            let idx = ops.len();
            ops.push(self.update_op(p, now, read));
            for (r, (_, op)) in reads.iter().enumerate() {
                if op.key == p.key && answer_of[r].is_none() {
                    answer_of[r] = Some(idx);
                }
            }
        }
        for (r, (_, op)) in reads.iter().enumerate() {
            if answer_of[r].is_none() {
                answer_of[r] = Some(ops.len());
                ops.push(op.clone());
            }
        }
        let answers = self
            .counts
            .call(StoreOp::Evaluate, deadline, |s| {
                s.metric_ops(&ops, deadline)
            })
            .await?;
        let dup = Self::duplicates(events.len(), &planned, &answers[..planned.len()]);
        let m = &self.metrics;
        m.events.with_label_values(&["applied"]).inc_by(
            answers[..planned.len()]
                .iter()
                .filter(|a| !a.duplicate)
                .count() as u64,
        );
        m.events
            .with_label_values(&["duplicate"])
            .inc_by(dup.iter().filter(|d| **d).count() as u64);
        Ok(self.note_caps(features_of(reads.iter().zip(&answer_of).map(
            |((m, _), i)| {
                let a = answers[i.expect("every read answered")];
                (m.as_ref(), a.reading.unwrap_or(MetricReading::Sum(0)))
            },
        ))))
    }

    /// Counts and logs distinct counts read at their cap.
    fn note_caps(&self, f: Features) -> Features {
        if !f.capped.is_empty() {
            self.metrics.distinct_capped.inc_by(f.capped.len() as u64);
            tracing::warn!(
                metrics = ?f.capped,
                cap = self.settings.distinct_cap,
                "distinct counts at their member cap: the true count may be higher"
            );
        }
        f
    }
}

/// The group-by values in order, or `None` if one is missing.
fn group_values<'a>(group_by: &[FieldName], fields: &'a Fields) -> Option<Vec<&'a str>> {
    group_by
        .iter()
        .map(|g| fields.get(g.as_str()).map(FieldValue::text))
        .collect()
}

/// Feature values (API.md: counts and sums 0 when nothing was seen; AVG, MIN, MAX null).
fn features_of<'a>(readings: impl Iterator<Item = (&'a MetricDef, MetricReading)>) -> Features {
    let mut f = Features::default();
    let scale = AMOUNT_SCALE as f64;
    for (m, r) in readings {
        let (json, number) = match (m.spec.aggregation, r) {
            (Aggregation::Count, MetricReading::Sum(n)) => (Json::from(n), Some(n as f64)),
            (Aggregation::Sum, MetricReading::Sum(s)) => (amount_json(s), Some(s as f64 / scale)),
            (Aggregation::Avg, MetricReading::Avg { count: 0, .. }) => (Json::Null, None),
            (Aggregation::Avg, MetricReading::Avg { sum, count }) => {
                let avg = sum as f64 / count as f64 / scale;
                (Json::from(avg), Some(avg))
            }
            (_, MetricReading::Extreme(Some(v))) => (amount_json(v), Some(v as f64 / scale)),
            (_, MetricReading::Extreme(None)) => (Json::Null, None),
            (_, MetricReading::Distinct { count, capped }) => {
                if capped {
                    f.capped.push(m.id.clone());
                }
                (Json::from(count), Some(count as f64))
            }
            (agg, other) => {
                tracing::error!(?agg, ?other, "a reading of the wrong kind");
                (Json::Null, None)
            }
        };
        f.values.insert(m.id.clone(), json);
        f.numbers.insert(m.id.clone(), number);
    }
    f
}

#[cfg(test)]
mod tests {
    use super::waves;

    /// Waves keep each event whole and stay within their size, but for an event larger
    /// than a wave, which goes alone.
    #[test]
    fn waves_cut_between_events() {
        let of = [0, 0, 0, 1, 1, 2, 2, 2, 2, 3];
        assert_eq!(waves(&of, 5), [0..5, 5..10]);
        assert_eq!(waves(&of, 4), [0..3, 3..5, 5..9, 9..10]);
        assert_eq!(waves(&of, 3), [0..3, 3..5, 5..9, 9..10], "event 2 alone");
        assert_eq!(waves(&of, 100), vec![0..10]);
        assert!(waves(&[], 4).is_empty());
        let many: Vec<usize> = (0..1_000).flat_map(|e| [e; 5]).collect();
        let cut = waves(&many, 1_024);
        assert_eq!(cut.len(), 5);
        assert!(cut.iter().all(|w| w.len() <= 1_024 && w.len() % 5 == 0));
        assert_eq!(cut.last().unwrap().end, 5_000);
    }
}
