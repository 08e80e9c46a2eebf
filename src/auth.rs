//! Bearer-token auth with three roles, `read` < `write` < `admin` (API.md):
//!
//! | role  | may call |
//! |-------|----------|
//! | read  | `POST /v1/check`, `GET /v1/lists/..`, `POST /v1/features`, `POST /v1/evaluate`, `GET /v1/metrics..`, `GET /v1/rules..` |
//! | write | also `POST`/`DELETE /v1/lists/{list}/entries`, `POST /v1/events` |
//! | admin | also `PUT`/`DELETE /v1/metrics/{id}` and `/v1/rules/{id}` |
//!
//! `/healthz`, `/readyz` and `/metrics` need no token (probes and scrapers send none).
//!
//! Tokens come from the TOML file named by `tokens_file` (`NAMELIST_TOKENS_FILE`), a list of
//! `[[tokens]]` tables with `name`, `role` and `token`, typically mounted from a Kubernetes
//! Secret. The file is re-read when it changes (a rotated Secret takes effect within ~10 s);
//! a broken new version is logged and the previous tokens stay in force. Only SHA-256
//! digests of the tokens are kept, and a presented token is compared with every one of them
//! in constant time, so neither the comparison nor the number of tokens tried leaks which
//! bytes matched. Without a tokens file the API is open, and the service says so loudly.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{HttpMessage, web};
use serde::Deserialize;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::ApiError;
use crate::metrics::Metrics;

/// What a token may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Read,
    Write,
    Admin,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Read => "read",
            Role::Write => "write",
            Role::Admin => "admin",
        }
    }
}

/// Who is calling (in request extensions for handlers: the audit trail records `name`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub role: Role,
}

impl Caller {
    /// The caller when no tokens are configured.
    pub fn anonymous() -> Self {
        Self {
            name: "anonymous".into(),
            role: Role::Admin,
        }
    }
}

/// The name of the caller of a request, for the audit trail.
pub fn caller_name(caller: &Option<web::ReqData<Caller>>) -> String {
    caller
        .as_ref()
        .map_or_else(|| "anonymous".to_owned(), |c| c.name.clone())
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
    tokens: Vec<TokenEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    role: Role,
    token: String,
}

struct Known {
    name: String,
    role: Role,
    digest: [u8; 32],
}

/// Shortest token accepted: a guessable token is worse than none, because it looks safe.
pub const MIN_TOKEN_LEN: usize = 16;

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
    let mut out: Vec<Known> = Vec::with_capacity(file.tokens.len());
    for (i, t) in file.tokens.into_iter().enumerate() {
        if t.name.trim().is_empty() {
            return Err(err(format!("tokens[{i}]: empty name")));
        }
        if out.iter().any(|k| k.name == t.name) {
            return Err(err(format!(
                "tokens[{i}]: the name {:?} is used twice",
                t.name
            )));
        }
        if t.token.len() < MIN_TOKEN_LEN {
            return Err(err(format!(
                "tokens[{i}] ({}): a token must be at least {MIN_TOKEN_LEN} characters",
                t.name
            )));
        }
        let d = digest(&t.token);
        if out.iter().any(|k| k.digest == d) {
            return Err(err(format!(
                "tokens[{i}] ({}): the same token twice",
                t.name
            )));
        }
        out.push(Known {
            name: t.name,
            role: t.role,
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
            role: k.role,
        })
    }
}

async fn check(
    needed: Role,
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let tokens = req
        .app_data::<web::Data<Tokens>>()
        .cloned()
        .expect("the tokens are app data");
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let fail = |reason: &'static str| {
        if let Some(m) = &metrics {
            m.auth_failures.with_label_values(&[reason]).inc();
        }
    };
    let caller = if tokens.is_open() {
        Caller::anonymous()
    } else {
        let presented = req
            .headers()
            .get(actix_web::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, token) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| token.trim())
            });
        let Some(token) = presented else {
            fail("missing");
            return Err(ApiError::Unauthorized(
                "a bearer token is required (Authorization: Bearer <token>)".into(),
            )
            .into());
        };
        let Some(caller) = tokens.identify(token) else {
            fail("invalid");
            return Err(ApiError::Unauthorized("the bearer token is not valid".into()).into());
        };
        if caller.role < needed {
            fail("forbidden");
            return Err(ApiError::Forbidden(format!(
                "token {:?} has role {}; this needs {}",
                caller.name,
                caller.role.as_str(),
                needed.as_str()
            ))
            .into());
        }
        caller
    };
    req.extensions_mut().insert(caller);
    next.call(req).await
}

/// Middleware: the `read` role.
pub async fn require_read(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    check(Role::Read, req, next).await
}

/// Middleware: the `write` role.
pub async fn require_write(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    check(Role::Write, req, next).await
}

/// Middleware: the `admin` role.
pub async fn require_admin(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    check(Role::Admin, req, next).await
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
             [[tokens]]\nname = \"ops\"\nrole = \"admin\"\ntoken = \"fedcba9876543210x\"\n",
        );
        let t = Tokens::load(Some(f.path())).unwrap();
        assert_eq!(t.identify("0123456789abcdef").unwrap().role, Role::Read);
        assert_eq!(t.identify("fedcba9876543210x").unwrap().name, "ops");
        assert_eq!(t.identify("0123456789abcdeF"), None);
        assert_eq!(t.identify(""), None);
        for (bad, why) in [
            (
                "[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"short\"\n",
                "at least 16",
            ),
            (
                "[[tokens]]\nname = \"a\"\nrole = \"root\"\ntoken = \"0123456789abcdef\"\n",
                "root",
            ),
            (
                "[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\nextra = 1\n",
                "extra",
            ),
            ("tokens = []\n", "no [[tokens]]"),
            (
                "[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdef\"\n[[tokens]]\nname = \"a\"\nrole = \"read\"\ntoken = \"0123456789abcdeg\"\n",
                "twice",
            ),
        ] {
            let e = Tokens::load(Some(file(bad).path())).err().expect(bad);
            assert!(e.to_string().contains(why), "{e}");
        }
        assert!(Tokens::load(None).unwrap().is_open());
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
        assert_eq!(t.identify("bbbbbbbbbbbbbbbb").unwrap().role, Role::Write);
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
