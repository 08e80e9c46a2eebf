//! The operator tools' integration tests: one module per former test file, in one binary (one
//! link of the tools, the service and their dependencies instead of one per file; nextest still
//! runs each test in a process of its own). One module's tests:
//! `cargo nextest run -p namelist-tools --test integration -E 'test(/^import::/)'`.

#[path = "../../../tests/common/mod.rs"]
mod common;

mod audit;
mod fingerprint_key;
mod import;
mod matching;
mod shared;
mod sweep;
mod tools;
