//! The table of the API's routes, written once: each route's method, path pattern, handler,
//! what its caller needs (`Need`), the budget it counts against (`Class`) and what it asks of
//! the store (`StoreUse`). `ROUTES` is that table as data; `configure` (in `routes`) mounts
//! the same table, each route behind its gate. `ROUTES` is what `tests/integration/openapi.rs`
//! compares with the OpenAPI document both ways, what the OpenAPI document takes each
//! operation's "Needs" and error responses from (`openapi::Gates`), and what
//! `tests/integration/auth.rs` compares with the README's table: a route added here and not
//! documented fails those tests.
//!
//! The list is held by `route_table!`, which hands it to a callback macro: here to define
//! `ROUTES` (which ignores the handlers, so this module imports no handler module and sits
//! below them), and in `routes` to mount every handler. One list, so the two cannot differ.

use crate::auth::Permission;

/// What a route needs of its caller (see `auth` for what each permission means).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// No token: probes, scrapers, the API's own description.
    Open,
    /// Any valid token.
    Token,
    /// A token holding this permission.
    Permission(Permission),
}

impl Need {
    /// As the OpenAPI document and the README say it.
    pub fn describe(self) -> String {
        match self {
            Need::Open => "no token".to_owned(),
            Need::Token => "any token".to_owned(),
            Need::Permission(p) => format!("permission `{}`", p.as_str()),
        }
    }
}

/// Which budget of the instance a route's requests share (see `limits`): the risk engine's
/// per-request calls, writes, and operators' reads and definitions never wait for each
/// other's room, and operators' work runs on its own lane (`lane`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Class {
    /// Probes and `/metrics`: no budget, no token.
    Probe,
    /// `check`, `features`, `evaluate`: `max_in_flight_requests`.
    Engine,
    /// Entries and events: `max_in_flight_writes`.
    Write,
    /// Lists, lookups, audit, definitions, whoami: `max_in_flight_operator`, on the operator
    /// lane.
    Operator,
}

impl Class {
    /// The `class` label of the budget metrics.
    pub fn label(self) -> &'static str {
        match self {
            Class::Probe => "probe",
            Class::Engine => "engine",
            Class::Write => "write",
            Class::Operator => "operator",
        }
    }
}

/// What a route asks of the store, and so which 503s it can answer (the OpenAPI document's
/// 503 line is derived from it: `openapi::Gates`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreUse {
    /// Nothing: only a full budget (`overloaded`).
    None,
    /// Reads: also `store_unavailable`.
    Reads,
    /// Writes: also `replicas_unavailable` (with `write_replicas`).
    Writes,
}

/// One API route as mounted: the method, the path pattern (actix syntax: `{value:.*}` takes
/// the rest of the path), what its caller needs, the budget it counts against and what it
/// asks of the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteDef {
    pub method: &'static str,
    pub path: &'static str,
    pub need: Need,
    pub class: Class,
    pub store: StoreUse,
}

pub(super) const CHECK: Need = Need::Permission(Permission::Check);
pub(super) const LISTS: Need = Need::Permission(Permission::Lists);
pub(super) const AUDIT: Need = Need::Permission(Permission::Audit);
pub(super) const ENTRIES: Need = Need::Permission(Permission::Entries);
pub(super) const EVENTS: Need = Need::Permission(Permission::Events);
pub(super) const DEFINITIONS: Need = Need::Permission(Permission::Definitions);

/// Hands the API's routes, in mounting order, to the macro `$callback`, as
/// `"path" => [METHOD handler, need, Class, StoreUse; ...], ...` (`{value:.*}` in a path takes
/// the rest of it). The handler paths are relative to `routes`, and the needs name this
/// module's constants: a callback that uses them must run where they resolve (`routes`
/// imports the constants).
macro_rules! route_table {
    ($callback:ident) => {
        $callback! {
            "/v1/lists" => [GET lists::summaries, LISTS, Operator, Reads],
            "/v1/lists/-/lookup" => [POST lists::lookup_posted, LISTS, Operator, Reads],
            "/v1/lists/-/lookup/{dimension}/{value:.*}" => [GET lists::lookup_everywhere, LISTS, Operator, Reads],
            "/v1/audit" => [GET audit::audit, AUDIT, Operator, Reads; POST audit::search, AUDIT, Operator, Reads],
            "/v1/whoami" => [GET console::whoami, Need::Token, Operator, None],
            "/v1/lists/{list}/entries" => [POST lists::upsert, ENTRIES, Write, Writes; DELETE lists::remove, ENTRIES, Write, Writes],
            "/v1/lists/{list}/entries/{dimension}/{value:.*}" => [GET lists::lookup, LISTS, Operator, Reads],
            "/v1/check" => [POST check::check, CHECK, Engine, Reads],
            "/v1/metrics" => [GET velocity::list_metrics, CHECK, Operator, Reads],
            "/v1/metrics/{id}" => [
                PUT velocity::put_metric, DEFINITIONS, Operator, Writes;
                GET velocity::get_metric, CHECK, Operator, Reads;
                DELETE velocity::delete_metric, DEFINITIONS, Operator, Writes
            ],
            "/v1/rules" => [GET velocity::list_rules, CHECK, Operator, Reads],
            "/v1/rules/{id}" => [
                PUT velocity::put_rule, DEFINITIONS, Operator, Writes;
                GET velocity::get_rule, CHECK, Operator, Reads;
                DELETE velocity::delete_rule, DEFINITIONS, Operator, Writes
            ],
            "/v1/events" => [POST events::post_events, EVENTS, Write, Writes],
            "/v1/features" => [POST events::post_features, CHECK, Engine, Reads],
            // With an `event`, also `events` (checked by the handler, which sees the body), and a
            // write.
            "/v1/evaluate" => [POST events::post_evaluate, CHECK, Engine, Writes],
            "/healthz" => [GET health::healthz, Need::Open, Probe, None],
            "/readyz" => [GET health::readyz, Need::Open, Probe, None],
            "/metrics" => [GET health::metrics, Need::Open, Probe, None],
        }
    };
}
pub(super) use route_table;

/// Defines `ROUTES` from the table (the handlers are not named: this module imports none).
macro_rules! define_routes {
    ($( $path:literal => [ $( $method:ident $handler:path, $need:expr, $class:ident, $store:ident );+ $(;)? ] ),* $(,)?) => {
        /// Every API route, in mounting order.
        pub const ROUTES: &[RouteDef] = &[
            $( $( RouteDef { method: stringify!($method), path: $path, need: $need, class: Class::$class, store: StoreUse::$store }, )+ )*
        ];
    };
}

route_table!(define_routes);

/// The route of `method` and `path` pattern, if it is one.
pub fn route_def(method: &str, path: &str) -> Option<&'static RouteDef> {
    ROUTES.iter().find(|r| r.method == method && r.path == path)
}
