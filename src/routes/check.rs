//! `POST /v1/check`: the risk engine's per-request call.

use std::collections::BTreeMap;

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use super::json::JsonBody;
use super::schemas::ErrorBody;
use crate::domain::{Rules, ValidationError};
use crate::error::ApiError;
use crate::lists::{CheckOutcome, CheckQuery, NameLists, RawCheck};

/// Every subject value against every list, in one sandbox (default `default`).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckBody {
    sandbox: Option<String>,
    lists: Vec<String>,
    /// Values by dimension: one or many each (at most 64 in all).
    #[serde(default)]
    subjects: BTreeMap<String, OneOrMany>,
    /// Allow-list precedence: lists (each also in `lists`), first first.
    precedence: Option<Vec<String>>,
    /// A subject value that fails its dimension's rule is a 400 for the whole check (default
    /// false: it is reported in `invalid` and every other value is checked).
    #[serde(default)]
    strict: bool,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl CheckBody {
    /// Parses and normalises the whole request (limits first, see `CheckQuery`) under
    /// `rules` (`NameLists::rules`).
    pub fn parse(self, rules: Rules) -> Result<CheckQuery, ValidationError> {
        let query = CheckQuery::try_from(RawCheck {
            sandbox: self.sandbox,
            lists: self.lists,
            subjects: self
                .subjects
                .into_iter()
                .map(|(name, values)| {
                    let values = match values {
                        OneOrMany::One(v) => vec![v],
                        OneOrMany::Many(v) => v,
                    };
                    (name, values)
                })
                .collect(),
            strict: self.strict,
            rules,
        })?;
        match self.precedence {
            Some(order) => query.with_precedence(order),
            None => Ok(query),
        }
    }
}

#[utoipa::path(
    post,
    path = "/v1/check",
    summary = "Check every subject against every list, in one sandbox",
    request_body = CheckBody,
    responses(
        (status = 200, description = "Hits; `degraded` when fail-open answered from the local tier", body = CheckOutcome),
        (status = 400, description = "A bad body, list or dimension; a bad value only with `strict`; over 64 values, 16 lists or 4,096 lookups", body = ErrorBody),
    )
)]
/// `POST /v1/check`
pub async fn check(
    lists: web::Data<NameLists>,
    body: JsonBody<CheckBody>,
) -> Result<HttpResponse, ApiError> {
    let query = body.0.parse(lists.rules())?;
    let outcome = lists.check(&query).await?;
    Ok(HttpResponse::Ok().json(outcome))
}
