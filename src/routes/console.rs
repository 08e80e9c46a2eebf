//! The operator console (`/console`) and `GET /v1/whoami`, which the console asks first.
//!
//! The console is three static files compiled into the binary (`src/console/`: HTML, one
//! script, one style sheet; vanilla JavaScript, no build step). It calls the public API with
//! the operator's bearer token, typed once and kept in `sessionStorage` (never in a URL), and
//! renders every value with `textContent`. Every console response carries a strict
//! Content-Security-Policy: scripts and styles from this origin only, nothing inline, no
//! frames, no forms posting elsewhere.

use actix_web::http::header::{self, HeaderValue};
use actix_web::{HttpResponse, web};
use serde::Serialize;

use crate::auth::{Caller, Tokens};

/// The console's Content-Security-Policy.
pub const CONSOLE_CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self'; \
                               img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; \
                               base-uri 'none'; form-action 'none'";

const INDEX: &str = include_str!("../console/index.html");
/// The console's scripts, in the order `index.html` runs them (they share one global scope).
pub const SCRIPTS: [(&str, &str); 6] = [
    ("core", include_str!("../console/js/core.js")),
    ("search", include_str!("../console/js/search.js")),
    ("edit", include_str!("../console/js/edit.js")),
    ("audit", include_str!("../console/js/audit.js")),
    ("health", include_str!("../console/js/health.js")),
    ("definitions", include_str!("../console/js/definitions.js")),
];
const STYLE: &str = include_str!("../console/app.css");

/// Who the caller is, as the console shows it.
#[derive(Serialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// The token's name (`anonymous` without tokens).
    name: String,
    /// The preset its permissions are (`read`, `write`, `admin`, `engine`), else `custom`.
    role: &'static str,
    /// What the token may do (`check`, `lists`, `audit`, `entries`, `events`,
    /// `definitions`).
    permissions: Vec<&'static str>,
    /// Whether tokens are configured (`false`: the API is open to anyone).
    auth: bool,
}

#[utoipa::path(
    get,
    path = "/v1/whoami",
    summary = "The caller's token name and role, and whether auth is on",
    responses(
        (status = 200, description = "The caller", body = WhoAmI),
    )
)]
/// `GET /v1/whoami`
pub async fn whoami(caller: Caller, tokens: web::Data<Tokens>) -> HttpResponse {
    HttpResponse::Ok().json(WhoAmI {
        role: caller.role(),
        permissions: caller.permissions.iter().map(|p| p.as_str()).collect(),
        name: caller.name,
        auth: !tokens.is_open(),
    })
}

fn asset(body: &'static str, content_type: &'static str) -> HttpResponse {
    HttpResponse::Ok()
        .content_type(content_type)
        .insert_header((
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(CONSOLE_CSP),
        ))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        // Assets change with the binary: revalidate rather than serve an old script.
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .body(body)
}

async fn index() -> HttpResponse {
    asset(INDEX, "text/html; charset=utf-8")
}

async fn style() -> HttpResponse {
    asset(STYLE, "text/css; charset=utf-8")
}

/// Mounts `/console` and its assets, the style sheet and `/console/js/<name>.js` for each of
/// `SCRIPTS` (no token: the page holds no data; every call it makes carries the operator's).
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.service(web::resource("/console").route(web::get().to(index)))
        .service(web::resource("/console/").route(web::get().to(index)))
        .service(web::resource("/console/app.css").route(web::get().to(style)));
    for (name, body) in SCRIPTS {
        cfg.service(web::resource(format!("/console/js/{name}.js")).route(
            web::get().to(move || async move { asset(body, "text/javascript; charset=utf-8") }),
        ));
    }
}
