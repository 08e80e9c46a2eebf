//! `JsonBody<T>`: the request-body extractor of every `/v1` route. It reads at most the
//! configured number of bytes (a larger body is a 413, checked against `Content-Length`
//! before reading when there is one), accepts any content type, and turns every decoding
//! failure into a JSON 400 that says where the problem is (`entries[3].ttl_seconds: ...`).

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};
use futures::StreamExt;
use futures::future::LocalBoxFuture;
use serde::de::DeserializeOwned;

use super::limits::Limits;
use crate::error::ApiError;
use crate::metrics::Metrics;

/// How long a request body may take to arrive.
pub const BODY_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The body limit, as app data.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimit(pub usize);

/// A JSON request body decoded into `T`.
pub struct JsonBody<T>(pub T);

impl<T: DeserializeOwned + 'static> FromRequest for JsonBody<T> {
    type Error = ApiError;
    type Future = LocalBoxFuture<'static, Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, payload: &mut Payload) -> Self::Future {
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
            // The shared budget of buffered bodies (see `limits`), held until decoded.
            let mut held = None;
            let mut reserve = |bytes: usize| match &limits {
                Some(l) => l.reserve_body(&mut held, bytes).inspect_err(|_| {
                    if let Some(m) = &metrics {
                        m.overloaded.with_label_values(&["body_bytes"]).inc();
                    }
                }),
                None => Ok(()),
            };
            reserve(declared.unwrap_or(0))?;
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
            decode(&body).map(JsonBody)
        })
    }
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
                    ApiError::InvalidBody(inner.to_string())
                } else {
                    ApiError::InvalidBody(format!("{path}: {inner}"))
                }
            }
            _ => ApiError::InvalidJson(format!("body is not valid JSON: {inner}")),
        }
    })?;
    de.end()
        .map_err(|e| ApiError::InvalidJson(format!("body is not valid JSON: {e}")))?;
    Ok(value)
}

/// Why a non-object body is refused: broken JSON, or valid JSON of the wrong kind.
fn decode_value(body: &[u8]) -> Result<(), ApiError> {
    serde_json::from_slice::<serde::de::IgnoredAny>(body)
        .map(drop)
        .map_err(|e| ApiError::InvalidJson(format!("body is not valid JSON: {e}")))
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
