//! What the operators' paged reads (`GET /v1/lists`, `GET /v1/audit`) share: the `list` and
//! `sandbox` filters first, a `limit` of 1 to [`MAX_PAGE_LIMIT`] items a page
//! ([`DEFAULT_PAGE_LIMIT`] when not given) and an opaque `cursor` last. They are declared and
//! checked here once, so that the two reads keep one name, one meaning and one place in the
//! OpenAPI document for each; what a cursor holds (a (list, sandbox) pair, a position in the
//! trail) stays each read's own.

use super::{ErrorCode, ValidationError};

/// Items per page when `limit` is not given.
pub const DEFAULT_PAGE_LIMIT: usize = 100;
/// Most items per page.
pub const MAX_PAGE_LIMIT: usize = 1_000;

/// The page size a `limit` asks for: [`DEFAULT_PAGE_LIMIT`] without one, else 1 to
/// [`MAX_PAGE_LIMIT`] (`invalid_filter` otherwise).
pub fn page_limit(raw: Option<String>) -> Result<usize, ValidationError> {
    let Some(raw) = raw else {
        return Ok(DEFAULT_PAGE_LIMIT);
    };
    raw.parse::<usize>()
        .ok()
        .filter(|l| (1..=MAX_PAGE_LIMIT).contains(l))
        .ok_or_else(|| {
            ValidationError::new(
                ErrorCode::InvalidFilter,
                format!("limit: expected 1 to {MAX_PAGE_LIMIT}"),
            )
        })
}

/// The refusal of a `cursor` this service did not hand out (`invalid_cursor`).
pub fn invalid_cursor() -> ValidationError {
    ValidationError::new(
        ErrorCode::InvalidCursor,
        "cursor: not a cursor this service handed out (use next_cursor as given)",
    )
}

/// A filter given as text or as a JSON scalar, as its text: a query string has only text, and a
/// JSON body may give a number (`"since": 1700000000000`). A JSON number keeps its spelling
/// (`1.5`, `1e3` as `1000.0`) and `true` is `"true"`, so that the read's checks refuse them as
/// they would refuse the same text (`invalid_filter`, naming the filter); `null` is no filter.
/// An array or an object is a malformed body (`invalid_body`).
pub fn text_or_number<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    struct Scalar;
    impl serde::de::Visitor<'_> for Scalar {
        type Value = Option<String>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a string or a number")
        }
        fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
            Ok(Some(v.to_owned()))
        }
        fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
            Ok(Some(format!("{v:?}")))
        }
        fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
            Ok(Some(v.to_string()))
        }
        fn visit_unit<E>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
    }
    d.deserialize_any(Scalar)
}

/// Declares the filters of a paged read, as sent in its query string (or, for the audit
/// trail, in a JSON body too): `list` and `sandbox`, then the read's own filters, then `limit`
/// and `cursor`, every one an optional string that the read's checked query parses (unknown
/// parameters refused). Its fields are the OpenAPI parameters, in that order, and the body's
/// schema.
macro_rules! page_query {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $( $(#[$field_attr:meta])* pub $field:ident: Option<String>, )*
        }
    ) => {
        #[derive(Debug, Default, ::serde::Deserialize, ::utoipa::IntoParams, ::utoipa::ToSchema)]
        #[serde(deny_unknown_fields)]
        #[into_params(parameter_in = Query)]
        $(#[$attr])*
        pub struct $name {
            /// Only this list.
            pub list: Option<String>,
            /// Only this sandbox.
            pub sandbox: Option<String>,
            $( $(#[$field_attr])* pub $field: Option<String>, )*
            /// 1 to 1,000 (default 100).
            #[serde(default, deserialize_with = "crate::domain::text_or_number")]
            #[schema(value_type = Option<u32>)]
            pub limit: Option<String>,
            /// A `next_cursor` as given.
            pub cursor: Option<String>,
        }
    };
}
pub(crate) use page_query;

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    struct Filter {
        #[serde(default, deserialize_with = "text_or_number")]
        since: Option<String>,
    }

    #[test]
    fn a_filter_is_its_text_whether_sent_as_text_or_as_a_json_scalar() {
        let json = |body: &str| serde_json::from_str::<Filter>(body).map(|f| f.since);
        assert_eq!(json(r#"{"since": "17"}"#).unwrap().as_deref(), Some("17"));
        assert_eq!(json(r#"{"since": 17}"#).unwrap().as_deref(), Some("17"));
        assert_eq!(json(r#"{"since": -17}"#).unwrap().as_deref(), Some("-17"));
        // Spelled so that the read refuses what it would refuse as text.
        assert_eq!(json(r#"{"since": 1.5}"#).unwrap().as_deref(), Some("1.5"));
        assert_eq!(
            json(r#"{"since": 1e3}"#).unwrap().as_deref(),
            Some("1000.0")
        );
        assert_eq!(json(r#"{"since": true}"#).unwrap().as_deref(), Some("true"));
        assert_eq!(json(r#"{"since": null}"#).unwrap(), None);
        assert_eq!(json("{}").unwrap(), None);
        assert!(json(r#"{"since": [17]}"#).is_err());
        assert!(json(r#"{"since": {"a": 1}}"#).is_err());
        let query = |q: &str| serde_urlencoded::from_str::<Filter>(q).map(|f| f.since);
        assert_eq!(query("since=17").unwrap().as_deref(), Some("17"));
        assert_eq!(query("since=").unwrap().as_deref(), Some(""));
        assert_eq!(query("").unwrap(), None);
    }

    #[test]
    fn a_limit_is_1_to_1000_and_100_without_one() {
        assert_eq!(page_limit(None), Ok(DEFAULT_PAGE_LIMIT));
        for (raw, want) in [("1", 1), ("1000", 1_000), ("42", 42)] {
            assert_eq!(page_limit(Some(raw.into())), Ok(want), "{raw}");
        }
        for raw in ["0", "1001", "-1", "", "ten", "1.5"] {
            let e = page_limit(Some(raw.into())).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidFilter, "{raw}");
            assert_eq!(e.message, "limit: expected 1 to 1000", "{raw}");
        }
    }
}
