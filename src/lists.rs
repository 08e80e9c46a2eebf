//! The name-list service: upsert, delete, look up and check entries, on any `EntryStore`.
//!
//! Everything that decides *what is listed* lives here, once for every backend: expiry (an
//! expired field answers "absent" and is deleted off the request path by compare-and-delete,
//! so a refresh that raced it survives), IP ranges (one probe per registered prefix length),
//! the local tier in front of the store (`tier`), the deadlines and the
//! fail-open/fail-closed policy.
//!
//! A check asks the local tier first: a lookup whose bucket is held and in sync is answered
//! in memory, listed or not; the others go to the store in one pipelined round trip.
//!
//! Deadlines: a check's store work (registry and lookups together) gets `check_deadline`;
//! when it is missed or the store fails, fail-open answers from whatever the tier holds with
//! `degraded: true` and `stale_ms` (how long since those copies were last known in sync), and
//! fail-closed refuses (503). A write gets `write_deadline` and is acknowledged only if the
//! store took it; whatever the outcome, the tier reads the buckets it touched again (and
//! answers them from the store until then), since a write that timed out may still have
//! landed.
//!
//! The operators' reads are bounded whatever the keyspace holds: `summaries` is one page of
//! the store's counts (at most `MAX_LISTS_LIMIT` pairs, O(log n + page) in the store, one
//! hash-map lookup per pair for its hits), and `lookup_everywhere` reads the lists of one
//! sandbox only, at most `MAX_LOOKUP_LISTS` of them, and says when there were more.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::domain::{
    Dimension, ErrorCode, Expiry, ListName, Norm, PhoneRegions, Rules, Sandbox, ValidationError,
    Value, mask_value, now_ms,
};
use crate::instrumented::Instrumented;
use crate::metrics::{Metrics, StoreOp};
use crate::store::{
    AuditOp, AuditRecord, CountChange, CountsQuery, Deadline, EntryKey, EntryStore,
    InvalidationBus, PrefixKind, PrefixLen, Scope, StoreError, WriteBatch, code_is_live,
};
use crate::tier::{LocalTier, Lookup, RegistryCache, TierSettings};

/// Most entries in one upsert or delete request.
pub const MAX_ENTRIES_PER_REQUEST: usize = 10_000;
/// Most subject values in one check.
pub const MAX_CHECK_VALUES: usize = 64;
/// Most lists in one check.
pub const MAX_CHECK_LISTS: usize = 16;
/// Most lookups (values × lists × prefix lengths) one check may fan out to.
pub const MAX_CHECK_PROBES: usize = 4096;
/// Longest `reason`, in bytes.
pub const MAX_REASON_LEN: usize = 256;
/// (list, sandbox) pairs per page of `GET /v1/lists` when `limit` is not given.
pub const DEFAULT_LISTS_LIMIT: usize = 100;
/// Most (list, sandbox) pairs per page of `GET /v1/lists`.
pub const MAX_LISTS_LIMIT: usize = 1_000;
/// Most lists of one sandbox a lookup on every list reads (`lookup_everywhere`), the first
/// ones by name: past it, the answer says `truncated`. 1,000 lists are 63 checks.
pub const MAX_LOOKUP_LISTS: usize = 1_000;

/// What to do when the store cannot answer a check in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum FailMode {
    /// Answer from the local tier alone, flagged `degraded: true`.
    #[default]
    Open,
    /// Answer 503.
    Closed,
}

/// Tuning of the service.
#[derive(Debug, Clone)]
pub struct ListSettings {
    pub check_deadline: Duration,
    /// Deadline of operators' reads (lookups, list counts): they run on the operator lane.
    pub operator_deadline: Duration,
    pub write_deadline: Duration,
    pub fail_mode: FailMode,
    /// The local tier's `TierSettings::ttl`; also the registry cache's TTL.
    pub cache_ttl: Duration,
    /// Most buckets the local tier holds; 0 turns it off.
    pub cache_capacity: u64,
    /// The local tier's memory budget, in bytes; 0 turns it off.
    pub local_memory_bytes: u64,
    /// Background bucket reads per second (loading, refreshing); 0: unpaced.
    pub local_fetch_rate: u64,
    /// The tier's safety-net re-reads per second (`TierSettings::refresh_rate`).
    pub local_refresh_rate: u64,
    /// Where phone numbers without a country code are from, by sandbox (rules 2).
    pub phone_regions: PhoneRegions,
}

/// Why a name-list operation failed.
#[derive(Debug, thiserror::Error)]
pub enum ListsError {
    #[error(transparent)]
    Invalid(#[from] ValidationError),
    #[error(transparent)]
    Unavailable(#[from] StoreError),
}

/// One entry to upsert.
#[derive(Debug, Clone)]
pub struct NewEntry {
    pub dimension: Dimension,
    pub value: Value,
    pub sandbox: Sandbox,
    pub expiry: Expiry,
    pub reason: Option<String>,
}

/// One entry to delete or look up.
#[derive(Debug, Clone)]
pub struct EntryRef {
    pub dimension: Dimension,
    pub value: Value,
    pub sandbox: Sandbox,
}

/// A check: every subject value against every list, in one sandbox. Built only through
/// `TryFrom<RawCheck>`, which checks the limits (1 to `MAX_CHECK_LISTS` lists, at most
/// `MAX_CHECK_VALUES` values) once, before parsing anything, so a `CheckQuery` in hand is
/// within them.
#[derive(Debug, Clone)]
pub struct CheckQuery {
    sandbox: Sandbox,
    /// Distinct, in the order given.
    lists: Vec<ListName>,
    /// Values per dimension, each normalised for a check and distinct within its dimension.
    subjects: Vec<(Dimension, Vec<Value>)>,
    /// The allow-list precedence asked for, as indices into `lists`, distinct, in order.
    precedence: Option<Vec<usize>>,
    /// The values that failed their dimension's rule (not strict): reported, not looked up.
    invalid: Vec<InvalidValue>,
}

/// A subject value a check could not look up because it fails its dimension's rule: where it
/// was (`dimension`, `index` within that dimension's values as sent) and why. The message
/// never quotes the value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct InvalidValue {
    /// The dimension as named in the request.
    pub dimension: String,
    pub index: usize,
    /// `invalid_value`.
    pub code: &'static str,
    pub message: String,
}

impl CheckQuery {
    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    pub fn lists(&self) -> &[ListName] {
        &self.lists
    }

    /// Values per dimension, in the order given.
    pub fn subjects(&self) -> &[(Dimension, Vec<Value>)] {
        &self.subjects
    }

    /// The values left out because they fail their dimension's rule (never when strict).
    pub fn invalid(&self) -> &[InvalidValue] {
        &self.invalid
    }

    /// Adds an allow-list precedence (`["white", "black"]`): the answer then says which
    /// list decides, the first of this order with a hit. Every name must be one of the
    /// check's lists; one given twice counts at its first place. Errors name the place
    /// (`precedence[1]`).
    pub fn with_precedence(mut self, raw: Vec<String>) -> Result<Self, ValidationError> {
        if raw.is_empty() || raw.len() > MAX_CHECK_LISTS {
            return Err(ValidationError::new(
                ErrorCode::InvalidLists,
                format!("precedence must name 1 to {MAX_CHECK_LISTS} of the lists checked"),
            ));
        }
        let mut order = Vec::with_capacity(raw.len());
        for (i, l) in raw.into_iter().enumerate() {
            let at = || format!("precedence[{i}]");
            let l = ListName::try_from(l).map_err(|e| e.at(at()))?;
            let Some(index) = self.lists.iter().position(|x| *x == l) else {
                return Err(ValidationError::new(
                    ErrorCode::InvalidLists,
                    format!("list {l} is not in lists: precedence orders lists the check names"),
                )
                .at(at()));
            };
            if !order.contains(&index) {
                order.push(index);
            }
        }
        self.precedence = Some(order);
        Ok(self)
    }

    /// The precedence asked for, if any: list names, first first.
    pub fn precedence(&self) -> Option<Vec<&ListName>> {
        self.precedence
            .as_ref()
            .map(|order| order.iter().map(|&i| &self.lists[i]).collect())
    }
}

/// A check as received, nothing parsed yet: the sandbox (`None`: the default), list names,
/// and per dimension name its values.
#[derive(Debug, Clone, Default)]
pub struct RawCheck {
    pub sandbox: Option<String>,
    pub lists: Vec<String>,
    pub subjects: Vec<(String, Vec<String>)>,
    /// A value that fails its dimension's rule is a 400 for the whole check; otherwise it is
    /// left out and reported in the answer's `invalid`, and every other value is checked.
    pub strict: bool,
    /// How values are normalised (`NameLists::rules`; the default: a new keyspace's).
    pub rules: Rules,
}

impl TryFrom<RawCheck> for CheckQuery {
    type Error = ValidationError;

    /// Parses and normalises the whole check; lists and values of one dimension are
    /// deduplicated. Errors name the place (`subjects.phone[2]`). A value that fails its
    /// dimension's rule is an error only when `strict`: otherwise it is set aside in
    /// `invalid` (one form field an attacker controls must not turn off every list of the
    /// request). A bad list, sandbox or dimension name, or the limits, are always errors.
    fn try_from(raw: RawCheck) -> Result<Self, Self::Error> {
        // Sizes first: nothing is parsed (or deduplicated) past the limits.
        if raw.lists.is_empty() || raw.lists.len() > MAX_CHECK_LISTS {
            return Err(ValidationError::new(
                ErrorCode::InvalidLists,
                format!("lists must name 1 to {MAX_CHECK_LISTS} lists"),
            ));
        }
        let total: usize = raw.subjects.iter().map(|(_, v)| v.len()).sum();
        if total > MAX_CHECK_VALUES {
            return Err(ValidationError::new(
                ErrorCode::TooManyValues,
                format!("subjects hold {total} values; at most {MAX_CHECK_VALUES} per check"),
            ));
        }
        let sandbox = Sandbox::parse_or_default(raw.sandbox).map_err(|e| e.at("sandbox"))?;
        let mut lists = Vec::with_capacity(raw.lists.len());
        for (i, l) in raw.lists.into_iter().enumerate() {
            let l = ListName::try_from(l).map_err(|e| e.at(format!("lists[{i}]")))?;
            if !lists.contains(&l) {
                lists.push(l);
            }
        }
        let strict = raw.strict;
        let norm = raw.rules.norm(&sandbox);
        let mut invalid = Vec::new();
        let mut subjects = Vec::with_capacity(raw.subjects.len());
        for (name, raw) in raw.subjects {
            let dimension = Dimension::try_from(name.clone())
                .map_err(|e| e.at(format!("subjects.{}", crate::domain::shown_key(&name))))?;
            let mut parsed: Vec<Value> = Vec::with_capacity(raw.len());
            for (i, v) in raw.iter().enumerate() {
                let v = match Value::parse_check_with(&dimension, v, norm) {
                    Ok(v) => v,
                    Err(e) if !strict => {
                        invalid.push(InvalidValue {
                            dimension: dimension.to_string(),
                            index: i,
                            code: e.code.as_str(),
                            message: e.message,
                        });
                        continue;
                    }
                    Err(e) => return Err(e.at(format!("subjects.{name}[{i}]"))),
                };
                if !parsed.contains(&v) {
                    parsed.push(v);
                }
            }
            subjects.push((dimension, parsed));
        }
        Ok(CheckQuery {
            sandbox,
            lists,
            subjects,
            precedence: None,
            invalid,
        })
    }
}

/// One listed value a check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Hit {
    #[schema(value_type = String)]
    pub list: ListName,
    #[schema(value_type = String)]
    pub dimension: Dimension,
    /// The listed value as normalised; for a range hit, the range.
    pub value: String,
    pub expires_at: Option<i64>,
}

/// One (list, sandbox) of `GET /v1/lists`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ListSummary {
    pub list: String,
    pub sandbox: String,
    /// Approximate: entries written minus entries deleted (docs/behaviour.md, *Operators' reads*).
    pub entries: i64,
    /// Unix ms of the last upsert or delete in this scope.
    pub last_change: i64,
    /// Hits this instance answered since it started.
    pub hits: u64,
}

/// The query string of `GET /v1/lists`, as sent (every field checked by `ListsQuery`; an
/// empty one is as good as absent).
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct RawListsQuery {
    /// Only this list.
    pub list: Option<String>,
    /// Only this sandbox.
    pub sandbox: Option<String>,
    /// 1 to 1,000 (default 100).
    pub limit: Option<String>,
    /// A `next_cursor` as given.
    pub cursor: Option<String>,
}

/// A checked `GET /v1/lists` query: the filters, the page size, and the pair the page
/// starts after (from the cursor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListsQuery {
    list: Option<ListName>,
    sandbox: Option<Sandbox>,
    limit: usize,
    after: Option<Scope>,
}

/// The cursor of the page after the pair `(list, sandbox)`: `<list>:<sandbox>`. Neither
/// alphabet holds `:`, so it reads back unambiguously; a caller who edits it only moves
/// where their own page starts.
fn cursor_after(list: &str, sandbox: &str) -> String {
    format!("{list}:{sandbox}")
}

fn parse_cursor(cursor: &str) -> Option<Scope> {
    let (list, sandbox) = cursor.split_once(':')?;
    scope(list, sandbox)
}

/// The scope of a list and a sandbox as the store gives them back.
fn scope(list: &str, sandbox: &str) -> Option<Scope> {
    Some(Scope {
        list: list.parse().ok()?,
        sandbox: sandbox.parse().ok()?,
    })
}

impl TryFrom<RawListsQuery> for ListsQuery {
    type Error = ValidationError;

    /// Errors name the parameter: `invalid_list`, `invalid_sandbox`, `invalid_filter` (the
    /// limit), `invalid_cursor`.
    fn try_from(raw: RawListsQuery) -> Result<Self, Self::Error> {
        let given = |v: Option<String>| v.filter(|v| !v.is_empty());
        let list = given(raw.list)
            .map(ListName::try_from)
            .transpose()
            .map_err(|e| e.at("list"))?;
        let sandbox = given(raw.sandbox)
            .map(Sandbox::try_from)
            .transpose()
            .map_err(|e| e.at("sandbox"))?;
        let limit = match given(raw.limit) {
            None => DEFAULT_LISTS_LIMIT,
            Some(l) => l
                .parse::<usize>()
                .ok()
                .filter(|l| (1..=MAX_LISTS_LIMIT).contains(l))
                .ok_or_else(|| {
                    ValidationError::new(
                        ErrorCode::InvalidFilter,
                        format!("limit: expected 1 to {MAX_LISTS_LIMIT}"),
                    )
                })?,
        };
        let after = given(raw.cursor)
            .map(|c| {
                parse_cursor(&c).ok_or_else(|| {
                    ValidationError::new(
                        ErrorCode::InvalidCursor,
                        "cursor: not a cursor this service handed out (use next_cursor as given)",
                    )
                })
            })
            .transpose()?;
        Ok(Self {
            list,
            sandbox,
            limit,
            after,
        })
    }
}

/// A page of `GET /v1/lists`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct ListsPage {
    /// In (list, sandbox) order.
    pub lists: Vec<ListSummary>,
    /// The `cursor` of the next page; `null` after the last one.
    pub next_cursor: Option<String>,
}

/// The answer of a lookup on every list of a sandbox (`NameLists::lookup_everywhere`): a
/// check's, and `truncated: true` when the sandbox has more lists than it read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct EverywhereOutcome {
    #[serde(flatten)]
    pub check: CheckOutcome,
    /// Only when true (no key otherwise): the sandbox has more than 1,000 lists holding
    /// entries and only the first 1,000 by name were looked at.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    #[schema(required = false)]
    pub truncated: bool,
}

/// A check's answer. `stale_ms` only in degraded answers; `decision` only when the check
/// gave a `precedence`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct CheckOutcome {
    pub hits: Vec<Hit>,
    /// The store did not answer in time and the local tier answered alone.
    pub degraded: bool,
    /// Degraded answers only: `stale_ms`.
    #[serde(flatten)]
    #[schema(inline)]
    pub stale: Option<Staleness>,
    /// Degraded answers only, when some lookups could not be made: the subject values they
    /// were for, of which nothing is claimed (absent otherwise).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(required = false)]
    pub unanswered: Vec<Unanswered>,
    /// Only when the check gave a `precedence`: the first list of that order with a hit
    /// (`Some(None)`, sent as `null`, when none had one). Without one there is no `decision`
    /// key at all, so such answers are byte for byte what they were before it existed.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, required = false)]
    pub decision: Option<Option<ListName>>,
    /// Only when some subject values fail their dimension's rule (and the check was not
    /// `strict`): those values, not looked up; every other value was.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    #[schema(required = false)]
    pub invalid: Vec<InvalidValue>,
}

impl CheckOutcome {
    /// The decision as rules read it (`rules::Decision`).
    pub fn decision(&self) -> Option<Option<&ListName>> {
        self.decision.as_ref().map(Option::as_ref)
    }
}

/// How old a fail-open answer may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Staleness {
    /// Milliseconds since the local copies it used were last known in sync (the oldest of
    /// them): every lookup the answer made reflects a state no older than this. `None`
    /// (null) when it made none (the tier off, or nothing held: see `unanswered`).
    pub stale_ms: Option<u64>,
}

struct Probe {
    list: usize,
    dimension: usize,
    /// The value's index within its dimension's values.
    value: usize,
    shown: String,
    key: EntryKey,
}

/// A subject value a degraded answer could not look up (no local copy of its bucket, or of
/// the registry of lengths its ranges, segments or domains need): nothing is claimed of it,
/// listed or not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Unanswered {
    #[schema(value_type = String)]
    pub dimension: Dimension,
    /// Its index within that dimension's values, as in the request.
    pub index: usize,
}

/// The name-list service of one instance.
pub struct NameLists {
    store: Instrumented<dyn EntryStore>,
    cache: Arc<LocalTier>,
    registries: Arc<RegistryCache>,
    settings: ListSettings,
    metrics: Arc<Metrics>,
    expired: mpsc::Sender<(EntryKey, u32, Scope)>,
    /// Hits answered by checks since this instance started, per scope (`GET /v1/lists`).
    hits: std::sync::Mutex<HashMap<Scope, u64>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for NameLists {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl NameLists {
    /// Builds the service and starts its background tasks (invalidation listener, the local
    /// tier's worker, lazy expiry); they stop when it is dropped. Must run inside a Tokio
    /// runtime. The embedded store gets no tier: it is in memory already. `bus` is where the
    /// tier hears of other instances' writes (outside tests, the same backend as `store`).
    pub fn new(
        store: Arc<dyn EntryStore>,
        bus: Arc<dyn InvalidationBus>,
        settings: ListSettings,
        metrics: Arc<Metrics>,
    ) -> Self {
        let store = Instrumented::new(store, metrics.clone());
        let bus = Instrumented::new(bus, metrics.clone());
        let cache = LocalTier::new(
            store.layout().buckets(),
            TierSettings {
                budget_bytes: settings.local_memory_bytes,
                max_buckets: settings.cache_capacity,
                ttl: settings.cache_ttl,
                fetch_rate: settings.local_fetch_rate,
                refresh_rate: settings.local_refresh_rate,
                conflict_window: settings.write_deadline + Duration::from_secs(1),
            },
            !store.inner().in_process(),
        );
        let registries = RegistryCache::new(settings.cache_ttl);
        let (expired, rx) = mpsc::channel(4096);
        let marks = Arc::new(crate::invalidation::Marks::default());
        let tasks = vec![
            tokio::spawn(cache.clone().run(store.clone(), metrics.tier.clone())),
            tokio::spawn(crate::invalidation::watch_keyspace(bus.clone())),
            tokio::spawn(crate::invalidation::follow_log(
                bus.clone(),
                marks.clone(),
                cache.clone(),
                metrics.clone(),
                settings.write_deadline + Duration::from_secs(1),
            )),
            tokio::spawn(crate::invalidation::listen(
                bus,
                cache.clone(),
                registries.clone(),
                metrics.clone(),
                marks,
                // The longest a write's message may follow its records (its deadline), and
                // a second: the same as the conflict window.
                settings.write_deadline + Duration::from_secs(1),
            )),
            tokio::spawn(reclaim_expired(
                store.clone(),
                cache.clone(),
                rx,
                settings.write_deadline,
                metrics.clone(),
            )),
        ];
        Self {
            store,
            cache,
            registries,
            settings,
            metrics,
            expired,
            hits: std::sync::Mutex::new(HashMap::new()),
            tasks,
        }
    }

    /// The store itself, uninstrumented (tests; the service calls it through `Instrumented`).
    pub fn store(&self) -> &Arc<dyn EntryStore> {
        self.store.inner()
    }

    /// Whether the store answers within `within` (`/readyz`).
    pub async fn ping(&self, within: Duration) -> Result<(), StoreError> {
        self.store
            .call(StoreOp::Ping, Deadline::after(within), |s| s.ping())
            .await
    }

    /// The local tier (its trust state, mode and copies).
    pub fn cache(&self) -> &Arc<LocalTier> {
        &self.cache
    }

    pub fn settings(&self) -> &ListSettings {
        &self.settings
    }

    /// How values are normalised: the keyspace's rules, the sandboxes' phone regions.
    pub fn rules(&self) -> Rules {
        Rules {
            version: self.store.layout().rules(),
            regions: self.settings.phone_regions.clone(),
        }
    }

    /// How values of `sandbox` are normalised.
    pub fn norm(&self, sandbox: &Sandbox) -> Norm {
        self.settings
            .phone_regions
            .norm(self.store.layout().rules(), sandbox)
    }

    /// Queues an expired field for compare-and-delete, off the request path. If the queue is
    /// full the field stays; the next read that finds it queues it again.
    fn reclaim(&self, key: EntryKey, code: u32, scope: impl FnOnce() -> Scope) {
        let _ = self.expired.try_send((key, code, scope()));
    }

    /// Adds `changes` to the lists' approximate counts, after a write the store took. A
    /// failure is logged and counted, not returned: the write itself stands, only the count
    /// is off by that much.
    async fn count(&self, changes: Vec<CountChange>, at_ms: i64) {
        if changes.is_empty() || self.store.inner().counts_itself() {
            return;
        }
        let deadline = Deadline::after(self.settings.write_deadline);
        let r = self
            .store
            .call(StoreOp::Counts, deadline, |s| {
                s.count_changes(&changes, at_ms, deadline)
            })
            .await;
        if r.is_err() {
            self.metrics.count_errors.inc();
        }
    }

    /// Upserts entries of `list` (last write wins). Returns how many were written.
    pub async fn upsert(
        &self,
        list: &ListName,
        entries: Vec<NewEntry>,
        actor: &str,
    ) -> Result<usize, ListsError> {
        if entries.len() > MAX_ENTRIES_PER_REQUEST {
            return Err(too_many_entries(entries.len()).into());
        }
        let layout = self.store.layout();
        let now = now_ms();
        let mut batch = WriteBatch::default();
        let mut scopes: HashSet<Scope> = HashSet::new();
        for e in &entries {
            let key = layout.entry_key(list, &e.dimension, &e.sandbox, &e.value);
            batch.entries.push((key, e.expiry.code()));
            let scope = Scope::new(list, &e.sandbox);
            batch.scopes.push(scope.clone());
            if let Some(len) = PrefixLen::of(&e.value) {
                if !batch.prefixes.contains(&(scope.clone(), len)) {
                    batch.prefixes.push((scope.clone(), len));
                }
                scopes.insert(scope);
            }
            batch.audit.push(AuditRecord::entry(
                now,
                actor,
                AuditOp::Upsert,
                list,
                &e.dimension,
                &e.sandbox,
                e.expiry.expires_at_ms(),
                e.reason.as_deref(),
                &key,
                layout.audit_value(&e.dimension, &e.value),
                mask_value(&e.dimension, &e.value),
            ));
        }
        let keys: Vec<EntryKey> = batch.entries.iter().map(|(k, _)| *k).collect();
        let changes: Vec<(EntryKey, Option<u32>)> =
            batch.entries.iter().map(|(k, c)| (*k, Some(*c))).collect();
        let deadline = Deadline::after(self.settings.write_deadline);
        let mark = self.cache.write_mark();
        let result = self
            .store
            .call(StoreOp::Write, deadline, |s| s.write(batch, deadline))
            .await;
        // Read-your-writes: acknowledged (its message atomic with it), the change is applied
        // here at once; otherwise (an error may still have landed, or messages may overtake
        // writes) its buckets are answered by the store until read again.
        match &result {
            Ok(_) if self.store.inner().atomic_messages() => self.cache.wrote_acked(&changes, mark),
            Ok(_) => {
                self.cache.remember_own(&changes);
                self.cache.wrote(&keys, mark);
            }
            Err(_) => self.cache.wrote(&keys, mark),
        }
        if !scopes.is_empty() {
            self.registries
                .invalidate(&scopes.into_iter().collect::<Vec<_>>())
                .await;
        }
        let created = result?;
        let mut deltas: HashMap<&Sandbox, i64> = HashMap::new();
        for (e, new) in entries
            .iter()
            .zip(created.iter().chain(std::iter::repeat(&false)))
        {
            *deltas.entry(&e.sandbox).or_default() += i64::from(*new);
        }
        let changes = deltas
            .into_iter()
            .map(|(sandbox, delta)| CountChange {
                scope: Scope::new(list, sandbox),
                delta,
            })
            .collect();
        self.count(changes, now).await;
        self.metrics.entries_written.inc_by(entries.len() as u64);
        tracing::info!(%list, count = entries.len(), actor, "entries upserted");
        // Each entry by its (keyed) fingerprint, the audit trail's join key; never the value.
        for (e, key) in entries.iter().zip(&keys) {
            tracing::debug!(%list, dimension = %e.dimension, fingerprint = %key.fingerprint(), "entry upserted");
        }
        Ok(entries.len())
    }

    /// Deletes entries of `list`. Returns how many were present and live.
    pub async fn remove(
        &self,
        list: &ListName,
        entries: Vec<EntryRef>,
        actor: &str,
    ) -> Result<usize, ListsError> {
        if entries.len() > MAX_ENTRIES_PER_REQUEST {
            return Err(too_many_entries(entries.len()).into());
        }
        let layout = self.store.layout();
        let now = now_ms();
        let mut keys = Vec::with_capacity(entries.len());
        let mut audit = Vec::with_capacity(entries.len());
        for e in &entries {
            let key = layout.entry_key(list, &e.dimension, &e.sandbox, &e.value);
            keys.push(key);
            audit.push(AuditRecord::entry(
                now,
                actor,
                AuditOp::Delete,
                list,
                &e.dimension,
                &e.sandbox,
                None,
                None,
                &key,
                layout.audit_value(&e.dimension, &e.value),
                mask_value(&e.dimension, &e.value),
            ));
        }
        // The same entry twice in one request is removed once.
        let mut seen = HashSet::new();
        let unique: Vec<EntryKey> = keys.iter().copied().filter(|k| seen.insert(*k)).collect();
        let deadline = Deadline::after(self.settings.write_deadline);
        let mark = self.cache.write_mark();
        let result = self
            .store
            .call(StoreOp::Remove, deadline, |s| {
                s.remove(&unique, now, audit, deadline)
            })
            .await;
        if result.is_ok() {
            let gone: Vec<(EntryKey, Option<u32>)> = unique.iter().map(|k| (*k, None)).collect();
            self.cache.remember_own(&gone);
        }
        self.cache.wrote(&unique, mark);
        let flags = result?;
        let removed = flags.iter().filter(|r| r.was_live()).count();
        // What was there, expired or not, was counted: subtract it from its scope.
        let mut deltas: HashMap<EntryKey, &Sandbox> = HashMap::new();
        for (e, key) in entries.iter().zip(&keys) {
            deltas.entry(*key).or_insert(&e.sandbox);
        }
        let mut by_scope: HashMap<&Sandbox, i64> = HashMap::new();
        for (key, found) in unique.iter().zip(&flags) {
            if let Some(sandbox) = deltas.get(key) {
                *by_scope.entry(sandbox).or_default() -= i64::from(found.was_present());
            }
        }
        let changes = by_scope
            .into_iter()
            .map(|(sandbox, delta)| CountChange {
                scope: Scope::new(list, sandbox),
                delta,
            })
            .collect();
        self.count(changes, now).await;
        self.metrics.entries_removed.inc_by(removed as u64);
        tracing::info!(%list, requested = entries.len(), removed, actor, "entries deleted");
        for (key, found) in unique.iter().zip(&flags) {
            tracing::debug!(%list, fingerprint = %key.fingerprint(), removed = found.was_live(), "entry deleted");
        }
        Ok(removed)
    }

    /// Looks one entry up in the store itself (no cache): the operator's view. `Some(expiry)`
    /// when listed.
    pub async fn lookup(
        &self,
        list: &ListName,
        entry: &EntryRef,
    ) -> Result<Option<Expiry>, ListsError> {
        let key =
            self.store
                .layout()
                .entry_key(list, &entry.dimension, &entry.sandbox, &entry.value);
        let deadline = Deadline::after(self.settings.operator_deadline);
        let keys = [key];
        let codes = self
            .store
            .call(StoreOp::Get, deadline, |s| s.get_many(&keys))
            .await?;
        match codes.first().copied().flatten() {
            Some(code) if code_is_live(code, now_ms()) => Ok(Some(Expiry::from_code(code))),
            Some(code) => {
                self.reclaim(key, code, || Scope::new(list, &entry.sandbox));
                Ok(None)
            }
            None => Ok(None),
        }
    }

    /// Checks every subject value against every list (the query is within the limits by
    /// construction; only the fan-out over IP prefix lengths in use is checked here), and
    /// counts its hits (`namelist_list_hits_total`, `GET /v1/lists`).
    pub async fn check(&self, q: &CheckQuery) -> Result<CheckOutcome, ListsError> {
        let outcome = self.answer(q, self.settings.check_deadline).await?;
        if !outcome.hits.is_empty() {
            let mut hits = self.hits.lock().unwrap_or_else(|e| e.into_inner());
            for h in &outcome.hits {
                *hits.entry(Scope::new(&h.list, &q.sandbox)).or_default() += 1;
                self.metrics.list_hit(h.list.as_str(), h.dimension.as_str());
            }
        }
        Ok(outcome)
    }

    /// One page of the (list, sandbox) pairs holding entries, by list then sandbox, with
    /// their approximate counts (see `EntryStore::list_counts`) and the hits this instance
    /// answered. Cost: the store's page, O(log n + limit), and one hash-map lookup per pair.
    pub async fn summaries(&self, q: &ListsQuery) -> Result<ListsPage, ListsError> {
        let deadline = Deadline::after(self.settings.operator_deadline);
        let query = CountsQuery {
            list: q.list.clone(),
            sandbox: q.sandbox.clone(),
            after: q.after.clone(),
            limit: q.limit,
        };
        let page = self
            .store
            .call(StoreOp::ListCounts, deadline, |s| s.list_counts(&query))
            .await?;
        let next_cursor = page
            .more
            .then(|| page.counts.last())
            .flatten()
            .map(|c| cursor_after(&c.list, &c.sandbox));
        let hits = self.hits.lock().unwrap_or_else(|e| e.into_inner());
        let lists = page
            .counts
            .into_iter()
            .map(|c| {
                let hits = scope(&c.list, &c.sandbox)
                    .and_then(|s| hits.get(&s).copied())
                    .unwrap_or(0);
                ListSummary {
                    list: c.list,
                    sandbox: c.sandbox,
                    entries: c.entries,
                    last_change: c.last_change_ms,
                    hits,
                }
            })
            .collect();
        Ok(ListsPage { lists, next_cursor })
    }

    /// One identity on every list of `sandbox` that holds entries (the first
    /// `MAX_LOOKUP_LISTS` by name: past them the answer says `truncated`), exactly as a check
    /// would find it (ranges, segments and domains included), in chunks of
    /// `MAX_CHECK_LISTS` lists. Reads only that sandbox's lists (the store's index by
    /// sandbox), never the other pairs. An operator's read: its hits are not counted as the
    /// risk engine's.
    pub async fn lookup_everywhere(
        &self,
        dimension: String,
        value: String,
        sandbox: Sandbox,
    ) -> Result<EverywhereOutcome, ListsError> {
        let deadline = Deadline::after(self.settings.operator_deadline);
        let query = CountsQuery {
            list: None,
            sandbox: Some(sandbox.clone()),
            after: None,
            limit: MAX_LOOKUP_LISTS,
        };
        let page = self
            .store
            .call(StoreOp::ListCounts, deadline, |s| s.list_counts(&query))
            .await?;
        let lists: Vec<String> = page.counts.into_iter().map(|c| c.list).collect();
        let mut all = EverywhereOutcome {
            check: CheckOutcome {
                hits: Vec::new(),
                degraded: false,
                stale: None,
                unanswered: Vec::new(),
                decision: None,
                invalid: Vec::new(),
            },
            truncated: page.more,
        };
        if lists.is_empty() {
            // Still a 400 for a bad dimension or value.
            let d = Dimension::try_from(dimension)?;
            Value::parse_check_with(&d, &value, self.norm(&sandbox))?;
            return Ok(all);
        }
        for chunk in lists.chunks(MAX_CHECK_LISTS) {
            let q = CheckQuery::try_from(RawCheck {
                sandbox: Some(sandbox.to_string()),
                lists: chunk.to_vec(),
                subjects: vec![(dimension.clone(), vec![value.clone()])],
                strict: true,
                rules: self.rules(),
            })?;
            let part = self.answer(&q, self.settings.operator_deadline).await?;
            let all = &mut all.check;
            all.hits.extend(part.hits);
            all.degraded |= part.degraded;
            for u in part.unanswered {
                if !all.unanswered.contains(&u) {
                    all.unanswered.push(u);
                }
            }
            if let Some(s) = part.stale {
                all.stale = Some(match all.stale {
                    Some(a) => Staleness {
                        stale_ms: a.stale_ms.max(s.stale_ms),
                    },
                    None => s,
                });
            }
        }
        Ok(all)
    }

    /// A check's answer, its store work bounded by `budget` (a check's deadline, or an
    /// operator's for a lookup across lists).
    async fn answer(&self, q: &CheckQuery, budget: Duration) -> Result<CheckOutcome, ListsError> {
        let deadline = Deadline::after(budget);
        let trusted = self.cache.is_trusted();
        let mut degraded = false;
        // A lost keyspace, as the store said it: fail-closed answers with it.
        let mut lost: Option<StoreError> = None;

        // The lengths in use (IP prefixes, phone segments, e-mail domains), only for subjects
        // of those dimensions.
        let needs_registry = q.subjects.iter().any(|(d, v)| {
            matches!(d, Dimension::Ip | Dimension::Phone | Dimension::Email) && !v.is_empty()
        });
        let scopes: Vec<Scope> = q.lists.iter().map(|l| Scope::new(l, &q.sandbox)).collect();
        // `None` for a scope whose registry is not known here (the store down, none cached).
        let registries: Vec<Option<Arc<Vec<PrefixLen>>>> = if needs_registry {
            match self
                .registries
                .get(&self.store, &scopes, trusted, deadline)
                .await
            {
                Ok(r) => r.into_iter().map(Some).collect(),
                Err(e) => {
                    degraded = true;
                    lost = matches!(e, StoreError::Lost(_)).then_some(e);
                    self.registries.get_cached(&scopes).await
                }
            }
        } else {
            Vec::new()
        };

        let probes = self.probes(q, &registries)?;
        let mut seen = HashSet::new();
        let keys: Vec<EntryKey> = probes
            .iter()
            .map(|p| p.key)
            .filter(|k| seen.insert(*k))
            .collect();

        let now = Instant::now();
        let mut known: HashMap<EntryKey, Option<u32>> = HashMap::with_capacity(keys.len());
        let mut missing = Vec::new();
        for k in keys {
            match self.cache.lookup(&k, now) {
                Lookup::Local(code) => {
                    known.insert(k, code);
                }
                Lookup::Remote => missing.push(k),
            }
        }
        self.metrics.cache_hits.inc_by(known.len() as u64);
        self.metrics.cache_misses.inc_by(missing.len() as u64);

        if !missing.is_empty() && !degraded {
            let wanted = &missing;
            let read = self
                .store
                .call(StoreOp::Check, deadline, |s| async move {
                    let codes = s.get_many(wanted).await?;
                    if codes.len() != wanted.len() {
                        return Err(StoreError::corrupt(format!(
                            "asked for {} fields, got {}",
                            wanted.len(),
                            codes.len()
                        )));
                    }
                    Ok(codes)
                })
                .await;
            match read {
                Ok(codes) => known.extend(missing.iter().copied().zip(codes)),
                // Logged and counted by the call; the answer is the tier's, or a refusal.
                Err(e) => {
                    degraded = true;
                    lost = matches!(e, StoreError::Lost(_)).then_some(e);
                }
            }
        }
        let mut stale = None;
        let mut unknown: HashSet<EntryKey> = HashSet::new();
        if degraded {
            if self.settings.fail_mode == FailMode::Closed {
                self.metrics.refused_answers.inc();
                return Err(lost.unwrap_or(StoreError::Timeout(budget)).into());
            }
            self.metrics.degraded_answers.inc();
            // Whatever is held answers, with how long ago it was last known in sync; what
            // nothing here knows stays unknown (never "absent").
            let mut synced: Option<Instant> = None;
            for k in &missing {
                match self.cache.held(k, now) {
                    Some((code, at)) => {
                        known.insert(*k, code);
                        synced = Some(synced.map_or(at, |s| s.min(at)));
                    }
                    None => {
                        unknown.insert(*k);
                    }
                }
            }
            // Lookups answered locally as current, and registries from the cache, are as old
            // as the tier's last known sync.
            let answered_here = !known.is_empty() || registries.iter().any(Option::is_some);
            let tier = if answered_here {
                self.cache.synced(now)
            } else {
                None
            };
            let since = match (synced, tier) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            stale = Some(Staleness {
                stale_ms: since.map(|t| now.saturating_duration_since(t).as_millis() as u64),
            });
        }

        let now_ms = now_ms();
        // A value with no hit whose lookups were not all made is claimed neither way.
        let mut unanswered = Vec::new();
        if degraded {
            let mut hit: HashSet<(usize, usize)> = HashSet::new();
            let mut open: BTreeSet<(usize, usize)> = BTreeSet::new();
            for p in &probes {
                if known
                    .get(&p.key)
                    .copied()
                    .flatten()
                    .is_some_and(|c| code_is_live(c, now_ms))
                {
                    hit.insert((p.dimension, p.value));
                }
                if unknown.contains(&p.key) {
                    open.insert((p.dimension, p.value));
                }
            }
            for (di, (dimension, values)) in q.subjects.iter().enumerate() {
                let needs_lengths = matches!(
                    dimension,
                    Dimension::Ip | Dimension::Phone | Dimension::Email
                );
                let lengths_unknown = needs_lengths && registries.iter().any(Option::is_none);
                for vi in 0..values.len() {
                    if (lengths_unknown || open.contains(&(di, vi))) && !hit.contains(&(di, vi)) {
                        unanswered.push(Unanswered {
                            dimension: dimension.clone(),
                            index: vi,
                        });
                    }
                }
            }
        }
        let mut hits = Vec::new();
        let mut reported = HashSet::new();
        for p in probes {
            let Some(Some(code)) = known.get(&p.key).copied() else {
                continue;
            };
            if !code_is_live(code, now_ms) {
                self.reclaim(p.key, code, || Scope::new(&q.lists[p.list], &q.sandbox));
                continue;
            }
            if reported.insert((p.list, p.dimension, p.key)) {
                hits.push(Hit {
                    list: q.lists[p.list].clone(),
                    dimension: q.subjects[p.dimension].0.clone(),
                    value: p.shown,
                    expires_at: Expiry::from_code(code).expires_at_ms(),
                });
            }
        }
        // From the lookups made: with values unanswered, a list of the order before the one
        // decided might have had a hit too (the answer says which values were not looked up).
        let decision = q.precedence().map(|order| {
            order
                .into_iter()
                .find(|l| hits.iter().any(|h| h.list == **l))
                .cloned()
        });
        Ok(CheckOutcome {
            hits,
            degraded,
            stale,
            unanswered,
            decision,
            invalid: q.invalid.clone(),
        })
    }

    /// Every (list × dimension × value × length in use) lookup of a check: the value itself,
    /// then for an IP address the network of each prefix length in use for its family, for a
    /// phone the segment of each segment length in use, for an address the domain suffix of
    /// each domain length in use (shortest first).
    fn probes(
        &self,
        q: &CheckQuery,
        registries: &[Option<Arc<Vec<PrefixLen>>>],
    ) -> Result<Vec<Probe>, ValidationError> {
        let layout = self.store.layout();
        let mut probes = Vec::new();
        for (li, list) in q.lists.iter().enumerate() {
            for (di, (dimension, values)) in q.subjects.iter().enumerate() {
                for (vi, value) in values.iter().enumerate() {
                    let mut probe = |v: &Value| {
                        probes.push(Probe {
                            list: li,
                            dimension: di,
                            value: vi,
                            shown: v.to_string(),
                            key: layout.entry_key(list, dimension, &q.sandbox, v),
                        })
                    };
                    probe(value);
                    let Some(Some(lens)) = registries.get(li) else {
                        continue;
                    };
                    for len in lens.iter() {
                        let wider = match (dimension, len.kind) {
                            (Dimension::Ip, kind) => value
                                .as_ip()
                                .filter(|ip| PrefixKind::from(ip.family()) == kind)
                                .map(|ip| Value::Ip(ip.within(len.len))),
                            (Dimension::Phone, PrefixKind::PhoneSegment) => {
                                value.phone_segment(usize::from(len.len))
                            }
                            (Dimension::Email, PrefixKind::EmailDomain) => {
                                value.email_domain_suffix(usize::from(len.len))
                            }
                            _ => None,
                        };
                        if let Some(v) = wider {
                            probe(&v);
                        }
                    }
                }
            }
        }
        if probes.len() > MAX_CHECK_PROBES {
            return Err(ValidationError::new(
                ErrorCode::TooManyLookups,
                format!(
                    "this check fans out to {} lookups (values x lists x IP prefix, phone segment and e-mail domain lengths in use); at most {MAX_CHECK_PROBES}",
                    probes.len()
                ),
            ));
        }
        Ok(probes)
    }
}

fn too_many_entries(n: usize) -> ValidationError {
    ValidationError::new(
        ErrorCode::TooManyEntries,
        format!("{n} entries in one request; at most {MAX_ENTRIES_PER_REQUEST}"),
    )
}

/// Deletes expired fields that reads found, one compare-and-delete at a time (and from the
/// tier's copy, so that later checks do not ask again).
async fn reclaim_expired(
    store: Instrumented<dyn EntryStore>,
    tier: Arc<LocalTier>,
    mut rx: mpsc::Receiver<(EntryKey, u32, Scope)>,
    deadline: Duration,
    metrics: Arc<Metrics>,
) {
    while let Some((key, code, scope)) = rx.recv().await {
        let until = Deadline::after(deadline);
        match store
            .call(StoreOp::Reclaim, until, |s| {
                s.remove_if_unchanged(key, code, until)
            })
            .await
        {
            Ok(true) if store.inner().counts_itself() => {
                tier.forget_expired(&key, code);
                metrics.expired_reclaimed.inc();
            }
            Ok(true) => {
                tier.forget_expired(&key, code);
                metrics.expired_reclaimed.inc();
                let change = [CountChange { scope, delta: -1 }];
                let until = Deadline::after(deadline);
                let counted = store
                    .call(StoreOp::Counts, until, |s| {
                        s.count_changes(&change, now_ms(), until)
                    })
                    .await;
                if counted.is_err() {
                    metrics.count_errors.inc();
                }
            }
            Ok(false) => {}
            Err(e) => {
                tracing::debug!(error = %e, fingerprint = %key.fingerprint(), "lazy expiry failed")
            }
        }
    }
}
