//! `/v1/lists/{list}/entries`: upsert, delete and look up name-list entries. The request
//! bodies are parsed here into domain types; every entry is validated before anything is
//! written, so a bad entry anywhere leaves the store unchanged.

use actix_web::{HttpResponse, web};
use serde::Deserialize;
use serde_json::json;

use super::gate::Offload;
use super::json::JsonBody;
use super::query::Query;
use super::schemas::{ErrorBody, ListedDoc, RemovedDoc, WrittenDoc};
use crate::auth::Caller;
use crate::domain::{
    Dimension, ErrorCode, Expiry, ListName, Rules, Sandbox, ValidationError, Value, now_ms,
};
use crate::error::ApiError;
use crate::lists::{
    EntryRef, EverywhereOutcome, ListsPage, ListsQuery, MAX_REASON_LEN, NameLists, NewEntry,
    RawListsQuery, check_entry_count,
};

/// Up to 10,000 entries to add or refresh.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UpsertBody {
    entries: Vec<UpsertItem>,
}

/// One entry: at most one of `expires_at` / `ttl_seconds` (neither: never expires).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct UpsertItem {
    dimension: String,
    value: String,
    sandbox: Option<String>,
    ttl_seconds: Option<u64>,
    expires_at: Option<i64>,
    reason: Option<String>,
}

/// Up to 10,000 entries to delete.
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeleteBody {
    entries: Vec<RefItem>,
}

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct RefItem {
    dimension: String,
    value: String,
    sandbox: Option<String>,
}

/// One identity to look up on every list of a sandbox (`POST /v1/lists/-/lookup`), in a body
/// so that it stays out of URLs (and out of proxies' access logs).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LookupBody {
    /// A built-in dimension or `^[a-z][a-z0-9_]{0,31}$`.
    dimension: String,
    /// The value, as a check takes it (no ranges).
    value: String,
    /// The sandbox (default `default`).
    sandbox: Option<String>,
}

#[derive(Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
#[into_params(parameter_in = Query)]
pub struct LookupQuery {
    /// The sandbox (default `default`).
    sandbox: Option<String>,
}

/// The path of a list's entries: `/v1/lists/{list}/entries...`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct ListPath {
    /// `^[a-z0-9_-]{1,32}$`
    list: String,
}

/// An identity in a path: `.../{dimension}/{value}`.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Path)]
pub struct IdentityPath {
    /// A built-in dimension or `^[a-z][a-z0-9_]{0,31}$`
    dimension: String,
    /// The value (percent-encoded; the rest of the path)
    value: String,
}

/// The `{list}` of a path, parsed (a 400 at `path`).
fn list_name(path: web::Path<ListPath>) -> Result<ListName, ApiError> {
    ListName::try_from(path.into_inner().list).map_err(|e| e.at("path").into())
}

/// One entry as sent, its value normalised under `rules` in its sandbox.
fn entry_ref(
    i: usize,
    dimension: String,
    value: &str,
    sandbox: Option<String>,
    rules: &Rules,
) -> Result<EntryRef, ValidationError> {
    let dimension =
        Dimension::try_from(dimension).map_err(|e| e.at(format!("entries[{i}].dimension")))?;
    let sandbox =
        Sandbox::parse_or_default(sandbox).map_err(|e| e.at(format!("entries[{i}].sandbox")))?;
    let value = Value::parse_entry_with(&dimension, value, rules.norm(&sandbox))
        .map_err(|e| e.at(format!("entries[{i}].value")))?;
    Ok(EntryRef {
        dimension,
        value,
        sandbox,
    })
}

/// The list of a write's path and every entry of its body, each parsed by `parse` from its
/// index and item: all of them before anything is written.
fn entries<I, E>(
    list: web::Path<ListPath>,
    items: Vec<I>,
    mut parse: impl FnMut(usize, I) -> Result<E, ValidationError>,
) -> Result<(ListName, Vec<E>), ApiError> {
    let list = list_name(list)?;
    check_entry_count(items.len())?;
    let entries = items
        .into_iter()
        .enumerate()
        .map(|(i, item)| parse(i, item))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((list, entries))
}

fn new_entry(
    i: usize,
    item: UpsertItem,
    now: i64,
    rules: &Rules,
) -> Result<NewEntry, ValidationError> {
    let r = entry_ref(i, item.dimension, &item.value, item.sandbox, rules)?;
    let expiry = match (item.expires_at, item.ttl_seconds) {
        (Some(_), Some(_)) => {
            return Err(ValidationError::new(
                ErrorCode::InvalidExpiry,
                "give at most one of expires_at and ttl_seconds",
            )
            .at(format!("entries[{i}]")));
        }
        (Some(at), None) => {
            Expiry::at_ms(at, now).map_err(|e| e.at(format!("entries[{i}].expires_at")))?
        }
        (None, Some(ttl)) => {
            Expiry::after_ttl(ttl, now).map_err(|e| e.at(format!("entries[{i}].ttl_seconds")))?
        }
        (None, None) => Expiry::Never,
    };
    if let Some(r) = &item.reason
        && r.len() > MAX_REASON_LEN
    {
        return Err(ValidationError::new(
            ErrorCode::InvalidReason,
            format!("reason is longer than {MAX_REASON_LEN} bytes"),
        )
        .at(format!("entries[{i}].reason")));
    }
    Ok(NewEntry {
        dimension: r.dimension,
        value: r.value,
        sandbox: r.sandbox,
        expiry,
        reason: item.reason,
    })
}

#[utoipa::path(
    post,
    path = "/v1/lists/{list}/entries",
    summary = "Add or refresh entries (upsert, last write wins)",
    request_body = UpsertBody,
    params(ListPath),
    responses(
        (status = 200, description = "All entries written", body = WrittenDoc),
        (status = 400, description = "A bad body, list, dimension, value, expiry or reason, or over 10,000 entries; nothing is written", body = ErrorBody),
    )
)]
/// `POST /v1/lists/{list}/entries`
pub async fn upsert(
    lists: web::Data<NameLists>,
    list: web::Path<ListPath>,
    caller: Caller,
    body: JsonBody<UpsertBody>,
) -> Result<HttpResponse, ApiError> {
    let now = now_ms();
    let rules = lists.rules();
    let (list, entries) = entries(list, body.0.entries, |i, item| {
        new_entry(i, item, now, &rules)
    })?;
    let written = lists.upsert(&list, entries, &caller.name).await?;
    Ok(HttpResponse::Ok().json(json!({ "written": written })))
}

#[utoipa::path(
    delete,
    path = "/v1/lists/{list}/entries",
    summary = "Delete entries",
    request_body = DeleteBody,
    params(ListPath),
    responses(
        (status = 200, description = "Entries removed that were present and not yet expired", body = RemovedDoc),
        (status = 400, description = "A bad body, list, dimension or value, or over 10,000 entries; nothing is deleted", body = ErrorBody),
    )
)]
/// `DELETE /v1/lists/{list}/entries`
pub async fn remove(
    lists: web::Data<NameLists>,
    list: web::Path<ListPath>,
    caller: Caller,
    body: JsonBody<DeleteBody>,
) -> Result<HttpResponse, ApiError> {
    let rules = lists.rules();
    let (list, entries) = entries(list, body.0.entries, |i, item| {
        entry_ref(i, item.dimension, &item.value, item.sandbox, &rules)
    })?;
    let removed = lists.remove(&list, entries, &caller.name).await?;
    Ok(HttpResponse::Ok().json(json!({ "removed": removed })))
}

#[utoipa::path(
    get,
    path = "/v1/lists/{list}/entries/{dimension}/{value}",
    summary = "Look one entry up (the exact entry; a range by its own value)",
    params(ListPath, IdentityPath, LookupQuery),
    responses(
        (status = 200, description = "Listed, with its expiry, or not", body = ListedDoc),
        (status = 400, description = "A bad list, dimension, value or sandbox", body = ErrorBody),
    )
)]
/// `GET /v1/lists/{list}/entries/{dimension}/{value}?sandbox=S`: the exact entry (a range
/// is looked up by its own value, e.g. `10.1.2.0/24`, not by an address inside it).
pub async fn lookup(
    lists: web::Data<NameLists>,
    list: web::Path<ListPath>,
    identity: web::Path<IdentityPath>,
    query: Query<LookupQuery>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let list = list_name(list)?;
    let IdentityPath { dimension, value } = identity.into_inner();
    let dimension = Dimension::try_from(dimension).map_err(|e| e.at("path"))?;
    let sandbox =
        Sandbox::parse_or_default(query.into_inner().sandbox).map_err(|e| e.at("query"))?;
    let value = Value::parse_entry_with(&dimension, &value, lists.norm(&sandbox))
        .map_err(|e| e.at("path"))?;
    let entry = EntryRef {
        dimension,
        value,
        sandbox,
    };
    let found = offload
        .run(async move { Ok(lists.lookup(&list, &entry).await?) })
        .await?;
    Ok(HttpResponse::Ok().json(match found {
        Some(expiry) => json!({"listed": true, "expires_at": expiry.expires_at_ms()}),
        None => json!({"listed": false}),
    }))
}

#[utoipa::path(
    get,
    path = "/v1/lists",
    summary = "The (list, sandbox) pairs holding entries, paged",
    description = "In (list, sandbox) order, at most `limit` (1 to 1,000, default 100) a page; `next_cursor` continues, `null` after the last page. Each page costs the store O(log n + limit), filtered or not.",
    params(RawListsQuery),
    responses(
        (status = 200, description = "Approximate entry counts (kept on write), last change, hits since this instance started; `next_cursor`", body = ListsPage),
        (status = 400, description = "A bad filter (`invalid_list`, `invalid_sandbox`, `invalid_filter` for the limit) or cursor (`invalid_cursor`), an unknown parameter (`invalid_body`)", body = ErrorBody),
    )
)]
/// `GET /v1/lists?list=&sandbox=&limit=&cursor=`: one page of the (list, sandbox) pairs
/// holding entries, with their approximate counts, last changes and the hits this instance
/// answered.
pub async fn summaries(
    lists: web::Data<NameLists>,
    query: Query<RawListsQuery>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let query = ListsQuery::try_from(query.into_inner())?;
    offload
        .json(async move { Ok::<ListsPage, ApiError>(lists.summaries(&query).await?) })
        .await
}

/// The 200 of both ways to look an identity up on every list.
const EVERYWHERE: &str = "The hits over every list of the sandbox (ranges, segments and \
                          domains included); `truncated: true` when the sandbox has over 1,000 \
                          lists and only the first 1,000 by name were read";

#[utoipa::path(
    get,
    path = "/v1/lists/-/lookup/{dimension}/{value}",
    summary = "One identity on every list of a sandbox, as a check finds it",
    params(IdentityPath, LookupQuery),
    responses(
        (status = 200, description = EVERYWHERE, body = EverywhereOutcome),
        (status = 400, description = "A bad dimension, value (a check value: no ranges) or sandbox", body = ErrorBody),
    )
)]
/// `GET /v1/lists/-/lookup/{dimension}/{value}?sandbox=S`: the identity on every list of the
/// sandbox, as a check finds it (ranges, segments and domains included).
pub async fn lookup_everywhere(
    lists: web::Data<NameLists>,
    identity: web::Path<IdentityPath>,
    query: Query<LookupQuery>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let IdentityPath { dimension, value } = identity.into_inner();
    let sandbox =
        Sandbox::parse_or_default(query.into_inner().sandbox).map_err(|e| e.at("query"))?;
    everywhere(lists, dimension, value, sandbox, "path", offload).await
}

#[utoipa::path(
    post,
    path = "/v1/lists/-/lookup",
    summary = "One identity on every list of a sandbox, the identity in the body",
    description = "The same answer as `GET /v1/lists/-/lookup/{dimension}/{value}`, with the identity kept out of the URL (the console uses it).",
    request_body = LookupBody,
    responses(
        (status = 200, description = EVERYWHERE, body = EverywhereOutcome),
        (status = 400, description = "A bad body, dimension, value (a check value: no ranges) or sandbox", body = ErrorBody),
    )
)]
/// `POST /v1/lists/-/lookup` with `{"dimension", "value", "sandbox"}`: as
/// `lookup_everywhere`.
pub async fn lookup_posted(
    lists: web::Data<NameLists>,
    body: JsonBody<LookupBody>,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    let LookupBody {
        dimension,
        value,
        sandbox,
    } = body.0;
    let sandbox = Sandbox::parse_or_default(sandbox).map_err(|e| e.at("sandbox"))?;
    everywhere(lists, dimension, value, sandbox, "body", offload).await
}

/// Looks the identity up on the operator lane; a bad dimension or value is reported `at`.
async fn everywhere(
    lists: web::Data<NameLists>,
    dimension: String,
    value: String,
    sandbox: Sandbox,
    at: &'static str,
    offload: Offload,
) -> Result<HttpResponse, ApiError> {
    offload
        .json(async move {
            lists
                .lookup_everywhere(dimension, value, sandbox)
                .await
                .map_err(|e| match e {
                    crate::lists::ListsError::Invalid(v) => ApiError::from(v.at(at)),
                    other => ApiError::from(other),
                })
        })
        .await
}
