//! How a tracker is configured. The CLI builds this; tests and the demo build it directly.

use std::time::Duration;

/// Settings of one tracker process. `Debug` hides secret librdkafka values.
#[derive(Clone)]
pub struct TrackerConfig {
    /// Kafka bootstrap servers, `host:port[,host:port...]`.
    pub brokers: String,
    /// The markers topic to consume.
    pub markers_topic: String,
    /// Consumer group shared by all replicas; markers partitions are spread across its members.
    pub group_id: String,
    /// Deliveries allowed per record before it goes to the dead-letter topic (at least 1).
    pub max_deliveries: u32,
    /// Dead-letter topic name; `{topic}` is replaced by the source topic.
    pub dlq_topic: String,
    /// How often committed markers offsets are moved forward.
    pub commit_interval: Duration,
    /// Most due deliveries handed to the redelivery worker at once.
    pub expiry_batch: usize,
    /// How long before their deadline the records of deliveries still in flight are read, so
    /// that a redelivery pass only has to produce the copies (`redeliver/read_ahead.rs`).
    /// Zero turns reading ahead off: every pass reads its records when they are due.
    pub read_ahead: Duration,
    /// Compacted topic for partition snapshots (bounded replay); `None` turns snapshots off.
    pub snapshots_topic: Option<String>,
    /// Take a snapshot of a partition when a restart would replay at least this many markers
    /// (the distance from the oldest item in flight to the newest marker).
    pub snapshot_after_markers: u64,
    /// Least time between two snapshots of one partition.
    pub snapshot_min_interval: Duration,
    /// The consumer group of the source topics, if the tracker should hold back the copy of a
    /// record that group has not committed past: its worker stopped before handing it out,
    /// and the group's next reader delivers it again anyway (`core/group_hold.rs`). `None`
    /// (the default) copies every due delivery at its deadline.
    pub source_group: Option<String>,
    /// Longest a copy is held back for `source_group`, from its deadline; then it is made
    /// anyway, so a group that never comes back still gets its records.
    pub source_group_wait: Duration,
    /// Extra librdkafka settings (`-X key=value`), applied to every client the tracker makes.
    pub rdkafka: Vec<(String, String)>,
}

impl TrackerConfig {
    /// A configuration with the documented defaults.
    pub fn new(brokers: impl Into<String>, markers_topic: impl Into<String>) -> Self {
        let markers_topic = markers_topic.into();
        TrackerConfig {
            brokers: brokers.into(),
            snapshots_topic: Some(format!("{markers_topic}.snapshots")),
            snapshot_after_markers: 100_000,
            snapshot_min_interval: Duration::from_secs(60),
            markers_topic,
            group_id: "redelivery-tracker".into(),
            max_deliveries: 5,
            dlq_topic: "{topic}.dlq".into(),
            commit_interval: Duration::from_secs(1),
            expiry_batch: 1_000,
            read_ahead: Duration::from_millis(100),
            source_group: None,
            source_group_wait: Duration::from_secs(120),
            rdkafka: Vec::new(),
        }
    }

    /// The dead-letter topic for records of `source_topic`.
    pub fn dlq_topic_for(&self, source_topic: &str) -> String {
        self.dlq_topic.replace("{topic}", source_topic)
    }

    /// A librdkafka config with the brokers and every `-X` override applied last, so an
    /// operator can change anything the tracker sets.
    pub(crate) fn client_config(&self, own: &[(&str, &str)]) -> rdkafka::ClientConfig {
        crate::kafka::client_config(&self.brokers, own, &self.rdkafka)
    }
}

impl std::fmt::Debug for TrackerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TrackerConfig")
            .field("brokers", &self.brokers)
            .field("markers_topic", &self.markers_topic)
            .field("group_id", &self.group_id)
            .field("max_deliveries", &self.max_deliveries)
            .field("dlq_topic", &self.dlq_topic)
            .field("commit_interval", &self.commit_interval)
            .field("expiry_batch", &self.expiry_batch)
            .field("read_ahead", &self.read_ahead)
            .field("snapshots_topic", &self.snapshots_topic)
            .field("snapshot_after_markers", &self.snapshot_after_markers)
            .field("snapshot_min_interval", &self.snapshot_min_interval)
            .field("source_group", &self.source_group)
            .field("source_group_wait", &self.source_group_wait)
            .field("rdkafka", &crate::kafka::Redacted(&self.rdkafka))
            .finish()
    }
}
