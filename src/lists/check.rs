//! Checks: a `CheckQuery` (parsed and within the limits), every lookup it fans out to
//! (`probes`: IP prefixes, phone segments, e-mail domains in use), answered by the local tier
//! where it holds the bucket in sync and by the store in one round trip otherwise, within the
//! check's deadline; when the store cannot answer, the fail mode decides (`degraded`,
//! `stale_ms`, `unanswered`, or 503). A check counts its hits (`GET /v1/lists`).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::{FailMode, ListsError, MAX_CHECK_LISTS, MAX_CHECK_PROBES, MAX_CHECK_VALUES, NameLists};
use crate::domain::{
    Dimension, ErrorCode, Expiry, ListName, Rules, Sandbox, ValidationError, Value, now_ms,
};
use crate::metrics::StoreOp;
use crate::store::{
    Deadline, EntryKey, PrefixKind, PrefixLen, Scope, StoreError, code_is_live, one_each,
};
use crate::tier::Lookup;

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

impl NameLists {
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

    /// A check's answer, its store work bounded by `budget` (a check's deadline, or an
    /// operator's for a lookup across lists).
    pub(super) async fn answer(
        &self,
        q: &CheckQuery,
        budget: Duration,
    ) -> Result<CheckOutcome, ListsError> {
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
                    one_each("fields", wanted.len(), s.get_many(wanted).await?)
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
