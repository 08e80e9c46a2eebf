//! Limits on the work one instance takes on at once, so that many or slow clients cannot
//! exhaust its memory or its attention, and one kind of work cannot take another's room:
//!
//! - **class budgets**: each route belongs to a class (`routes::table::Class`) with a budget of its
//!   own: the risk engine's calls (`check`, `features`, `evaluate`) at most
//!   `max_in_flight_requests`, writes (entries, events) at most `max_in_flight_writes`,
//!   operators' calls (lists, lookups, audit, definitions) at most `max_in_flight_operator`.
//!   A request beyond its class's budget is answered `503 overloaded` (+ `Retry-After: 1`) at
//!   once. A request takes its place only once its body is read, so a client that sends a
//!   head and nothing more holds no place (only its connection, cut after 10 s); an operator's
//!   request keeps its place until its work on the operator lane ends, even if its client
//!   left (`lane`). Probes and `/metrics` are not counted, so an overloaded instance still
//!   answers its orchestrator.
//! - **buffered body bytes**: request bodies are read into memory before decoding; all bodies
//!   being read or decoded share a budget of `max_buffered_body_bytes`, taken chunk by chunk
//!   as bytes arrive (never from what `Content-Length` announces). A body that does not fit
//!   is answered `503 overloaded`. With the per-body limit (`max_body_bytes`, 413) this bounds
//!   the memory of bodies in flight whatever clients send.
//!
//! Per-token limits (`auth`) come before both: a token past its concurrency or rate is a 429.
//! Connections are bounded by `max_connections` (spread over the workers; more wait in the
//! listen backlog), a request's head must arrive within 10 s (408), its body within 10 s
//! (`request_timeout`), and idle keep-alive connections close after `keep_alive_secs`.

use std::sync::Arc;

use actix_web::web;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::table::Class;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// Bytes per body-budget permit (a semaphore counts permits in `u32`s).
const UNIT: usize = 1024;

/// The budget of one route class.
struct Budget {
    room: Arc<Semaphore>,
    max: usize,
}

impl Budget {
    fn new(max: usize) -> Self {
        Self {
            room: Arc::new(Semaphore::new(max.min(Semaphore::MAX_PERMITS))),
            max,
        }
    }
}

/// The shared limits, as app data.
pub struct Limits {
    engine: Budget,
    write: Budget,
    operator: Budget,
    body_units: Arc<Semaphore>,
    max_body_buffer: usize,
}

/// Requests in flight, per class.
#[derive(Debug, Clone, Copy)]
pub struct ClassBudgets {
    pub engine: usize,
    pub write: usize,
    pub operator: usize,
}

impl Limits {
    pub fn new(classes: ClassBudgets, max_body_buffer: usize) -> Self {
        let units = max_body_buffer.div_ceil(UNIT).min(Semaphore::MAX_PERMITS);
        Self {
            engine: Budget::new(classes.engine),
            write: Budget::new(classes.write),
            operator: Budget::new(classes.operator),
            body_units: Arc::new(Semaphore::new(units)),
            max_body_buffer,
        }
    }

    fn budget(&self, class: Class) -> Option<&Budget> {
        match class {
            Class::Probe => None,
            Class::Engine => Some(&self.engine),
            Class::Write => Some(&self.write),
            Class::Operator => Some(&self.operator),
        }
    }

    /// Takes a place in `class`'s budget, held as long as the returned permit lives (and
    /// counted in `namelist_in_flight_requests{class}`); `Err` (503 `overloaded`) when the
    /// budget is spent. Probes have no budget: `Ok(None)`.
    pub fn admit(
        &self,
        class: Class,
        metrics: Option<&web::Data<Metrics>>,
    ) -> Result<Option<ClassPermit>, ApiError> {
        let Some(budget) = self.budget(class) else {
            return Ok(None);
        };
        let Ok(permit) = budget.room.clone().try_acquire_owned() else {
            if let Some(m) = metrics {
                m.overloaded.with_label_values(&[class.label()]).inc();
            }
            return Err(ApiError::Overloaded(format!(
                "this instance is already handling {} {} requests; retry later",
                budget.max,
                class.label()
            )));
        };
        let gauge = metrics.map(|m| m.in_flight.with_label_values(&[class.label()]));
        if let Some(g) = &gauge {
            g.inc();
        }
        Ok(Some(ClassPermit {
            _permit: permit,
            gauge,
        }))
    }

    /// Reserves room for `bytes` more of body, adding to `held`. `Err` when the budget is
    /// spent (nothing is reserved then).
    pub fn reserve_body(
        &self,
        held: &mut Option<OwnedSemaphorePermit>,
        bytes: usize,
    ) -> Result<(), ApiError> {
        let have = held.as_ref().map_or(0, OwnedSemaphorePermit::num_permits);
        let need = bytes.div_ceil(UNIT);
        if need <= have {
            return Ok(());
        }
        let more = u32::try_from(need - have).map_err(|_| self.body_refused())?;
        let permit = self
            .body_units
            .clone()
            .try_acquire_many_owned(more)
            .map_err(|_| self.body_refused())?;
        match held {
            Some(h) => h.merge(permit),
            None => *held = Some(permit),
        }
        Ok(())
    }

    fn body_refused(&self) -> ApiError {
        ApiError::Overloaded(format!(
            "this instance is already reading {} MiB of request bodies; retry later",
            self.max_body_buffer / (1024 * 1024)
        ))
    }
}

/// A request's place in its class budget, for as long as it lives (also when its client goes
/// away: it is dropped with the request's work).
pub struct ClassPermit {
    _permit: OwnedSemaphorePermit,
    gauge: Option<prometheus::IntGauge>,
}

impl Drop for ClassPermit {
    fn drop(&mut self) {
        if let Some(g) = &self.gauge {
            g.dec();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_budget_is_shared_and_given_back() {
        let l = Limits::new(
            ClassBudgets {
                engine: 10,
                write: 10,
                operator: 10,
            },
            10 * UNIT,
        );
        let mut a = None;
        l.reserve_body(&mut a, 3 * UNIT).unwrap();
        l.reserve_body(&mut a, 6 * UNIT + 1).unwrap();
        assert_eq!(a.as_ref().unwrap().num_permits(), 7);
        let mut b = None;
        assert_eq!(
            l.reserve_body(&mut b, 4 * UNIT).unwrap_err().code(),
            "overloaded"
        );
        assert!(b.is_none(), "a refusal reserves nothing");
        l.reserve_body(&mut b, 3 * UNIT).unwrap();
        drop(a);
        l.reserve_body(&mut b, 10 * UNIT).unwrap();
    }
}

#[cfg(test)]
mod class_tests {
    use super::*;

    #[test]
    fn each_class_has_its_own_room() {
        let l = Limits::new(
            ClassBudgets {
                engine: 2,
                write: 1,
                operator: 1,
            },
            UNIT,
        );
        let op = l.admit(Class::Operator, None).unwrap();
        assert_eq!(
            l.admit(Class::Operator, None).err().map(|e| e.code()),
            Some(crate::domain::ErrorCode::Overloaded)
        );
        let engine = (
            l.admit(Class::Engine, None).unwrap(),
            l.admit(Class::Engine, None).unwrap(),
        );
        assert!(l.admit(Class::Engine, None).is_err());
        assert!(
            l.admit(Class::Write, None).unwrap().is_some(),
            "writes have their own"
        );
        assert!(
            l.admit(Class::Probe, None).unwrap().is_none(),
            "probes have none"
        );
        drop((op, engine));
        assert!(l.admit(Class::Operator, None).is_ok());
    }
}
