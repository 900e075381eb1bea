//! Errors that stop a tracker. Everything else (bad markers, failed produces, unreadable
//! records) is counted, logged and retried or skipped, and never stops it.

/// Why a tracker could not start or had to stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TrackerError {
    /// A Kafka client could not be created or subscribed; the message names which.
    #[error("kafka {what}: {source}")]
    Kafka {
        /// Which client or step failed.
        what: &'static str,
        /// The librdkafka error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The configuration is unusable.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// A worker thread ended unexpectedly.
    #[error("tracker thread failed: {0}")]
    Thread(String),
}

impl TrackerError {
    pub(crate) fn kafka(what: &'static str) -> impl FnOnce(rdkafka::error::KafkaError) -> Self {
        move |source| TrackerError::Kafka { what, source }
    }
}
