//! How a [`super::RedeliveryConsumer`] is configured.

use std::time::Duration;

use super::retry::RetryPolicy;

/// Settings of a consumer that acknowledges records one by one.
///
/// ```
/// use std::time::Duration;
/// use kafka_redelivery::client::ConsumerConfig;
/// let config = ConsumerConfig::new("localhost:9092", "billing", ["orders"], "orders.markers")
///     .timeout(Duration::from_secs(60))
///     .max_unsettled(500)
///     .set("session.timeout.ms", "10000");
/// assert_eq!(config.max_unsettled, 500);
/// ```
#[derive(Clone)]
pub struct ConsumerConfig {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// The consumer group of the source topics.
    pub group_id: String,
    /// Source topics to consume.
    pub topics: Vec<String>,
    /// Where Start, KeepAlive and End markers go; the tracker consumes it.
    pub markers_topic: String,
    /// How long a delivery may stay unsettled before it is redelivered, unless the record's
    /// `kr-timeout-ms` header says otherwise or the application keeps it alive.
    pub default_timeout: Duration,
    /// Most deliveries handed out and not yet settled. At the bound, fetching pauses: memory
    /// stays bounded however slow the application is.
    pub max_unsettled: usize,
    /// Most records per poll batch (one batch of Start markers, one commit).
    pub max_batch: usize,
    /// Whether every delivery keeps itself alive while its handle lives (see
    /// [`super::Delivery::auto_keep_alive`]).
    pub auto_keep_alive: bool,
    /// How `Delivery::nack()` spaces redeliveries and when it gives up (see [`RetryPolicy`]).
    pub retry: RetryPolicy,
    /// Extra librdkafka settings, applied last to both the consumer and the markers producer.
    pub rdkafka: Vec<(String, String)>,
    /// Which marker format to write. Version 2 (the default) needs a tracker that reads it
    /// (0.3 or later); set version 1 while an older tracker still runs.
    pub marker_format: MarkerFormat,
    /// Version 2 only: how long settlements are gathered before their Settle marker is
    /// written. Each `ack()` waits this long at most, plus the write itself.
    pub settle_window: Duration,
    /// Version 2 only: most records one Settle marker names; a partition that reaches it is
    /// written at once, without waiting for the window.
    pub max_settle_batch: usize,
}

/// The marker format a client writes (see `docs/markers.md`). Trackers read both, mixed on one
/// markers topic; upgrade trackers first, then clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum MarkerFormat {
    /// One Start per record and one marker per settlement.
    V1,
    /// One Start per poll batch and source partition; settlements gathered per window.
    #[default]
    V2,
}

impl ConsumerConfig {
    /// A configuration with defaults: 30 s timeout, 1000 unsettled, batches of 500.
    pub fn new<T: Into<String>>(
        brokers: impl Into<String>,
        group_id: impl Into<String>,
        topics: impl IntoIterator<Item = T>,
        markers_topic: impl Into<String>,
    ) -> Self {
        ConsumerConfig {
            brokers: brokers.into(),
            group_id: group_id.into(),
            topics: topics.into_iter().map(Into::into).collect(),
            markers_topic: markers_topic.into(),
            default_timeout: Duration::from_secs(30),
            max_unsettled: 1_000,
            max_batch: 500,
            auto_keep_alive: false,
            retry: RetryPolicy::default(),
            rdkafka: Vec::new(),
            marker_format: MarkerFormat::default(),
            settle_window: Duration::from_millis(1),
            max_settle_batch: 1_000,
        }
    }

    /// Sets the marker format to write (default [`MarkerFormat::V2`]).
    pub fn marker_format(mut self, format: MarkerFormat) -> Self {
        self.marker_format = format;
        self
    }

    /// Sets how long settlements are gathered into one marker (version 2; default 1 ms). Zero
    /// still gathers what arrives while the previous marker is being queued.
    pub fn settle_window(mut self, window: Duration) -> Self {
        self.settle_window = window;
        self
    }

    /// Sets the most records per Settle marker (version 2; default 1000, at least 1, at most
    /// [`crate::marker::MAX_BATCH_RECORDS`]).
    pub fn max_settle_batch(mut self, n: usize) -> Self {
        self.max_settle_batch = n.clamp(1, crate::marker::MAX_BATCH_RECORDS);
        self
    }

    /// Sets the retry policy every delivery's `nack()` follows.
    pub fn retry(mut self, policy: RetryPolicy) -> Self {
        self.retry = policy;
        self
    }

    /// Sets the default delivery timeout.
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.default_timeout = timeout;
        self
    }

    /// Sets the bound on unsettled deliveries (at least 1). It also bounds the client's
    /// memory for record bytes: deliveries share their bodies in chunks of up to 32 KiB per
    /// poll batch, so `n` deliveries hold at most `n` chunks (or their own size, if larger).
    pub fn max_unsettled(mut self, n: usize) -> Self {
        self.max_unsettled = n.max(1);
        self
    }

    /// Sets the largest poll batch (at least 1).
    pub fn max_batch(mut self, n: usize) -> Self {
        self.max_batch = n.max(1);
        self
    }

    /// Turns automatic keep-alive on or off for every delivery.
    pub fn auto_keep_alive(mut self, on: bool) -> Self {
        self.auto_keep_alive = on;
        self
    }

    /// Adds a librdkafka setting. It applies to every client the consumer makes: the source
    /// consumer and both markers producers (Starts, written without linger, and
    /// settlements), so a `linger.ms` given here applies to Starts too.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.rdkafka.push((key.into(), value.into()));
        self
    }

    pub(crate) fn client_config(&self, own: &[(&str, &str)]) -> rdkafka::ClientConfig {
        crate::kafka::client_config(&self.brokers, own, &self.rdkafka)
    }
}

/// Hides secret librdkafka values.
impl std::fmt::Debug for ConsumerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerConfig")
            .field("brokers", &self.brokers)
            .field("group_id", &self.group_id)
            .field("topics", &self.topics)
            .field("markers_topic", &self.markers_topic)
            .field("default_timeout", &self.default_timeout)
            .field("max_unsettled", &self.max_unsettled)
            .field("max_batch", &self.max_batch)
            .field("auto_keep_alive", &self.auto_keep_alive)
            .field("retry", &self.retry)
            .field("marker_format", &self.marker_format)
            .field("settle_window", &self.settle_window)
            .field("max_settle_batch", &self.max_settle_batch)
            .field("rdkafka", &crate::kafka::Redacted(&self.rdkafka))
            .finish()
    }
}
