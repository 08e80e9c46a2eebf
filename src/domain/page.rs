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

/// Declares the query string of a paged read, as sent: `list` and `sandbox`, then the read's
/// own filters, then `limit` and `cursor`, every one an optional string that the read's
/// checked query parses (unknown parameters refused). Its fields are the OpenAPI parameters,
/// in that order.
macro_rules! page_query {
    (
        $(#[$attr:meta])*
        pub struct $name:ident {
            $( $(#[$field_attr:meta])* pub $field:ident: Option<String>, )*
        }
    ) => {
        $(#[$attr])*
        #[derive(Debug, Default, ::serde::Deserialize, ::utoipa::IntoParams)]
        #[serde(deny_unknown_fields)]
        #[into_params(parameter_in = Query)]
        pub struct $name {
            /// Only this list.
            pub list: Option<String>,
            /// Only this sandbox.
            pub sandbox: Option<String>,
            $( $(#[$field_attr])* pub $field: Option<String>, )*
            /// 1 to 1,000 (default 100).
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
