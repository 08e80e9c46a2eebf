//! Velocity metrics: sliding-window counters defined at run time, rules over them, and the
//! one-call decision input.

pub mod expr;
pub mod model;
pub mod rules;
pub mod service;

/// Asserts that the parse of `src` failed with `code` at column `col`, saying `what`: the
/// error tables of both parsers (`expr`, `rules`).
#[cfg(test)]
fn assert_points_at<T: std::fmt::Debug>(
    parsed: Result<T, crate::domain::ValidationError>,
    code: &str,
    src: &str,
    col: usize,
    what: &str,
) {
    let e = parsed.expect_err(src);
    assert_eq!(e.code, code);
    assert!(
        e.message.starts_with(&format!("column {col}:")) && e.message.contains(what),
        "{src}: {}",
        e.message
    );
}

pub use service::{
    DefinitionLimits, EventInput, Features, FieldValue, Fields, IngestOutcome, Velocity,
    VelocityError, VelocitySettings,
};
