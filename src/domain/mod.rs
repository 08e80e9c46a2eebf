//! Domain types: every value that crosses the HTTP boundary is parsed into one of these before
//! any handler or store sees it ("parse, don't validate"). A `ListName`, `Sandbox`, `Dimension`
//! or normalised `Value` in hand is valid by construction.

mod code;
mod dimension;
mod error;
mod expiry;
mod mask;
mod names;
mod page;
mod phone;
pub mod rules;
mod value;

pub use code::{ErrorCode, UnknownCode};
pub use dimension::Dimension;
pub use error::{ValidationError, shown_key};
pub use expiry::{Expiry, LATEST_EXPIRY_MS, now_ms};
pub use mask::mask_value;
pub use names::{EventType, FieldName, ListName, MetricId, RuleId, Sandbox};
pub(crate) use page::page_query;
pub use page::{DEFAULT_PAGE_LIMIT, MAX_PAGE_LIMIT, invalid_cursor, page_limit, text_or_number};
pub use rules::{LATEST_RULES, Norm, PhoneRegions, Rules};
pub use value::{
    IpFamily, IpValue, MAX_DOMAIN_LABELS, MAX_DOMAIN_LEN, MAX_LOCAL_LEN, MAX_SEGMENT_DIGITS, Value,
};
