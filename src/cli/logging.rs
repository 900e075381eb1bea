//! Log setup for the binary: `RUST_LOG`-style filters, pretty or JSON lines on stderr.

use tracing_subscriber::EnvFilter;

use super::args::LogFormat;

/// Installs the global subscriber. `RUST_LOG` overrides the default level (`info`; librdkafka's
/// own chatter is kept at `warn`).
pub fn init(format: LogFormat) {
    init_with_default(format, "info,rdkafka=warn");
}

/// Like [`init`], with another default filter for when `RUST_LOG` is not set.
pub fn init_with_default(format: LogFormat, default_filter: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Pretty => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
