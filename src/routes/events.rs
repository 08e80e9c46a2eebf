//! `/v1/events`, `/v1/features` and `/v1/evaluate`: applying events, reading features, and
//! the one-call decision input.
//!
//! Event fields are read as raw JSON so that amounts keep their exact decimal text (166.6
//! stays 166.6, never a float) and group-by values are the same whether sent as a number or
//! a string of that number.

use std::collections::{BTreeMap, HashMap};

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value as Json, json};

use super::check::CheckBody;
use super::json::{JsonBody, decode, decode_part, describe};
use super::schemas::{ErrorBody, EvaluateDoc, FeaturesDoc};
use crate::auth::{Caller, Permission};
use crate::domain::{ErrorCode, EventType, MetricId, RuleId, ValidationError, shown_key};
use crate::error::ApiError;
use crate::lists::{CheckOutcome, FailMode, NameLists};
use crate::velocity::service::{IngestOutcome, MAX_VALUE_LEN, check_event_count};
use crate::velocity::{EventInput, Features, FieldValue, Fields, Velocity, VelocityError};

/// One event (a batch is `{"events": [...]}` of these).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EventBody {
    id: Option<String>,
    #[serde(rename = "type")]
    event_type: String,
    /// Unix ms (default now).
    ts: Option<i64>,
    /// Strings or numbers by field name.
    #[serde(default)]
    #[schema(value_type = Object)]
    fields: BTreeMap<String, Box<RawValue>>,
}

/// Raw field values to `Fields`; `null` means absent.
fn fields(raw: BTreeMap<String, Box<RawValue>>, at: &str) -> Result<Fields, ValidationError> {
    let mut out = Fields::new();
    for (name, v) in raw {
        let text = v.get().trim();
        let value = match text.as_bytes().first() {
            // A raw value may hold escapes that are not a valid string (a lone surrogate).
            Some(b'"') => match serde_json::from_str::<String>(text) {
                Ok(s) => FieldValue::Text(s),
                Err(e) => {
                    return Err(ValidationError::new(
                        ErrorCode::InvalidField,
                        format!("not a valid string: {e}"),
                    )
                    .at(format!("{at}fields.{}", shown_key(&name))));
                }
            },
            Some(b'-' | b'0'..=b'9') => FieldValue::Number(text.to_owned()),
            _ if text == "null" => continue,
            _ => {
                return Err(ValidationError::new(
                    ErrorCode::InvalidField,
                    "expected a string or a number",
                )
                .at(format!("{at}fields.{}", shown_key(&name))));
            }
        };
        if value.text().len() > MAX_VALUE_LEN {
            return Err(ValidationError::new(
                ErrorCode::InvalidField,
                format!("longer than {MAX_VALUE_LEN} bytes"),
            )
            .at(format!("{at}fields.{}", shown_key(&name))));
        }
        out.insert(name, value);
    }
    Ok(out)
}

impl EventBody {
    fn parse(self, at: &str) -> Result<EventInput, ValidationError> {
        Ok(EventInput {
            event_type: EventType::try_from(self.event_type)
                .map_err(|e| e.at(format!("{at}type")))?,
            id: self.id,
            ts: self.ts,
            fields: fields(self.fields, at)?,
        })
    }
}

#[utoipa::path(
    post,
    path = "/v1/events",
    summary = "Apply one event, or a batch `{\"events\": [...]}` of at most 1,000",
    request_body = EventBody,
    responses(
        (status = 200, description = "Metric updates applied, duplicate and late events", body = IngestOutcome),
        (status = 400, description = "A bad event (type, id, ts, amount, field) or over 1,000 events; the whole batch is refused", body = ErrorBody),
    )
)]
/// `POST /v1/events`: one event, or `{"events": [...]}` (at most 1,000).
pub async fn post_events(
    v: web::Data<Velocity>,
    body: JsonBody<HashMap<String, Box<RawValue>>>,
) -> Result<HttpResponse, ApiError> {
    let raw = body.0;
    let events: Vec<EventInput> = if raw.contains_key("events") {
        if raw.len() > 1 {
            return Err(ApiError::InvalidBody(
                "a batch is {\"events\": [...]} with nothing beside it".into(),
            ));
        }
        let list: Vec<EventBody> =
            decode_part(raw["events"].get().as_bytes()).map_err(|e| match e {
                // serde's path starts at the array: `[3].type: ...`.
                ApiError::InvalidBody(m) if m.starts_with('[') => {
                    ApiError::InvalidBody(format!("events{m}"))
                }
                ApiError::InvalidBody(m) => ApiError::InvalidBody(format!("events: {m}")),
                other => other,
            })?;
        check_event_count(list.len())?;
        list.into_iter()
            .enumerate()
            .map(|(i, e)| e.parse(&format!("events[{i}].")))
            .collect::<Result<_, _>>()?
    } else {
        let text = serde_json::to_string(&raw).expect("re-encoding JSON");
        let one: EventBody = decode(text.as_bytes())?;
        vec![one.parse("")?]
    };
    let outcome = v.ingest(&events).await?;
    Ok(HttpResponse::Ok().json(outcome))
}

/// Metrics to read for the entity the fields name, at `at` (default now).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct FeaturesBody {
    metrics: Vec<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    fields: BTreeMap<String, Box<RawValue>>,
    at: Option<i64>,
}

fn metric_ids(raw: Vec<String>, at: &str) -> Result<Vec<MetricId>, ValidationError> {
    raw.into_iter()
        .enumerate()
        .map(|(i, m)| MetricId::try_from(m).map_err(|e| e.at(format!("{at}[{i}]"))))
        .collect()
}

fn response_features(f: &Features) -> Json {
    let mut out = json!({ "values": f.values });
    if !f.capped.is_empty() {
        out["capped"] = json!(f.capped);
    }
    out
}

#[utoipa::path(
    post,
    path = "/v1/features",
    summary = "Read metric values for one entity",
    request_body = FeaturesBody,
    responses(
        (status = 200, description = "Values by metric id", body = FeaturesDoc),
        (status = 400, description = "A bad or undefined metric, a missing group-by field, over 64 metrics", body = ErrorBody),
    )
)]
/// `POST /v1/features`
pub async fn post_features(
    v: web::Data<Velocity>,
    body: JsonBody<FeaturesBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.0;
    let metrics = metric_ids(body.metrics, "metrics")?;
    let fields = fields(body.fields, "")?;
    let f = v.features(&metrics, &fields, body.at).await?;
    Ok(HttpResponse::Ok().json(response_features(&f)))
}

/// A check, an event, features and rules, in one call.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EvaluateBody {
    sandbox: Option<String>,
    #[serde(default)]
    lists: Vec<String>,
    #[serde(default)]
    #[schema(value_type = Object)]
    subjects: BTreeMap<String, Json>,
    event: Option<EventBody>,
    /// Group-by values beside (and under) the event's fields.
    #[serde(default)]
    #[schema(value_type = Object)]
    fields: BTreeMap<String, Box<RawValue>>,
    #[serde(default)]
    metrics: Vec<String>,
    #[serde(default)]
    rules: Vec<String>,
    /// Allow-list precedence over `lists` (see `/v1/check`).
    precedence: Option<Vec<String>>,
    /// As in `/v1/check`: a bad subject value is a 400 instead of an `invalid` entry.
    #[serde(default)]
    strict: bool,
}

#[utoipa::path(
    post,
    path = "/v1/evaluate",
    summary = "Everything for one request: list checks, the event, features, rules",
    description = "An `event` in the body also needs the permission `events` (403 `forbidden` without it, nothing applied).",
    request_body = EvaluateBody,
    responses(
        (status = 200, description = "Hits, features and rule outcomes", body = EvaluateDoc),
        (status = 400, description = "Any error of a check, an event or a features read", body = ErrorBody),
    )
)]
/// `POST /v1/evaluate`: list checks, the event, features and rules in one request. The list
/// checks and the metric work run concurrently; the event is applied before the features are
/// read, so they include it.
pub async fn post_evaluate(
    lists: web::Data<NameLists>,
    v: web::Data<Velocity>,
    caller: Caller,
    body: JsonBody<EvaluateBody>,
) -> Result<HttpResponse, ApiError> {
    let body = body.0;
    // Before anything is parsed or applied: recording an event is a permission of its own.
    if body.event.is_some() {
        caller.require(Permission::Events, "an event in POST /v1/evaluate")?;
    }
    let check = if body.lists.is_empty() {
        None
    } else {
        let mut check = json!({
            "sandbox": body.sandbox,
            "lists": body.lists,
            "subjects": body.subjects,
        });
        if let Some(order) = &body.precedence {
            check["precedence"] = json!(order);
        }
        if body.strict {
            check["strict"] = json!(true);
        }
        let check: CheckBody =
            serde_json::from_value(check).map_err(|e| ApiError::InvalidBody(describe(&e)))?;
        Some(check.parse(lists.rules())?)
    };
    if check.is_none() && !body.subjects.is_empty() {
        return Err(
            ValidationError::new(ErrorCode::InvalidLists, "subjects need lists to check").into(),
        );
    }
    if check.is_none() && body.precedence.is_some() {
        return Err(ValidationError::new(
            ErrorCode::InvalidLists,
            "precedence orders lists: give the lists to check",
        )
        .into());
    }
    let event = body.event.map(|e| e.parse("event.")).transpose()?;
    let mut fields = fields(body.fields, "")?;
    if let Some(e) = &event {
        fields.extend(e.fields.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    let rules: Vec<RuleId> = body
        .rules
        .into_iter()
        .enumerate()
        .map(|(i, r)| RuleId::try_from(r).map_err(|e| e.at(format!("rules[{i}]"))))
        .collect::<Result<_, _>>()?;
    let requested = metric_ids(body.metrics, "metrics")?;
    let mut needed = requested.clone();
    needed.extend(v.rule_metrics(&rules)?);

    let lists_work = async {
        match &check {
            Some(q) => lists.check(q).await.map(Some),
            None => Ok(None),
        }
    };
    let metrics_work = async {
        if needed.is_empty() && event.is_none() {
            Ok(Features::default())
        } else {
            v.apply_and_read(event.as_ref(), &needed, &fields).await
        }
    };
    let (checked, features) = futures::join!(lists_work, metrics_work);
    let outcome: Option<CheckOutcome> = checked?;
    let mut degraded = outcome.as_ref().is_some_and(|o| o.degraded);
    let stale = outcome.as_ref().and_then(|o| o.stale);
    let features = match features {
        Ok(f) => f,
        Err(VelocityError::Unavailable(e)) if lists.settings().fail_mode == FailMode::Open => {
            tracing::warn!(error = %e, "evaluate answers without features");
            degraded = true;
            Features::default()
        }
        Err(e) => return Err(e.into()),
    };
    let values: BTreeMap<&MetricId, &Json> = requested
        .iter()
        .map(|m| (m, features.values.get(m).unwrap_or(&Json::Null)))
        .collect();
    let decision = outcome.as_ref().and_then(|o| o.decision.clone());
    let invalid = outcome
        .as_ref()
        .map(|o| o.invalid.clone())
        .unwrap_or_default();
    let rules = v.evaluate_rules_deciding(
        &rules,
        &features.numbers,
        decision.as_ref().map(Option::as_ref),
    );
    let mut out = json!({
        "hits": outcome.map(|o| o.hits).unwrap_or_default(),
        "features": values,
        "rules": rules,
        "degraded": degraded,
    });
    if !features.capped.is_empty() {
        out["capped"] = json!(features.capped);
    }
    // The list part answered from the local tier alone: how stale it may be.
    if let Some(s) = stale {
        out["stale_ms"] = json!(s.stale_ms);
    }
    // Only with a precedence: without one the answer is what it always was.
    if let Some(d) = decision {
        out["decision"] = json!(d);
    }
    // Only when some subject value failed its dimension's rule (not strict).
    if !invalid.is_empty() {
        out["invalid"] = json!(invalid);
    }
    Ok(HttpResponse::Ok().json(out))
}
