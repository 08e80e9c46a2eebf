//! Limits on the work one instance takes on at once, so that many or slow clients cannot
//! exhaust its memory or its attention:
//!
//! - **requests in flight**: at most `max_in_flight_requests` `/v1` requests are handled at
//!   once; one more is answered `503 overloaded` (+ `Retry-After: 1`) at once, without reading
//!   its body. Probes and `/metrics` are not counted, so an overloaded instance still answers
//!   its orchestrator.
//! - **buffered body bytes**: request bodies are read into memory before decoding; all bodies
//!   being read or decoded share a budget of `max_buffered_body_bytes` (reserved up front from
//!   `Content-Length`, chunk by chunk otherwise). A body that does not fit is answered
//!   `503 overloaded`. With the per-body limit (`max_body_bytes`, 413) this bounds the memory
//!   of bodies in flight whatever clients send.
//!
//! Connections are bounded by `max_connections` (spread over the workers; more wait in the
//! listen backlog), a request's head must arrive within 10 s (408), its body within 10 s
//! (`request_timeout`), and idle keep-alive connections close after `keep_alive_secs`.

use std::sync::Arc;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::web;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::metrics::Metrics;

/// Bytes per body-budget permit (a semaphore counts permits in `u32`s).
const UNIT: usize = 1024;

/// The shared limits, as app data.
pub struct Limits {
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
    body_units: Arc<Semaphore>,
    max_body_buffer: usize,
}

impl Limits {
    pub fn new(max_in_flight: usize, max_body_buffer: usize) -> Self {
        let units = max_body_buffer.div_ceil(UNIT).min(Semaphore::MAX_PERMITS);
        Self {
            in_flight: Arc::new(Semaphore::new(max_in_flight.min(Semaphore::MAX_PERMITS))),
            max_in_flight,
            body_units: Arc::new(Semaphore::new(units)),
            max_body_buffer,
        }
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

/// Counts a request in flight for as long as it lives (also when its client goes away).
struct InFlight {
    _permit: OwnedSemaphorePermit,
    metrics: Option<web::Data<Metrics>>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(m) = &self.metrics {
            m.in_flight.dec();
        }
    }
}

/// Middleware: refuses a `/v1` request beyond `max_in_flight_requests`.
pub async fn limit_in_flight(
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let limits = req.app_data::<web::Data<Limits>>().cloned();
    let (Some(limits), true) = (limits, req.path().starts_with("/v1/")) else {
        return next
            .call(req)
            .await
            .map(ServiceResponse::map_into_left_body);
    };
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let Ok(permit) = limits.in_flight.clone().try_acquire_owned() else {
        if let Some(m) = &metrics {
            m.overloaded.with_label_values(&["in_flight"]).inc();
        }
        let refusal = ApiError::Overloaded(format!(
            "this instance is already handling {} requests; retry later",
            limits.max_in_flight
        ));
        // Answered here (not raised) so the outer middleware times and logs it.
        return Ok(req.error_response(refusal).map_into_right_body());
    };
    if let Some(m) = &metrics {
        m.in_flight.inc();
    }
    let _guard = InFlight {
        _permit: permit,
        metrics,
    };
    next.call(req)
        .await
        .map(ServiceResponse::map_into_left_body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_body_budget_is_shared_and_given_back() {
        let l = Limits::new(10, 10 * UNIT);
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
