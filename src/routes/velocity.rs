//! `/v1/metrics` and `/v1/rules`: run-time definitions of velocity metrics and rules.
//!
//! Both kinds are served alike: their put, get, list and delete handlers differ only in the
//! kind's names, types and wording, and in what a put reads from its body, so `definitions!`
//! writes the four once and each kind is one invocation of it.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::gate::Offload;
use super::json::JsonBody;
use super::schemas::{DeletedDoc, ErrorBody, MetricsDoc, RulesDoc};
use crate::domain::{MetricId, RuleId, ValidationError};
use crate::error::ApiError;
use crate::velocity::Velocity;
use crate::velocity::model::{MetricDef, RuleDef};

/// A metric: its expression and optional resolution (`1h`; the window must be a multiple).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MetricBody {
    expr: String,
    resolution: Option<String>,
}

/// A rule: comparisons of metric ids with numbers, joined by AND / OR.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RuleBody {
    expr: String,
}

/// The path of one definition: `/v1/metrics/{id}` or `/v1/rules/{id}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct IdPath {
    /// `^[a-z0-9_]{1,64}$`
    id: String,
}

/// A definition's `{id}`, parsed (a 400 at `path`).
fn path_id<I: TryFrom<String, Error = ValidationError>>(
    path: web::Path<IdPath>,
) -> Result<I, ApiError> {
    I::try_from(path.into_inner().id).map_err(|e| e.at("path").into())
}

/// Writes the put, get, list and delete handlers of one kind of definition, each with its
/// `#[utoipa::path]`, from
///
/// ```text
/// "noun", "plural": Id, Def, ListDoc, "/v1/plural", "/v1/plural/{id}";
/// put_handler(Body, "its 200", "its 400", "its 409") = |v, id, body| the service's put of them;
/// get_handler("its 200") = the service's read;
/// list_handler("its 200") = the service's list;
/// delete_handler(a response beside 200, 400 and 404, if any) = the service's delete;
/// ```
///
/// The summaries and the 404s are worded from the noun; the plural is the list's key.
macro_rules! definitions {
    (
        $noun:literal, $nouns:literal: $Id:ident, $Def:ident, $Doc:ident, $all:literal, $one:literal;
        $put:ident($Body:ident, $put_ok:literal, $put_bad:literal, $put_full:literal) = |$v:ident, $id:ident, $body:ident| $put_call:expr;
        $get:ident($get_ok:literal) = $read:ident;
        $list:ident($list_ok:literal) = $read_all:ident;
        $delete:ident($($in_use:tt)?) = $remove:ident;
    ) => {
        #[utoipa::path(
            put,
            path = $one,
            summary = concat!("Define or change a ", $noun),
            request_body = $Body,
            params(IdPath),
            responses(
                (status = 200, description = $put_ok, body = $Def),
                (status = 400, description = $put_bad, body = ErrorBody),
                (status = 409, description = $put_full, body = ErrorBody),
            )
        )]
        #[doc = concat!("`PUT ", $one, "`")]
        pub async fn $put(
            $v: web::Data<Velocity>,
            $id: web::Path<IdPath>,
            $body: JsonBody<$Body>,
            offload: Offload,
        ) -> Result<HttpResponse, ApiError> {
            let $id: $Id = path_id($id)?;
            let $body = $body.0;
            let def = offload.run(async move { Ok($put_call.await?) }).await?;
            Ok(HttpResponse::Ok().json(def))
        }

        #[utoipa::path(
            get,
            path = $one,
            summary = concat!("One ", $noun),
            params(IdPath),
            responses(
                (status = 200, description = $get_ok, body = $Def),
                (status = 400, description = "A bad id", body = ErrorBody),
                (status = 404, description = concat!("No such ", $noun, " (`unknown_", $noun, "`)"), body = ErrorBody),
            )
        )]
        #[doc = concat!("`GET ", $one, "`")]
        pub async fn $get(
            v: web::Data<Velocity>,
            id: web::Path<IdPath>,
        ) -> Result<HttpResponse, ApiError> {
            Ok(HttpResponse::Ok().json(v.$read(&path_id(id)?)?))
        }

        #[utoipa::path(
            get,
            path = $all,
            summary = concat!("Every ", $noun),
            responses(
                (status = 200, description = $list_ok, body = $Doc),
            )
        )]
        #[doc = concat!("`GET ", $all, "`")]
        pub async fn $list(v: web::Data<Velocity>) -> HttpResponse {
            HttpResponse::Ok().json(json!({ $nouns: v.$read_all() }))
        }

        #[utoipa::path(
            delete,
            path = $one,
            summary = concat!("Delete a ", $noun),
            params(IdPath),
            responses(
                (status = 200, description = "Deleted", body = DeletedDoc),
                (status = 400, description = "A bad id", body = ErrorBody),
                (status = 404, description = concat!("No such ", $noun, " (`unknown_", $noun, "`)"), body = ErrorBody),
                $($in_use,)?
            )
        )]
        #[doc = concat!("`DELETE ", $one, "`")]
        pub async fn $delete(
            v: web::Data<Velocity>,
            id: web::Path<IdPath>,
            offload: Offload,
        ) -> Result<HttpResponse, ApiError> {
            let id: $Id = path_id(id)?;
            let gone = id.clone();
            offload
                .run(async move { Ok(v.$remove(&gone).await?) })
                .await?;
            Ok(HttpResponse::Ok().json(json!({ "deleted": id })))
        }
    };
}

definitions! {
    "metric", "metrics": MetricId, MetricDef, MetricsDoc, "/v1/metrics", "/v1/metrics/{id}";
    put_metric(MetricBody, "The definition (a changed one gets a new version)", "A bad id, expression (the message gives the column) or resolution", "A new metric past `max_definitions`, or past `max_metrics_per_event` on its event type (`too_many_definitions`)") = |v, id, body| v.put_metric(id, &body.expr, body.resolution.as_deref());
    get_metric("The definition") = metric;
    list_metrics("Every definition") = list_metrics;
    delete_metric((status = 409, description = "A rule reads it (`metric_in_use`)", body = ErrorBody)) = delete_metric;
}

definitions! {
    "rule", "rules": RuleId, RuleDef, RulesDoc, "/v1/rules", "/v1/rules/{id}";
    put_rule(RuleBody, "The rule", "A bad id or expression, or a metric that is not defined", "A new rule past `max_definitions` (`too_many_definitions`)") = |v, id, body| v.put_rule(id, &body.expr);
    get_rule("The rule") = rule;
    list_rules("Every rule") = list_rules;
    delete_rule() = delete_rule;
}
