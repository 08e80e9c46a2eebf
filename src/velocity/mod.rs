//! Velocity metrics: sliding-window counters defined at run time, rules over them, and the
//! one-call decision input.

pub mod expr;
pub mod model;
pub mod rules;
pub mod service;

pub use service::{
    EventInput, Features, FieldValue, Fields, IngestOutcome, Velocity, VelocityError,
    VelocitySettings,
};
