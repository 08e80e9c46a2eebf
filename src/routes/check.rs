//! `POST /v1/check`: the risk engine's per-request call.

use crate::domain::ErrorCode;
use std::collections::BTreeMap;

use actix_web::{HttpResponse, web};
use serde::Deserialize;

use super::json::JsonBody;
use crate::domain::{Dimension, ListName, Sandbox, ValidationError, Value};
use crate::error::ApiError;
use crate::lists::{CheckQuery, MAX_CHECK_LISTS, MAX_CHECK_VALUES, NameLists};

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckBody {
    sandbox: Option<String>,
    lists: Vec<String>,
    #[serde(default)]
    subjects: BTreeMap<String, OneOrMany>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl CheckBody {
    /// Parses and normalises the whole request; values of one dimension are deduplicated.
    pub fn parse(self) -> Result<CheckQuery, ValidationError> {
        // Sizes first: nothing is parsed (or deduplicated) past the limits.
        if self.lists.is_empty() || self.lists.len() > MAX_CHECK_LISTS {
            return Err(ValidationError::new(
                ErrorCode::InvalidLists,
                format!("lists must name 1 to {MAX_CHECK_LISTS} lists"),
            ));
        }
        let total: usize = self
            .subjects
            .values()
            .map(|v| match v {
                OneOrMany::One(_) => 1,
                OneOrMany::Many(v) => v.len(),
            })
            .sum();
        if total > MAX_CHECK_VALUES {
            return Err(ValidationError::new(
                ErrorCode::TooManyValues,
                format!("subjects hold {total} values; at most {MAX_CHECK_VALUES} per check"),
            ));
        }
        let sandbox = Sandbox::parse_or_default(self.sandbox).map_err(|e| e.at("sandbox"))?;
        let mut lists = Vec::with_capacity(self.lists.len());
        for (i, l) in self.lists.into_iter().enumerate() {
            let l = ListName::try_from(l).map_err(|e| e.at(format!("lists[{i}]")))?;
            if !lists.contains(&l) {
                lists.push(l);
            }
        }
        let mut subjects = Vec::with_capacity(self.subjects.len());
        for (name, values) in self.subjects {
            let dimension =
                Dimension::try_from(name.clone()).map_err(|e| e.at(format!("subjects.{name}")))?;
            let raw = match values {
                OneOrMany::One(v) => vec![v],
                OneOrMany::Many(v) => v,
            };
            let mut parsed: Vec<Value> = Vec::with_capacity(raw.len());
            for (i, v) in raw.iter().enumerate() {
                let v = Value::parse_check(&dimension, v)
                    .map_err(|e| e.at(format!("subjects.{name}[{i}]")))?;
                if !parsed.contains(&v) {
                    parsed.push(v);
                }
            }
            subjects.push((dimension, parsed));
        }
        Ok(CheckQuery {
            sandbox,
            lists,
            subjects,
        })
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
