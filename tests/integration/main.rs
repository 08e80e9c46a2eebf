//! The service's integration tests: one module per former test file, all in one binary.
//!
//! One binary, not one per file: each test binary links the whole service and its
//! dependencies and compiles the shared helpers (`tests/common/`) again, so thirty of them cost
//! CI about two minutes of compiling and linking on two cores. nextest still runs every test
//! in a process of its own, so tests share nothing but the binary; one module's tests:
//! `cargo nextest run --test integration -E 'test(/^http::/)'`. The console's browser tests
//! stay a binary of their own (`tests/console/`).

#[path = "../common/mod.rs"]
mod common;

mod abuse;
mod attacker;
mod audit_index;
mod auth;
mod conformance;
mod durability;
mod error_codes;
mod failover;
mod faults;
mod fingerprint_key;
mod history;
mod hostile;
mod http;
mod invalidation;
mod keyspace;
mod keyspace_lost;
mod limits;
mod list_counts;
mod matching_http;
mod observability;
mod openapi;
mod operators_http;
mod props;
mod replication;
mod shard_lost;
mod shutdown;
mod tier;
mod tls;
mod velocity;
mod velocity_http;
