//! Errors of the client library.

use crate::marker::SourceRef;

/// What went wrong in the client library.
///
/// ```no_run
/// use kafka_redelivery::client::{ClientError, ConsumerConfig, RedeliveryConsumer};
/// # async fn demo() {
/// // A markers topic that does not exist is refused up front, with a hint.
/// let config = ConsumerConfig::new("localhost:9092", "g", ["orders"], "missing.markers");
/// match RedeliveryConsumer::new(config).await {
///     Err(ClientError::MarkersTopic { topic, why }) => eprintln!("{topic}: {why}"),
///     Err(other) => eprintln!("{other}"),
///     Ok(_consumer) => {}
/// }
/// # }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// Some of the End markers of records acked together
    /// ([`Delivery::ack_many`](crate::client::Delivery::ack_many)) were not acknowledged by the
    /// broker. Those records will be redelivered after their timeout (duplicates, not losses);
    /// the others are settled.
    #[error(
        "writing the End markers of {failed} of {records} records acked together failed: {error}"
    )]
    Ends {
        /// How many records were acked together.
        records: usize,
        /// How many of them went into markers that failed.
        failed: usize,
        /// The first librdkafka error.
        error: rdkafka::error::KafkaError,
    },
    /// A schedule's due time is too close to the markers topic's retention: its marker could
    /// be deleted before the tracker delivers it. Raise `retention.ms` or schedule sooner.
    #[error(
        "cannot schedule {due_in:?} ahead: markers topic `{topic}` keeps records for \
         {retention:?} (schedules must fall due a tenth of that, at most an hour, earlier)"
    )]
    BeyondRetention {
        /// The markers topic.
        topic: String,
        /// How far ahead the record was to be delivered.
        due_in: std::time::Duration,
        /// The markers topic's `retention.ms`.
        retention: std::time::Duration,
    },
    /// A scheduled record the marker format cannot carry (bad topic name, negative partition,
    /// too many headers).
    #[error("invalid scheduled record: {0}")]
    InvalidSchedule(String),
    /// Reading the markers topic to settle a cancel failed.
    #[error("reading the markers topic: {0}")]
    Scan(String),
    /// The poll thread could not be started.
    #[error("cannot start the poll thread: {0}")]
    Thread(#[source] std::io::Error),
    /// The configuration asks for something the broker does not serve (KIP-848's
    /// `group.protocol=consumer` on a broker without it): refused at once, not waited for.
    #[error("the broker does not support this configuration: {0}")]
    Unsupported(String),
    /// The poll thread died (a panic: a bug, reported with its message) or did not stop in
    /// time. Records it had polled but not handed out are polled again by the next owner of
    /// their partitions; deliveries already handed out can still be settled.
    #[error("the poll thread {0}")]
    PollThread(String),
    /// A settlement future was polled again after it had resolved: a bug in the caller (an
    /// `async fn` would panic here).
    #[error("a settlement was polled after it had resolved")]
    PolledAfterDone,
}
