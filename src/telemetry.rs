//! Logging: `tracing` with JSON lines (or plain text for a terminal), filtered by `RUST_LOG`
//! (default `info`). Nothing logged by this crate carries a raw identifier: values appear as
//! fingerprints or masked.
//!
//! Dependencies are held to the same rule whatever `RUST_LOG` says: events of the targets in
//! [`SILENCED`] are dropped at every level, because they log what a caller sent (actix-web's
//! extractors log the request path, a looked-up phone number, when they fail; the service
//! uses its own extractors, and this is the second line).
//!
//! The subscriber's level hint is `RUST_LOG`'s: the silencing filter says it lets through
//! nothing above that level. Without the hint the stack's would be "unknown", so the global
//! level (and the `log` crate's, which actix and its dependencies log through) would be
//! TRACE, and every `log::trace!` on the request path would be built and judged, target by
//! target, only to be dropped.

use tracing::Subscriber;
use tracing_subscriber::filter::{EnvFilter, filter_fn};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

use crate::config::LogFormat;

/// Log targets never written, at any level (prefixes of the `log` crate's module targets).
pub const SILENCED: &[&str] = &[
    "actix_web::types",
    "actix_web::request_data",
    "actix_web::extract",
];

/// Whether events of `target` may be written at all.
pub fn allowed(target: &str) -> bool {
    !SILENCED.iter().any(|s| target.starts_with(s))
}

/// Installs the global subscriber. Safe to call more than once (later calls do nothing).
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let _ = subscriber(format, filter).try_init();
}

/// The subscriber: `format`'s layer to stderr behind `filter` and the silenced targets.
fn subscriber(format: LogFormat, filter: EnvFilter) -> impl Subscriber + Send + Sync {
    let mut silenced = filter_fn(|meta| allowed(meta.target()));
    if let Some(level) = filter.max_level_hint() {
        silenced = silenced.with_max_level_hint(level);
    }
    let layer = match format {
        LogFormat::Json => fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Text => fmt::layer().with_writer(std::io::stderr).boxed(),
    };
    tracing_subscriber::registry().with(layer.with_filter(filter).with_filter(silenced))
}

#[cfg(test)]
mod tests {
    use tracing::level_filters::LevelFilter;
    use tracing_subscriber::EnvFilter;

    use super::*;

    #[test]
    fn the_subscriber_says_rust_logs_level_so_nothing_finer_is_built() {
        for (directives, level) in [
            ("warn", LevelFilter::WARN),
            ("info", LevelFilter::INFO),
            ("warn,namelist=debug", LevelFilter::DEBUG),
            ("off", LevelFilter::OFF),
        ] {
            for format in [LogFormat::Json, LogFormat::Text] {
                let s = subscriber(format, EnvFilter::new(directives));
                assert_eq!(s.max_level_hint(), Some(level), "{directives}");
            }
        }
    }

    #[test]
    fn the_extractors_targets_are_silenced_and_ours_are_not() {
        assert!(!super::allowed("actix_web::types::query"));
        assert!(!super::allowed("actix_web::types::path"));
        assert!(!super::allowed("actix_web::request_data"));
        assert!(super::allowed("namelist::routes"));
        assert!(super::allowed("actix_server::builder"));
    }
}
