//! `Query<T>`: the query-string extractor of every `/v1` route, instead of actix's
//! `web::Query`, which logs the request path at debug when it fails (and the path of a lookup
//! is the value looked up: a phone number, an ID card). This one logs nothing; its 400 names
//! the parameter and what it expected, never the value sent (`json::describe`).

use actix_web::dev::Payload;
use actix_web::{FromRequest, HttpRequest};
use serde::de::DeserializeOwned;

use crate::error::ApiError;

/// A query string decoded into `T`.
pub struct Query<T>(pub T);

impl<T> Query<T> {
    pub fn into_inner(self) -> T {
        self.0
    }
}

impl<T> std::ops::Deref for Query<T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

/// Decodes a query string, naming the problem without quoting what was sent.
pub fn decode<T: DeserializeOwned>(query: &str) -> Result<T, ApiError> {
    serde_urlencoded::from_str::<T>(query)
        .map_err(|e| ApiError::InvalidBody(format!("query string: {}", super::json::describe(&e))))
}

impl<T: DeserializeOwned> FromRequest for Query<T> {
    type Error = ApiError;
    type Future = std::future::Ready<Result<Self, ApiError>>;

    fn from_request(req: &HttpRequest, _: &mut Payload) -> Self::Future {
        std::future::ready(decode(req.query_string()).map(Query))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Q {
        sandbox: Option<String>,
        limit: Option<u32>,
    }

    #[test]
    fn errors_never_quote_what_was_sent() {
        assert!(decode::<Q>("sandbox=loan&limit=5").is_ok());
        for q in [
            "13922223333=1",
            "limit=13922223333x",
            "sandbox=a&13922223333",
            "limit=13922223333",
        ] {
            let e = decode::<Q>(q).unwrap_err();
            assert_eq!(e.code(), "invalid_body");
            assert!(!e.to_string().contains("13922223333"), "{q}: {e}");
        }
    }
}
