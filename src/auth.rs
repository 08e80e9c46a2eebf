//! Bearer tokens, what each may do (permissions) and how much of the instance it may use
//! (per-token limits).
//!
//! # Permissions
//! A token holds a set of [`Permission`]s; least privilege is the point: the risk engine's
//! token can check, evaluate and record events without being able to edit a list.
//!
//! | permission | what it allows |
//! |---|---|
//! | `check` | `POST /v1/check`, `/v1/features`, `/v1/evaluate` (without an event); reading metric and rule definitions |
//! | `lists` | the operators' reads of lists: `GET /v1/lists`, the lookups |
//! | `audit` | `GET`/`POST /v1/audit` |
//! | `entries` | `POST`/`DELETE /v1/lists/{list}/entries` |
//! | `events` | `POST /v1/events`, and an `event` in `POST /v1/evaluate` |
//! | `definitions` | `PUT`/`DELETE /v1/metrics/{id}` and `/v1/rules/{id}` |
//!
//! The `role` of a token is either a preset or a list of permissions:
//! `read` = check + lists + audit; `write` = read + entries + events; `admin` = write +
//! definitions; `engine` = check + events. What each route needs is one table, `ROUTES` in
//! `routes` (the router, the OpenAPI document, the README and the tests read it).
//! `/healthz`, `/readyz` and `/metrics` need no token; `GET /v1/whoami` any valid one.
//!
//! # Per-token limits
//! Each token may carry `max_concurrency` (its requests in this instance at once, from the
//! moment its head is authenticated, body included) and `rate` (requests a second, with a
//! `burst`; a generic cell rate algorithm from `governor`). Tokens that set none take the
//! tokens file's `[defaults.<role>]` (`custom` for a list of permissions), else the built-in
//! defaults ([`DEFAULT_MAX_CONCURRENCY`], no rate), chosen so that the risk engine's normal
//! traffic (tens of thousands of checks a second from a few tokens, each answered in about
//! a millisecond) never meets them. Past a limit: `429 rate_limited` with `Retry-After`.
//! Limits are per instance: N instances admit N times a token's rate.
//!
//! Without a tokens file every caller is `anonymous`, with every permission and no per-token
//! limit (nothing tells two anonymous callers apart); the service says so loudly.
//!
//! # The file
//! Tokens come from the TOML file named by `tokens_file` (`NAMELIST_TOKENS_FILE`), typically
//! mounted from a Kubernetes Secret. It is re-read when it changes (a rotated Secret takes
//! effect within ~10 s); a broken new version is logged and the previous tokens stay in
//! force. Only SHA-256 digests of the tokens are kept, and a presented token is compared with
//! every one of them in constant time, so neither the comparison nor the number of tokens
//! tried leaks which bytes matched.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// One thing a token may do (see the module docs for the routes of each).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    Check,
    Lists,
    Audit,
    Entries,
    Events,
    Definitions,
}

impl Permission {
    /// Every permission, in table order.
    pub const ALL: [Permission; 6] = [
        Permission::Check,
        Permission::Lists,
        Permission::Audit,
        Permission::Entries,
        Permission::Events,
        Permission::Definitions,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::Check => "check",
            Permission::Lists => "lists",
            Permission::Audit => "audit",
            Permission::Entries => "entries",
            Permission::Events => "events",
            Permission::Definitions => "definitions",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of permissions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Permissions(u8);

impl Permissions {
    pub const fn empty() -> Self {
        Self(0)
    }

    /// Every permission: the anonymous caller of an open API.
    pub fn all() -> Self {
        Self::of(&Permission::ALL)
    }

    pub fn of(ps: &[Permission]) -> Self {
        Self(ps.iter().fold(0, |acc, p| acc | p.bit()))
    }

    pub fn contains(self, p: Permission) -> bool {
        self.0 & p.bit() != 0
    }

    /// The permissions held, in table order.
    pub fn iter(self) -> impl Iterator<Item = Permission> {
        Permission::ALL
            .into_iter()
            .filter(move |p| self.contains(*p))
    }

    /// The preset this set is exactly, if any.
    pub fn preset(self) -> Option<Preset> {
        Preset::ALL.into_iter().find(|r| r.permissions() == self)
    }
}

/// A named set of permissions, as a token's `role` may give it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Preset {
    Read,
    Write,
    Admin,
    Engine,
}

impl Preset {
    pub const ALL: [Preset; 4] = [Preset::Read, Preset::Write, Preset::Admin, Preset::Engine];

    pub fn as_str(self) -> &'static str {
        match self {
            Preset::Read => "read",
            Preset::Write => "write",
            Preset::Admin => "admin",
            Preset::Engine => "engine",
        }
    }

    /// What the preset means (the module docs' table).
    pub fn permissions(self) -> Permissions {
        use Permission::*;
        match self {
            Preset::Read => Permissions::of(&[Check, Lists, Audit]),
            Preset::Write => Permissions::of(&[Check, Lists, Audit, Entries, Events]),
            Preset::Admin => Permissions::all(),
            Preset::Engine => Permissions::of(&[Check, Events]),
        }
    }
}

/// A token's `role`: a preset or a list of permissions.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
enum RoleSpec {
    Preset(Preset),
    List(Vec<Permission>),
}

/// `max_concurrency` and `rate`/`burst`, as a token or a default gives them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    /// Requests of the token in this instance at once.
    pub max_concurrency: Option<u32>,
    /// Requests a second, on average.
    pub rate: Option<u32>,
    /// Requests allowed at once above the rate (default: the rate, at least 1).
    pub burst: Option<u32>,
}

impl LimitSpec {
    /// `self`, with what it leaves unset taken from `fallback`; a rate and its burst go
    /// together (a token's own rate does not take a default's burst).
    fn or(self, fallback: LimitSpec) -> LimitSpec {
        let (rate, burst) = match self.rate {
            Some(r) => (Some(r), self.burst),
            None => (fallback.rate, self.burst.or(fallback.burst)),
        };
        LimitSpec {
            max_concurrency: self.max_concurrency.or(fallback.max_concurrency),
            rate,
            burst,
        }
    }
}

/// Requests of one token in one instance at once, when neither the token nor the file's
/// defaults say otherwise: far above what a risk engine keeps in flight (tens of thousands of
/// checks a second at ~1 ms each is tens at once), far below `max_in_flight_requests`.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 256;

/// Who is calling (in request extensions for handlers: the audit trail records `name`).
#[derive(Clone)]
pub struct Caller {
    pub name: String,
    pub permissions: Permissions,
    limits: Option<Arc<TokenLimits>>,
}

impl std::fmt::Debug for Caller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Caller")
            .field("name", &self.name)
            .field("permissions", &self.permissions)
            .finish_non_exhaustive()
    }
}

impl PartialEq for Caller {
    fn eq(&self, other: &Self) -> bool {
        self.name == other.name && self.permissions == other.permissions
    }
}

impl Caller {
    /// The caller when no tokens are configured: every permission, no limits.
    pub fn anonymous() -> Self {
        Self {
            name: "anonymous".into(),
            permissions: Permissions::all(),
            limits: None,
        }
    }

    /// `role` as `GET /v1/whoami` shows it: the preset, or `custom`.
    pub fn role(&self) -> &'static str {
        self.permissions.preset().map_or("custom", Preset::as_str)
    }

    /// Whether the caller holds `p`; the 403 to answer if not.
    pub fn require(&self, p: Permission, what: &str) -> Result<(), Denied> {
        if self.permissions.contains(p) {
            Ok(())
        } else {
            Err(Denied::Forbidden(format!(
                "token {:?} lacks the permission {:?}, which {what} needs",
                self.name,
                p.as_str()
            )))
        }
    }

    /// Takes a place among the token's requests in flight and a cell of its rate, or says
    /// why not (and when to retry). The place is held until the returned guard drops.
    pub fn admit(&self) -> Result<Option<Admitted>, Denied> {
        let Some(limits) = &self.limits else {
            return Ok(None);
        };
        let permit = match &limits.concurrency {
            Some((max, sem)) => Some(sem.clone().try_acquire_owned().map_err(|_| {
                Denied::RateLimited {
                    message: format!(
                        "token {:?} already has {max} requests in flight in this instance (its max_concurrency); retry later",
                        self.name
                    ),
                    retry_after: Duration::from_secs(1),
                }
            })?),
            None => None,
        };
        if let Some((rate, limiter)) = &limits.rate
            && let Err(not_until) = limiter.check()
        {
            let wait = not_until.wait_time_from(DefaultClock::default().now());
            return Err(Denied::RateLimited {
                message: format!(
                    "token {:?} is over its rate of {rate} requests a second; retry later",
                    self.name
                ),
                retry_after: wait,
            });
        }
        Ok(Some(Admitted { _permit: permit }))
    }
}

/// A request admitted by its token's limits: holds its place among the token's requests in
/// flight until dropped.
pub struct Admitted {
    _permit: Option<OwnedSemaphorePermit>,
}

/// Why a request was not let through (answered 401, 403 or 429 by `routes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    Unauthorized(String),
    Forbidden(String),
    RateLimited {
        message: String,
        retry_after: Duration,
    },
}

impl Denied {
    /// The `reason` label of `namelist_auth_failures_total`.
    pub fn label(&self) -> &'static str {
        match self {
            Denied::Unauthorized(m) if m.contains("required") => "missing",
            Denied::Unauthorized(_) => "invalid",
            Denied::Forbidden(_) => "forbidden",
            Denied::RateLimited { .. } => "rate_limited",
        }
    }
}

/// The limits of one token in force, built from its spec.
struct TokenLimits {
    concurrency: Option<(u32, Arc<Semaphore>)>,
    rate: Option<(u32, DefaultDirectRateLimiter)>,
}

impl TokenLimits {
    fn new(spec: LimitSpec) -> Option<Arc<Self>> {
        let concurrency = spec
            .max_concurrency
            .map(|n| (n, Arc::new(Semaphore::new(n as usize))));
        let rate = spec.rate.and_then(NonZeroU32::new).map(|r| {
            let burst = spec.burst.and_then(NonZeroU32::new).unwrap_or(r);
            (
                r.get(),
                RateLimiter::direct(Quota::per_second(r).allow_burst(burst)),
            )
        });
        (concurrency.is_some() || rate.is_some()).then(|| Arc::new(Self { concurrency, rate }))
    }
}

/// Why the tokens file could not be used.
#[derive(Debug, thiserror::Error)]
#[error("tokens file {path}: {reason}")]
pub struct TokensError {
    path: String,
    reason: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    /// Limits by role name (`read`, `write`, `admin`, `engine`, `custom`).
    #[serde(default)]
    defaults: BTreeMap<String, LimitSpec>,
    tokens: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    role: RoleSpec,
    token: String,
    max_concurrency: Option<u32>,
    rate: Option<u32>,
    burst: Option<u32>,
}

impl TokenEntry {
    fn limits(&self) -> LimitSpec {
        LimitSpec {
            max_concurrency: self.max_concurrency,
            rate: self.rate,
            burst: self.burst,
        }
    }
}

struct Known {
    name: String,
    permissions: Permissions,
    limits: Option<Arc<TokenLimits>>,
    digest: [u8; 32],
}

/// Shortest token accepted: a guessable token is worse than none, because it looks safe.
pub const MIN_TOKEN_LEN: usize = 16;
/// Longest token name (it is written into every audit record of the token's writes).
pub const MAX_NAME_LEN: usize = 128;

fn digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

fn parse(path: &Path) -> Result<Vec<Known>, TokensError> {
    let err = |reason: String| TokensError {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    let file: TokensFile = toml::from_str(&text).map_err(|e| err(e.to_string()))?;
    for role in file.defaults.keys() {
        if !matches!(
            role.as_str(),
            "read" | "write" | "admin" | "engine" | "custom"
        ) {
            return Err(err(format!(
                "defaults.{role}: expected read, write, admin, engine or custom"
            )));
        }
    }
    let builtin = LimitSpec {
        max_concurrency: Some(DEFAULT_MAX_CONCURRENCY),
        rate: None,
        burst: None,
    };
    let mut out: Vec<Known> = Vec::with_capacity(file.tokens.len());
    for (i, t) in file.tokens.into_iter().enumerate() {
        let name = t.name.trim();
        if name.is_empty() || name.len() > MAX_NAME_LEN || name.chars().any(char::is_control) {
            return Err(err(format!(
                "tokens[{i}]: a name is 1 to {MAX_NAME_LEN} bytes without control characters"
            )));
        }
        if out.iter().any(|k| k.name == name) {
            return Err(err(format!("tokens[{i}]: the name {name:?} is used twice")));
        }
        if t.token.len() < MIN_TOKEN_LEN {
            return Err(err(format!(
                "tokens[{i}] ({name}): a token must be at least {MIN_TOKEN_LEN} characters"
            )));
        }
        let d = digest(&t.token);
        if out.iter().any(|k| k.digest == d) {
            return Err(err(format!("tokens[{i}] ({name}): the same token twice")));
        }
        let (permissions, role) = match &t.role {
            RoleSpec::Preset(p) => (p.permissions(), p.as_str()),
            RoleSpec::List(ps) if ps.is_empty() => {
                return Err(err(format!(
                    "tokens[{i}] ({name}): role lists no permission"
                )));
            }
            RoleSpec::List(ps) => (Permissions::of(ps), "custom"),
        };
        for (what, v) in [
            ("max_concurrency", t.max_concurrency),
            ("rate", t.rate),
            ("burst", t.burst),
        ] {
            if v == Some(0) {
                return Err(err(format!(
                    "tokens[{i}] ({name}): {what} must be at least 1 (leave it out for the default)"
                )));
            }
        }
        let defaults = file.defaults.get(role).copied().unwrap_or_default();
        out.push(Known {
            name: name.to_owned(),
            permissions,
            limits: TokenLimits::new(t.limits().or(defaults).or(builtin)),
            digest: d,
        });
    }
    if out.is_empty() {
        return Err(err("no [[tokens]]: remove the setting to run open".into()));
    }
    Ok(out)
}

/// The configured tokens (or none: open).
pub struct Tokens {
    path: Option<PathBuf>,
    known: RwLock<Arc<Vec<Known>>>,
    modified: RwLock<Option<SystemTime>>,
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

impl Tokens {
    /// Loads the tokens file, if one is configured.
    pub fn load(path: Option<&Path>) -> Result<Self, TokensError> {
        let known = match path {
            Some(p) => parse(p)?,
            None => Vec::new(),
        };
        Ok(Self {
            known: RwLock::new(Arc::new(known)),
            modified: RwLock::new(path.and_then(modified)),
            path: path.map(Path::to_path_buf),
        })
    }

    /// Whether the API is open (no tokens file).
    pub fn is_open(&self) -> bool {
        self.path.is_none()
    }

    /// How many tokens are in force.
    pub fn len(&self) -> usize {
        self.known.read().expect("tokens lock").len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Re-reads the file if it changed; keeps the old tokens if the new file is broken.
    pub fn reload_if_changed(&self) {
        let Some(path) = &self.path else { return };
        let now = modified(path);
        if now == *self.modified.read().expect("tokens lock") {
            return;
        }
        match parse(path) {
            Ok(k) => {
                tracing::info!(tokens = k.len(), "tokens file reloaded");
                *self.known.write().expect("tokens lock") = Arc::new(k);
                *self.modified.write().expect("tokens lock") = now;
            }
            Err(e) => {
                tracing::error!(error = %e, "tokens file not reloaded; the previous tokens stay in force")
            }
        }
    }

    /// Watches the file for changes, every `every`.
    pub fn spawn_reloader(
        self: &Arc<Self>,
        every: Duration,
    ) -> Option<tokio::task::JoinHandle<()>> {
        self.path.as_ref()?;
        let weak = Arc::downgrade(self);
        Some(tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                let Some(this) = weak.upgrade() else { return };
                this.reload_if_changed();
            }
        }))
    }

    /// The caller presenting `token`, comparing it with every known digest in constant time.
    pub fn identify(&self, token: &str) -> Option<Caller> {
        let d = digest(token);
        let known = self.known.read().expect("tokens lock").clone();
        let mut found: Option<&Known> = None;
        for k in known.iter() {
            if bool::from(k.digest.ct_eq(&d)) {
                found = Some(k);
            }
        }
        found.map(|k| Caller {
            name: k.name.clone(),
            permissions: k.permissions,
            limits: k.limits.clone(),
        })
    }

    /// The caller of a request from its `Authorization` header value (`None`: absent), or
    /// why it is refused. Open: `anonymous`.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Caller, Denied> {
        if self.is_open() {
            return Ok(Caller::anonymous());
        }
        let presented = authorization.and_then(|v| {
            let (scheme, token) = v.split_once(' ')?;
            scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
        });
        let Some(token) = presented else {
            return Err(Denied::Unauthorized(
                "a bearer token is required (Authorization: Bearer <token>)".into(),
            ));
        };
        self.identify(token)
            .ok_or_else(|| Denied::Unauthorized("the bearer token is not valid".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        std::io::Write::write_all(&mut f, text.as_bytes()).unwrap();
        f
    }

    #[test]
    fn identifies_by_token_and_refuses_bad_files() {
        let f = file(
            "[[tokens]]\nname = \"engine\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\n\
             [[tokens]]\nname = \"ops\"\nrole = \"admin\"\ntoken = \"fedcba9876543210x\"\n\
             [[tokens]]\nname = \"rec\"\nrole = [\"events\", \"check\"]\ntoken = \"eeeeeeeeeeeeeeee\"\n",
        );
        let t = Tokens::load(Some(f.path())).unwrap();
        let read = t.identify("0123456789abcdef").unwrap();
        assert_eq!(read.role(), "read");
        assert!(read.permissions.contains(Permission::Audit));
        assert!(!read.permissions.contains(Permission::Events));
        assert_eq!(t.identify("fedcba9876543210x").unwrap().name, "ops");
        let rec = t.identify("eeeeeeeeeeeeeeee").unwrap();
        assert_eq!(
            rec.role(),
            "engine",
            "a list equal to a preset is that preset"
        );
        assert_eq!(t.identify("0123456789abcdeF"), None);
        assert_eq!(t.identify(""), None);
        for (bad, why) in [
            (
                "[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"short\"\n",
                "at least 16",
            ),
            (
                "[[tokens]]\nname = \"a\"\nrole = \"root\"\ntoken = \"0123456789abcdef\"\n",
                "role",
            ),
            (
                "[[tokens]]\nname = \"a\"\nrole = [\"check\", \"sudo\"]\ntoken = \"0123456789abcdef\"\n",
                "role",
            ),
            (
                "[[tokens]]\nname = \"a\"\nrole = []\ntoken = \"0123456789abcdef\"\n",
                "no permission",
            ),
            (
                "[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\nextra = 1\n",
                "extra",
            ),
            (
                "[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\nrate = 0\n",
                "rate must be at least 1",
            ),
            (
                "[defaults.root]\nrate = 1\n[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\n",
                "defaults.root",
            ),
            (
                "[[tokens]]\nname = \"a\\nb\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\n",
                "control",
            ),
            ("tokens = []\n", "no [[tokens]]"),
            (
                "[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\n[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdeg\"\n",
                "twice",
            ),
        ] {
            let e = Tokens::load(Some(file(bad).path())).err().expect(bad);
            assert!(e.to_string().contains(why), "{why}: {e}");
        }
        assert!(Tokens::load(None).unwrap().is_open());
    }

    #[test]
    fn presets_mean_what_the_docs_say() {
        use Permission::*;
        let has = |p: Preset| p.permissions().iter().collect::<Vec<_>>();
        assert_eq!(has(Preset::Read), [Check, Lists, Audit]);
        assert_eq!(has(Preset::Write), [Check, Lists, Audit, Entries, Events]);
        assert_eq!(has(Preset::Admin), Permission::ALL);
        assert_eq!(has(Preset::Engine), [Check, Events]);
        let engine = Caller {
            name: "e".into(),
            permissions: Preset::Engine.permissions(),
            limits: None,
        };
        assert!(engine.require(Events, "an event").is_ok());
        let Err(Denied::Forbidden(m)) = engine.require(Entries, "writing entries") else {
            panic!()
        };
        assert!(
            m.contains("entries") && m.contains("writing entries"),
            "{m}"
        );
    }

    #[test]
    fn limits_come_from_the_token_then_its_roles_defaults_then_the_built_in_ones() {
        let f = file(
            "[defaults.read]\nrate = 2\nburst = 2\n\
             [defaults.custom]\nmax_concurrency = 1\n\
             [[tokens]]\nname = \"r\"\nrole = \"read\"\ntoken = \"rrrrrrrrrrrrrrrr\"\n\
             [[tokens]]\nname = \"own\"\nrole = \"read\"\ntoken = \"oooooooooooooooo\"\nrate = 1000\nmax_concurrency = 2\n\
             [[tokens]]\nname = \"c\"\nrole = [\"audit\"]\ntoken = \"cccccccccccccccc\"\n\
             [[tokens]]\nname = \"w\"\nrole = \"write\"\ntoken = \"wwwwwwwwwwwwwwww\"\n",
        );
        let t = Tokens::load(Some(f.path())).unwrap();
        // read: rate 2, burst 2 from its role's defaults.
        let r = t.identify("rrrrrrrrrrrrrrrr").unwrap();
        let a = r.admit().unwrap();
        let b = r.admit().unwrap();
        let Err(Denied::RateLimited { retry_after, .. }) = r.admit() else {
            panic!("the third at once is over rate 2 burst 2")
        };
        assert!(retry_after <= Duration::from_secs(1), "{retry_after:?}");
        drop((a, b));
        // own: its own concurrency of 2, its rate of 1,000.
        let own = t.identify("oooooooooooooooo").unwrap();
        let held = (own.admit().unwrap(), own.admit().unwrap());
        let Err(Denied::RateLimited { message, .. }) = own.admit() else {
            panic!("a third in flight")
        };
        assert!(message.contains("max_concurrency"), "{message}");
        drop(held);
        assert!(own.admit().is_ok(), "the places come back");
        // custom: the custom defaults.
        let c = t.identify("cccccccccccccccc").unwrap();
        let one = c.admit().unwrap();
        assert!(c.admit().is_err());
        drop(one);
        // write: the built-in concurrency, no rate.
        let w = t.identify("wwwwwwwwwwwwwwww").unwrap();
        let held: Vec<_> = (0..DEFAULT_MAX_CONCURRENCY)
            .map(|_| w.admit().unwrap())
            .collect();
        assert!(w.admit().is_err());
        drop(held);
        // Anonymous: no limits at all.
        assert!(Caller::anonymous().admit().unwrap().is_none());
    }

    #[test]
    fn a_changed_file_is_reloaded_and_a_broken_one_is_not() {
        let mut f =
            file("[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"aaaaaaaaaaaaaaaa\"\n");
        let t = Tokens::load(Some(f.path())).unwrap();
        std::thread::sleep(Duration::from_millis(20));
        std::fs::write(
            f.path(),
            "[[tokens]]\nname = \"b\"\nrole = \"write\"\ntoken = \"bbbbbbbbbbbbbbbb\"\n",
        )
        .unwrap();
        // Make sure the modification time moves even on coarse-grained file systems.
        let later = SystemTime::now() + Duration::from_secs(2);
        f.as_file_mut().set_modified(later).unwrap();
        t.reload_if_changed();
        assert_eq!(t.identify("aaaaaaaaaaaaaaaa"), None);
        assert_eq!(t.identify("bbbbbbbbbbbbbbbb").unwrap().role(), "write");
        std::fs::write(f.path(), "not toml").unwrap();
        f.as_file_mut()
            .set_modified(later + Duration::from_secs(2))
            .unwrap();
        t.reload_if_changed();
        assert!(
            t.identify("bbbbbbbbbbbbbbbb").is_some(),
            "the previous tokens stay"
        );
    }
}
