//! The one table of stable error codes: for each, the HTTP statuses it is answered with and
//! when. API.md makes these strings part of the contract, so a code is never renamed and its
//! statuses never change; README's error table is checked against this one
//! (`tests/integration/error_codes.rs`). A call site names an `ErrorCode`, never a string.

use std::fmt;

/// Declares `ErrorCode` from rows `Variant = "code", [statuses];` (each with its "when" as
/// doc), so the enum, its strings and its statuses cannot disagree.
macro_rules! error_codes {
    ($( $(#[doc = $when:literal])* $variant:ident = $code:literal, [$($status:literal),*]; )*) => {
        /// A stable, machine-readable error code (the `code` of an error body).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum ErrorCode {
            $( $(#[doc = $when])* $variant, )*
        }

        impl ErrorCode {
            /// Every code, in table order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The code as sent (`invalid_value`).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorCode::$variant => $code,)*
                }
            }

            /// The HTTP statuses it is answered with (empty: never answered over HTTP, only
            /// reported by the tools).
            pub fn statuses(self) -> &'static [u16] {
                match self {
                    $(ErrorCode::$variant => &[$($status),*],)*
                }
            }
        }
    };
}

error_codes! {
    /// The body is not JSON (syntax, empty, invalid UTF-8, trailing data, numbers out of range).
    InvalidJson = "invalid_json", [400];
    /// JSON of the wrong shape: wrong type, missing or unknown field, bad query string.
    InvalidBody = "invalid_body", [400];
    /// Not a built-in dimension nor `^[a-z][a-z0-9_]{0,31}$`.
    UnknownDimension = "unknown_dimension", [400];
    /// A value that fails its dimension's rule, or a range in a check.
    InvalidValue = "invalid_value", [400];
    /// A list name outside its alphabet.
    InvalidList = "invalid_list", [400];
    /// A sandbox name outside its alphabet.
    InvalidSandbox = "invalid_sandbox", [400];
    /// Both `expires_at` and `ttl_seconds`, or a `ttl_seconds` of 0 or beyond 2156.
    InvalidExpiry = "invalid_expiry", [400];
    /// An `expires_at` not in the future.
    ExpiryInPast = "expiry_in_past", [400];
    /// A reason over 256 bytes.
    InvalidReason = "invalid_reason", [400];
    /// Over 10,000 entries in one upsert or delete.
    TooManyEntries = "too_many_entries", [400];
    /// Over 64 subject values in one check.
    TooManyValues = "too_many_values", [400];
    /// No lists, or over 16, in one check; a `precedence` that is empty or names a list the
    /// check does not.
    InvalidLists = "invalid_lists", [400];
    /// A check fanning out to over 4,096 lookups.
    TooManyLookups = "too_many_lookups", [400];
    /// A query filter that cannot be used: an unknown `op`, `since` after `until`, a `limit`
    /// outside 1 to 1,000 (audit and lists), a `value` without its `dimension`.
    InvalidFilter = "invalid_filter", [400];
    /// An audit or lists `cursor` that is not one this service handed out.
    InvalidCursor = "invalid_cursor", [400];
    /// A metric expression that does not parse (the message gives the column).
    InvalidExpr = "invalid_expr", [400];
    /// A resolution that does not divide the window or makes over 240 sub-windows.
    InvalidResolution = "invalid_resolution", [400];
    /// A rule expression that does not parse.
    InvalidRule = "invalid_rule", [400];
    /// 400: a rule or read naming an undefined metric; 404: GET or DELETE of one.
    UnknownMetric = "unknown_metric", [400, 404];
    /// 400: a read naming an undefined rule; 404: GET or DELETE of one.
    UnknownRule = "unknown_rule", [400, 404];
    /// A read missing a group-by field.
    MissingField = "missing_field", [400];
    /// A read naming over 64 metrics or rules.
    TooManyNames = "too_many_names", [400];
    /// A metric id outside its alphabet or length.
    InvalidMetricId = "invalid_metric_id", [400];
    /// A rule id outside its alphabet or length.
    InvalidRuleId = "invalid_rule_id", [400];
    /// An event type outside its alphabet or length.
    InvalidEventType = "invalid_event_type", [400];
    /// An event id outside its alphabet or length.
    InvalidEventId = "invalid_event_id", [400];
    /// A timestamp that is not a positive integer.
    InvalidTs = "invalid_ts", [400];
    /// An event over 5 minutes ahead.
    EventInFuture = "event_in_future", [400];
    /// An amount that is not a number with at most 4 decimals, or over 9×10^11.
    InvalidAmount = "invalid_amount", [400];
    /// An event field (or field name) that is not a string or number.
    InvalidField = "invalid_field", [400];
    /// Over 1,000 events in one batch (the whole batch is refused).
    TooManyEvents = "too_many_events", [400];
    /// DELETE of a metric a rule reads.
    MetricInUse = "metric_in_use", [409];
    /// PUT of a new metric or rule past `max_definitions`, or of a metric past
    /// `max_metrics_per_event` on its event type: nothing is stored.
    TooManyDefinitions = "too_many_definitions", [409];
    /// No valid `Authorization: Bearer` while tokens are configured.
    Unauthorized = "unauthorized", [401];
    /// The token lacks the permission the route needs (`POST /v1/evaluate` with an `event`
    /// also needs `events`).
    Forbidden = "forbidden", [403];
    /// The token is over its `rate` or its `max_concurrency` (with `Retry-After`).
    RateLimited = "rate_limited", [429];
    /// The body did not arrive within 10 s.
    RequestTimeout = "request_timeout", [408];
    /// The body is over `max_body_bytes`.
    PayloadTooLarge = "payload_too_large", [413];
    /// No such route.
    NotFound = "not_found", [404];
    /// The route exists but not with this method.
    MethodNotAllowed = "method_not_allowed", [405];
    /// The store did not answer within the deadline, or a primary a write needs is unreachable.
    StoreUnavailable = "store_unavailable", [503];
    /// A write refused unsent: a primary it needs has fewer online replicas than
    /// `write_replicas`.
    ReplicasUnavailable = "replicas_unavailable", [503];
    /// The keyspace is gone from Redis (restarted empty, flushed, replaced): writes are
    /// refused until it is restored; features cannot be read.
    KeyspaceLost = "keyspace_lost", [503];
    /// This instance is at the budget of the route's class (`max_in_flight_requests`,
    /// `max_in_flight_writes`, `max_in_flight_operator`) or at `max_buffered_body_bytes`.
    Overloaded = "overloaded", [503];
    /// A bug; details in the log only.
    Internal = "internal", [500];
    /// Import only: a row with no list and no `--list`.
    MissingList = "missing_list", [];
    /// Import only: a row with an empty dimension.
    MissingDimension = "missing_dimension", [];
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Not a code of the table.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no error code {0:?}")]
pub struct UnknownCode(pub String);

impl std::str::FromStr for ErrorCode {
    type Err = UnknownCode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        ErrorCode::ALL
            .iter()
            .copied()
            .find(|c| c.as_str() == s)
            .ok_or_else(|| UnknownCode(s.to_owned()))
    }
}

/// So that tests and logs can compare with the wire string.
impl PartialEq<&str> for ErrorCode {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_snake_case_and_parse_back() {
        let mut seen = std::collections::HashSet::new();
        for &c in ErrorCode::ALL {
            let s = c.as_str();
            assert!(seen.insert(s), "{s} twice");
            assert!(
                !s.is_empty() && s.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{s}"
            );
            assert_eq!(s.parse::<ErrorCode>(), Ok(c));
        }
        assert!("no_such_code".parse::<ErrorCode>().is_err());
    }
}
