//! `POST /v1/check`: the risk engine's per-request call.

use std::collections::BTreeMap;

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use super::json::JsonBody;
use crate::domain::ValidationError;
use crate::error::ApiError;
use crate::lists::{CheckQuery, NameLists, RawCheck};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckBody {
    sandbox: Option<String>,
    lists: Vec<String>,
    #[serde(default)]
    subjects: BTreeMap<String, OneOrMany>,
    /// Allow-list precedence: lists (each also in `lists`), first first.
    precedence: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl CheckBody {
    /// Parses and normalises the whole request (limits first, see `CheckQuery`).
    pub fn parse(self) -> Result<CheckQuery, ValidationError> {
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
        })?;
        match self.precedence {
            Some(order) => query.with_precedence(order),
            None => Ok(query),
        }
    }
}

/// `POST /v1/check`
pub async fn check(
    lists: web::Data<NameLists>,
    body: JsonBody<CheckBody>,
) -> Result<HttpResponse, ApiError> {
    let query = body.0.parse()?;
    let outcome = lists.check(&query).await?;
    Ok(HttpResponse::Ok().json(outcome))
}
