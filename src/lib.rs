//! namelist: a real-time name-list (black/white/grey list) lookup service for risk engines,
//! on Redis (or an embedded store), behind a local cache.
//!
//! * `domain`: parsed, normalised input types, and `ErrorCode`, the one table of error codes.
//! * `store`: everything that knows what a key, field or value looks like: the storage layout
//!   (`store::layout`), expiry codes (`store::expiry`), the Lua scripts (`store::redis::scripts`), the
//!   store traits, one per concern (`StoreBase`; `EntryStore` for the lists and the tier,
//!   `InvalidationBus`, `MetricStore` and `DefinitionStore` for velocity, `AuditReports`;
//!   `Store` is all of them), their Redis and embedded backends, and the typed bulk operations
//!   the tools use (`store::redis::bulk`).
//! * `instrumented`: every store call the service makes, with its deadline, `store` span and
//!   metrics (`Instrumented::call`).
//! * `tier`, `invalidation`: the local tier (a cache of whole buckets) and its cross-instance
//!   invalidation.
//! * `lists`: the name-list service; `audit_trail`: the audit trail as operators read it.
//! * `velocity`: velocity metrics and rules.
//! * `lane`: the operator lane, a runtime of its own for operators' work.
//! * `routes`, `error`, `auth`: HTTP. `config`, `telemetry`, `metrics`, `startup`: running it.
//!
//! The binary `src/main.rs` serves. The operator tools (import, gen, audit, sweep, keygen) are
//! the workspace's other crate, `namelist-tools` in `tools/`, a client of this library that
//! reaches Redis only through `store` (`store::redis::bulk`).

pub mod audit_trail;
pub mod auth;
pub mod background;
pub mod config;
pub mod domain;
pub mod error;
pub mod instrumented;
pub mod invalidation;
pub mod lane;
pub mod lists;
pub mod metrics;
pub mod routes;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod tier;
pub mod velocity;
