//! namelist: a real-time name-list (black/white/grey list) lookup service for risk engines,
//! on Redis (or an embedded store), behind a local cache.
//!
//! * `domain`: parsed, normalised input types, and `ErrorCode`, the one table of error codes.
//! * `store`: the storage layout and the `Store` trait with its Redis and embedded backends.
//! * `cache`, `invalidation`: the local cache and its cross-instance invalidation.
//! * `lists`: the name-list service.
//! * `routes`, `error`: HTTP. `config`, `telemetry`, `metrics`, `startup`: running it.

pub mod auth;
pub mod cache;
pub mod config;
pub mod domain;
pub mod error;
pub mod invalidation;
pub mod lists;
pub mod metrics;
pub mod routes;
pub mod startup;
pub mod store;
pub mod telemetry;
pub mod tools;
pub mod velocity;
