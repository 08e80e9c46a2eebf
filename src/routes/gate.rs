//! The gate in front of every `/v1` route: what a request must pass, in order, before its
//! handler runs, each step as cheap as it can be and none holding anything shared that a
//! client could hold without sending:
//!
//! 1. **token** (`auth`): 401 without a valid one, 403 without the route's permission
//!    (`RouteDef::need`): from the head alone, nothing read;
//! 2. **the token's own limits**: 429 `rate_limited` + `Retry-After` past its rate or its
//!    concurrency; its place is held until the request ends (so a token's slow bodies count
//!    against that token alone);
//! 3. **the body** (`json::read_body`), counted against the shared body budget as it arrives;
//! 4. **the class budget** (`limits`): 503 `overloaded` when the route's class is full;
//! 5. the handler, with the request's `Caller` and body in its extensions. An operator's
//!    handler moves its work to the operator lane with [`Offload`], which keeps the class
//!    place until that work ends.
//!
//! Open routes (probes, `/metrics`, the documentation) have no gate.

use std::future::Future;
use std::sync::Arc;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Payload, ServiceRequest, ServiceResponse};
use actix_web::middleware::Next;
use actix_web::{FromRequest, HttpMessage, HttpRequest, HttpResponse, web};
use tracing::Instrument;

use super::json::read_body;
use super::limits::{ClassPermit, Limits};
use super::table::{Need, RouteDef};
use crate::auth::{Caller, Denied, Tokens};
use crate::error::ApiError;
use crate::lane::OperatorLane;
use crate::metrics::Metrics;

/// Runs a request through the gate of its route `def` (see the module docs).
pub async fn gate(
    def: RouteDef,
    req: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<BoxBody>, actix_web::Error> {
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let refuse = |req: ServiceRequest, e: ApiError| Ok(req.error_response(e).map_into_boxed_body());
    let denied = |d: Denied| {
        if let Some(m) = &metrics {
            m.auth_failures.with_label_values(&[d.label()]).inc();
        }
        ApiError::from(d)
    };

    // 1. Who, and may they.
    let tokens = req
        .app_data::<web::Data<Tokens>>()
        .cloned()
        .expect("the tokens are app data");
    let authorization = req
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let caller = match tokens.authenticate(authorization) {
        Ok(c) => c,
        Err(d) => return refuse(req, denied(d)),
    };
    if let Need::Permission(p) = def.need
        && let Err(d) = caller.require(p, &format!("{} {}", def.method, def.path))
    {
        return refuse(req, denied(d));
    }

    // 2. The token's own limits.
    let admitted = match caller.admit() {
        Ok(a) => a,
        Err(d) => return refuse(req, denied(d)),
    };

    // 3. The body, as it arrives.
    let mut req = req;
    if !matches!(def.method, "GET" | "HEAD") {
        let (http, payload) = req.parts_mut();
        match read_body(http, payload).await {
            Ok(body) => {
                req.extensions_mut().insert(body);
            }
            Err(e) => return refuse(req, e),
        }
    }

    // 4. A place in the class budget.
    let limits = req.app_data::<web::Data<Limits>>().cloned();
    let place = match limits.map(|l| l.admit(def.class, metrics.as_ref())) {
        Some(Ok(p)) => p.map(Arc::new),
        Some(Err(e)) => return refuse(req, e),
        None => None,
    };

    // 5. The handler.
    req.extensions_mut().insert(caller);
    if let Some(p) = &place {
        req.extensions_mut().insert(Place { _held: p.clone() });
    }
    let res = next
        .call(req)
        .await
        .map(ServiceResponse::map_into_boxed_body);
    drop((admitted, place));
    res
}

/// The request's place in its class budget, shared with work moved to the operator lane.
#[derive(Clone)]
struct Place {
    _held: Arc<ClassPermit>,
}

/// The caller, as the gate found it (anonymous where no gate ran: open routes).
impl FromRequest for Caller {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(Ok(req
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_else(Caller::anonymous)))
    }
}

/// Moves an operator's work to the operator lane (`lane`), with the request's class place.
pub struct Offload {
    lane: Option<web::Data<OperatorLane>>,
    place: Option<Place>,
}

impl FromRequest for Offload {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(Ok(Self {
            lane: req.app_data::<web::Data<OperatorLane>>().cloned(),
            place: req.extensions().get::<Place>().cloned(),
        }))
    }
}

impl Offload {
    /// Runs `work` on the operator lane (inline where no lane is configured: unit tests),
    /// in the request's span. The class place is held until `work` ends, even if the request
    /// is dropped first (its client left).
    pub async fn run<T, F>(self, work: F) -> Result<T, ApiError>
    where
        F: Future<Output = Result<T, ApiError>> + Send + 'static,
        T: Send + 'static,
    {
        let Some(lane) = self.lane else {
            return work.await;
        };
        let place = self.place;
        let span = tracing::Span::current();
        let turn = lane.turn();
        let task = lane.spawn(
            async move {
                let Some(turn) = turn.await else {
                    return Err(ApiError::Overloaded(
                        "operators' requests are queued past operator_deadline_ms".into(),
                    ));
                };
                let r = work.await;
                drop((turn, place));
                r
            }
            .instrument(span),
        );
        task.await
            .map_err(|e| ApiError::Internal(format!("operator work failed: {e}")))?
    }

    /// `run`, the answer serialised to JSON on the lane too (a page of 1,000 list counts or
    /// audit records is ~100 KB of JSON: written on an HTTP worker, it would delay the checks
    /// queued there).
    pub async fn json<T, F>(self, work: F) -> Result<HttpResponse, ApiError>
    where
        F: Future<Output = Result<T, ApiError>> + Send + 'static,
        T: serde::Serialize + Send + 'static,
    {
        let body = self
            .run(async move {
                let answer = work.await?;
                serde_json::to_vec(&answer).map_err(|e| ApiError::Internal(e.to_string()))
            })
            .await?;
        Ok(HttpResponse::Ok()
            .content_type("application/json")
            .body(body))
    }
}
