//! namelist: a real-time name-list (black/white/grey list) lookup service for risk engines,
//! on Redis (or an embedded store), behind a local cache.
//!
//! * `domain`: parsed, normalised input types, and `ErrorCode`, the one table of error codes.
//! * `store`: everything that knows what a key, field or value looks like: the storage layout
//!   (`store::layout`), expiry codes (`store::expiry`), the Lua scripts (`store::scripts`), the
//!   store traits, one per concern (`StoreBase`; `EntryStore` for the lists and the tier,
//!   `InvalidationBus`, `MetricStore` and `DefinitionStore` for velocity, `AuditReports`;
//!   `Store` is all of them), their Redis and embedded backends, and the typed bulk operations
//!   the tools use (`store::bulk`).
//! * `instrumented`: every store call the service makes, with its deadline, `store` span and
//!   metrics (`Instrumented::call`).
//! * `cache`, `invalidation`: the local cache and its cross-instance invalidation.
//! * `lists`: the name-list service.
//! * `velocity`: velocity metrics and rules.
//! * `routes`, `error`, `auth`: HTTP. `config`, `telemetry`, `metrics`, `startup`: running it.
//! * `tools`: the operator tools behind `namelist-tools` (never a Redis command of their own).

pub mod auth;
pub mod cache;
pub mod config;
pub mod domain;
pub mod error;
pub mod instrumented;
pub mod invalidation;
pub mod lists;
pub mod metrics;
pub mod routes;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod velocity;
