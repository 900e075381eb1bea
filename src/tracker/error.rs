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
    /// Kafka refused this tracker its consumer group or the markers topic from the start (a
    /// missing ACL): the broker's word on it. Waiting cannot fix it; granting the ACL can.
    #[error(
        "Kafka refused this tracker access since it started ({0}); grant its principal Read \
         on its consumer group and Read and Write on the markers topic (README, Security)"
    )]
    Refused(String),
}

impl TrackerError {
    pub(crate) fn kafka(what: &'static str) -> impl FnOnce(rdkafka::error::KafkaError) -> Self {
        move |source| TrackerError::Kafka { what, source }
    }
}
