//! `JsonBody<T>`: the request-body extractor of every `/v1` route, and the reading of bodies
//! it relies on.
//!
//! A body is read by the route's gate (`gate`), before the request takes a place in its
//! class budget, into a [`Buffered`] held in the request's extensions; `JsonBody` decodes it
//! from there (or reads it itself where no gate ran). Reading takes at most the configured
//! number of bytes (a larger body is a 413, checked against `Content-Length` before reading
//! when there is one), within [`BODY_TIMEOUT`], and counts every chunk against the shared
//! budget of buffered bodies (`limits`) *as it arrives*: a client that announces 8 MiB and
//! sends nothing holds nothing of that budget. Any content type is accepted, and every
//! decoding failure is a JSON 400 that says where the problem is (`entries[3].ttl_seconds:
//! ...`) and what was expected, never what was sent ([`describe`]).

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpMessage, HttpRequest, web};
use futures::StreamExt;
use futures::future::LocalBoxFuture;
use serde::de::DeserializeOwned;
use tokio::sync::OwnedSemaphorePermit;

use super::limits::Limits;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// How long a request body may take to arrive.
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The body limit, as app data.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// A request body read into memory, holding its share of the body budget until dropped.
pub struct Buffered {
    pub bytes: web::Bytes,
    _held: Option<OwnedSemaphorePermit>,
}

/// Reads a request's body (see the module docs): what the gate and `JsonBody` share.
pub fn read_body(
    req: &HttpRequest,
    payload: &mut Payload,
) -> LocalBoxFuture<'static, Result<Buffered, ApiError>> {
    let limit = req
        .app_data::<web::Data<BodyLimit>>()
        .map_or(1024 * 1024, |l| l.0);
    let declared = req
        .headers()
        .get(actix_web::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    let limits = req.app_data::<web::Data<Limits>>().cloned();
    let metrics = req.app_data::<web::Data<Metrics>>().cloned();
    let mut payload = payload.take();
    Box::pin(async move {
        if declared.is_some_and(|n| n > limit) {
            return Err(ApiError::PayloadTooLarge { limit });
        }
        // The shared budget of buffered bodies (see `limits`), taken as bytes arrive.
        let mut held = None;
        let mut reserve = |bytes: usize| match &limits {
            Some(l) => l.reserve_body(&mut held, bytes).inspect_err(|_| {
                if let Some(m) = &metrics {
                    m.overloaded.with_label_values(&["body_bytes"]).inc();
                }
            }),
            None => Ok(()),
        };
        // Memory grows with what arrives, not with what a client claims will.
        let mut body = web::BytesMut::with_capacity(declared.unwrap_or(1024).min(64 * 1024));
        let read = async {
            while let Some(chunk) = payload.next().await {
                let chunk =
                    chunk.map_err(|e| ApiError::InvalidJson(format!("reading body: {e}")))?;
                if body.len() + chunk.len() > limit {
                    return Err(ApiError::PayloadTooLarge { limit });
                }
                reserve(body.len() + chunk.len())?;
                body.extend_from_slice(&chunk);
            }
            Ok(())
        };
        // A client that trickles its body must not hold a worker's attention forever.
        tokio::time::timeout(BODY_TIMEOUT, read)
            .await
            .map_err(|_| ApiError::RequestTimeout(BODY_TIMEOUT))??;
        Ok(Buffered {
            bytes: body.freeze(),
            _held: held,
        })
    })
}

/// A JSON request body decoded into `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for JsonBody<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
        let read = req.extensions_mut().remove::<Buffered>();
        match read {
            Some(body) => Box::pin(async move { decode(&body.bytes).map(JsonBody) }),
            None => {
                let reading = read_body(req, payload);
                Box::pin(async move { decode(&reading.await?.bytes).map(JsonBody) })
            }
        }
    }
}

/// A serde error's message with whatever it quotes of the input taken out: serde writes the
/// unexpected value or key (``invalid type: integer `13912345678` ``, ``unknown field
/// `13800138000` ``) before `, expected …`, which comes from our own types. What is left names
/// the kind of value and what was expected: ``invalid type: integer, expected a string``. An
/// unknown, duplicate or missing *field name* that is a plain name (`colour`; never a number)
/// is kept,
/// since it is the caller's spelling of one of ours, not a value.
pub fn describe(e: &dyn std::fmt::Display) -> String {
    let text = e.to_string();
    let (head, tail) = text.split_at(text.find(", expected").unwrap_or(text.len()));
    let names_a_field = [
        "unknown field",
        "unknown variant",
        "duplicate field",
        "missing field",
    ]
    .iter()
    .any(|p| head.starts_with(p));
    let mut out = String::with_capacity(text.len());
    let mut quoted: Option<(char, String)> = None;
    for c in head.chars() {
        match &mut quoted {
            Some((q, inner)) if c == *q => {
                if names_a_field && crate::domain::shown_key(inner) == inner {
                    out.push('`');
                    out.push_str(inner);
                    out.push('`');
                }
                quoted = None;
            }
            Some((_, inner)) => inner.push(c),
            None if c == '`' || c == '"' => quoted = Some((c, String::new())),
            None => out.push(c),
        }
    }
    // An unterminated quote drops the rest of the head: better too little than a value.
    let mut out = out.split_whitespace().collect::<Vec<_>>().join(" ");
    out.push_str(tail);
    out
}

/// Decodes a request body: a JSON object (serde would fill a struct from an array, field by
/// field, so an array is refused here), naming the path of a value of the wrong shape.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    match body.iter().find(|b| !b.is_ascii_whitespace()) {
        None => {
            return Err(ApiError::InvalidJson(
                "request body is empty; expected a JSON object".into(),
            ));
        }
        Some(b) if *b != b'{' => {
            return Err(decode_value(body).map_or_else(
                |e| e,
                |_| ApiError::InvalidBody("the body must be a JSON object".into()),
            ));
        }
        Some(_) => {}
    }
    decode_part(body)
}

/// Decodes any JSON document (a part of a body already known to be an object).
pub fn decode_part<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let mut de = serde_json::Deserializer::from_slice(body);
    let value = serde_path_to_error::deserialize(&mut de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match inner.classify() {
            serde_json::error::Category::Data => {
                if path == "." {
                    ApiError::InvalidBody(describe(&inner))
                } else {
                    ApiError::InvalidBody(format!("{}: {}", safe_path(&path), describe(&inner)))
                }
            }
            _ => ApiError::InvalidJson(format!("body is not valid JSON: {}", describe(&inner))),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::InvalidJson(format!("body is not valid JSON: {}", describe(&e))))?;
    Ok(value)
}

/// A serde path (`entries[3].value`, `subjects.phone[0]`) with every map key that is not a
/// plain name (`^[A-Za-z_][A-Za-z0-9_]{0,63}$`) replaced by `?`: keys are the caller's too,
/// and one may be a phone number.
pub fn safe_path(path: &str) -> String {
    let plain = |k: &str| crate::domain::shown_key(k) == k;
    let mut out = String::with_capacity(path.len());
    for (i, segment) in path.split('.').enumerate() {
        if i > 0 {
            out.push('.');
        }
        let (key, index) = segment.split_at(segment.find('[').unwrap_or(segment.len()));
        let indices = index.is_empty()
            || index
                .strip_prefix('[')
                .and_then(|i| i.strip_suffix(']'))
                .is_some_and(|i| {
                    i.split("][")
                        .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                });
        match ((key.is_empty() && i == 0) || plain(key), indices) {
            (true, true) => out.push_str(segment),
            (false, true) => {
                out.push('?');
                out.push_str(index);
            }
            (_, false) => out.push('?'),
        }
    }
    out
}

/// Why a non-object body is refused: broken JSON, or valid JSON of the wrong kind.
fn decode_value(body: &[u8]) -> Result<(), ApiError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map(drop)
        .map_err(|e| ApiError::InvalidJson(format!("body is not valid JSON: {}", describe(&e))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Body {
        entries: Vec<Item>,
    }
    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Item {
        value: String,
    }

    #[test]
    fn errors_name_the_place() {
        let e = decode::<Body>(br#"{"entries":[{"value":"a"},{"value":5}]}"#).unwrap_err();
        assert_eq!(e.code(), "invalid_body");
        assert!(e.to_string().starts_with("entries[1].value:"), "{e}");
        let e = decode::<Body>(br#"{"entries":[{"value":"a""#).unwrap_err();
        assert_eq!(e.code(), "invalid_json");
        let e = decode::<Body>(br#"[[{"value":"a"}]]"#).unwrap_err();
        assert_eq!(e.code(), "invalid_body", "an array is not a body");
        let e = decode::<Body>(b"{\"entries\":[]} x").unwrap_err();
        assert_eq!(e.code(), "invalid_json");
        let e = decode::<Body>(b"\xff\xfe").unwrap_err();
        assert_eq!(e.code(), "invalid_json");
        let e = decode::<Body>(br#"{"entries":[],"extra":1}"#).unwrap_err();
        assert_eq!(e.code(), "invalid_body");
        // Nothing the caller sent is quoted back: values, keys, unknown fields.
        for (body, expected) in [
            (
                r#"{"entries":[{"value":13912345678}]}"#,
                "entries[0].value: invalid type: integer, expected a string",
            ),
            (
                r#"{"entries":[{"value":"a","13800138000":1}]}"#,
                "entries[0].?: unknown field, expected `value`",
            ),
            (
                r#"{"entries":[{"value":true}]}"#,
                "entries[0].value: invalid type: boolean, expected a string",
            ),
        ] {
            let e = decode::<Body>(body.as_bytes()).unwrap_err();
            assert!(e.to_string().starts_with(expected), "{body}: {e}");
        }
        let e =
            decode::<std::collections::BTreeMap<String, Vec<u8>>>(br#"{"13800138000":[1,"x"]}"#)
                .unwrap_err();
        assert!(!e.to_string().contains("13800138000"), "{e}");
        assert!(
            e.to_string().starts_with("?[1]: invalid type: string"),
            "{e}"
        );
        let e = decode::<Body>(br#"{"entries":[],"colour":1}"#).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("colour: unknown field `colour`, expected"),
            "{e}"
        );
        assert_eq!(safe_path("entries[3].value"), "entries[3].value");
        assert_eq!(safe_path("subjects.phone[0]"), "subjects.phone[0]");
        assert_eq!(safe_path("fields.13800138000"), "fields.?");
        assert_eq!(safe_path("fields.[1380013800"), "fields.?");
        assert_eq!(safe_path("fields.a[1][x]"), "fields.?");
        let deep = format!("{}1{}", "{\"a\":".repeat(10_000), "}".repeat(10_000));
        assert_eq!(
            decode::<serde_json::Value>(deep.as_bytes())
                .unwrap_err()
                .code(),
            "invalid_json",
            "nesting beyond serde_json's recursion limit is refused"
        );
    }
}
