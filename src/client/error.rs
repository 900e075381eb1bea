//! Errors of the client library.

use crate::marker::SourceRef;

/// What went wrong in the client library.
///
/// ```no_run
/// use kafka_redelivery::client::{ClientError, ConsumerConfig, RedeliveryConsumer};
/// // A markers topic that does not exist is refused up front, with a hint.
/// let config = ConsumerConfig::new("localhost:9092", "g", ["orders"], "missing.markers");
/// match RedeliveryConsumer::new(config) {
///     Err(ClientError::MarkersTopic { topic, why }) => eprintln!("{topic}: {why}"),
///     Err(other) => eprintln!("{other}"),
///     Ok(_consumer) => {}
/// }
/// ```
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A Kafka client could not be created or configured.
    #[error("kafka {what}: {source}")]
    Kafka {
        /// Which client or step failed.
        what: &'static str,
        /// The librdkafka error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
    /// The markers topic is missing or has no partitions.
    #[error("markers topic `{topic}` is not usable: {why}")]
    MarkersTopic {
        /// The markers topic.
        topic: String,
        /// What was found.
        why: String,
    },
    /// A marker about `source` was not acknowledged by the broker. For an ack, the record will
    /// be redelivered after its timeout (a duplicate, not a loss).
    #[error("writing the {marker} marker for {record} failed: {error}")]
    Marker {
        /// Which marker (`end`, `keep_alive`, ...).
        marker: &'static str,
        /// The record it was about.
        record: SourceRef,
        /// The librdkafka error.
        error: rdkafka::error::KafkaError,
    },
    /// The poll thread could not be started.
    #[error("cannot start the poll thread: {0}")]
    Thread(#[source] std::io::Error),
}
