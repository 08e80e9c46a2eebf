//! `JsonBody<T>`: the request-body extractor of every `/v1` route. It reads at most the
//! configured number of bytes (a larger body is a 413, checked against `Content-Length`
//! before reading when there is one), accepts any content type, and turns every decoding
//! failure into a JSON 400 that says where the problem is (`entries[3].ttl_seconds: ...`).

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest, web};
use futures::StreamExt;
use futures::future::LocalBoxFuture;
use serde::de::DeserializeOwned;

use crate::error::ApiError;

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
        let mut payload = payload.take();
        Box::pin(async move {
            if declared.is_some_and(|n| n > limit) {
                return Err(ApiError::PayloadTooLarge { limit });
            }
            let mut body = web::BytesMut::with_capacity(declared.unwrap_or(1024).min(limit));
            while let Some(chunk) = payload.next().await {
                let chunk =
                    chunk.map_err(|e| ApiError::InvalidJson(format!("reading body: {e}")))?;
                if body.len() + chunk.len() > limit {
                    return Err(ApiError::PayloadTooLarge { limit });
                }
                body.extend_from_slice(&chunk);
            }
            decode(&body).map(JsonBody)
        })
    }
}

/// Decodes a JSON document, naming the path of a value of the wrong shape.
pub fn decode<T: DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::InvalidJson(
            "request body is empty; expected a JSON object".into(),
        ));
    }
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
        let e = decode::<Body>(b"{\"entries\":[]} x").unwrap_err();
        assert_eq!(e.code(), "invalid_json");
        let e = decode::<Body>(b"\xff\xfe").unwrap_err();
        assert_eq!(e.code(), "invalid_json");
        let e = decode::<Body>(br#"{"entries":[],"extra":1}"#).unwrap_err();
        assert_eq!(e.code(), "invalid_body");
        let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
        assert_eq!(
            decode::<serde_json::Value>(deep.as_bytes())
                .unwrap_err()
                .code(),
            "invalid_json",
            "nesting beyond serde_json's recursion limit is refused"
        );
    }
}
