//! Delayed and scheduled delivery: send a record now, have it delivered later.
//!
//! [`Scheduler::send_after`] and [`Scheduler::send_at`] write the whole record into a Schedule
//! marker on the markers topic and return its [`ScheduleId`]: the marker's own partition and
//! offset. The tracker keeps only a 32-byte slot per schedule; when the record falls due it
//! reads the marker back, produces the record to its target topic, and writes an End. An End
//! written earlier by [`Scheduler::cancel`] makes the tracker forget it instead.
//!
//! The markers topic's retention is the only limit on how far ahead a record can be scheduled:
//! the marker must still be there when it falls due. The scheduler reads `retention.ms` when it
//! is created and refuses, with [`ClientError::BeyondRetention`], a due time too close to it.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::kafka::producer::QuietProducer;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::BaseConsumer;
use rdkafka::producer::FutureRecord;

use crate::events::{Event, EventBus, EventKind};
use crate::headers;
use crate::marker::{encode, Marker, ScheduledRecord, SourceRef};

use super::error::ClientError;
use super::schedule_scan::{self, Settled, Until};
use super::{kafka, markers_partitions};

/// Settings of a [`Scheduler`].
///
/// ```
/// use kafka_redelivery::client::SchedulerConfig;
/// let config = SchedulerConfig::new("localhost:9092", "orders.markers")
///     .set("client.id", "billing-scheduler");
/// assert_eq!(config.markers_topic, "orders.markers");
/// ```
#[derive(Clone)]
pub struct SchedulerConfig {
    /// Kafka bootstrap servers.
    pub brokers: String,
    /// The markers topic a tracker consumes; schedules are written there.
    pub markers_topic: String,
    /// How long [`Scheduler::cancel`] waits to learn whether a tracker that had already taken
    /// a due schedule delivered it (see there).
    pub settle_wait: Duration,
    /// Extra librdkafka settings, applied last.
    pub rdkafka: Vec<(String, String)>,
}

impl SchedulerConfig {
    /// A configuration with defaults (a 5 s settle wait).
    pub fn new(brokers: impl Into<String>, markers_topic: impl Into<String>) -> Self {
        SchedulerConfig {
            brokers: brokers.into(),
            markers_topic: markers_topic.into(),
            settle_wait: Duration::from_secs(5),
            rdkafka: Vec::new(),
        }
    }

    /// Adds a librdkafka setting.
    pub fn set(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.rdkafka.push((key.into(), value.into()));
        self
    }

    pub(crate) fn client_config(&self, own: &[(&str, &str)]) -> rdkafka::ClientConfig {
        crate::kafka::client_config(&self.brokers, own, &self.rdkafka)
    }
}

impl std::fmt::Debug for SchedulerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerConfig")
            .field("brokers", &self.brokers)
            .field("markers_topic", &self.markers_topic)
            .field("settle_wait", &self.settle_wait)
            .field("rdkafka", &crate::kafka::Redacted(&self.rdkafka))
            .finish()
    }
}

/// The message id of a schedule: where its Schedule marker sits in the markers topic. Shown
/// and parsed as `partition@offset`; the `kr-schedule-id` header on the delivered record is
/// `markers-topic/partition@offset`, which parses too.
///
/// ```
/// use kafka_redelivery::client::ScheduleId;
/// let id: ScheduleId = "3@42".parse().unwrap();
/// assert_eq!((id.partition, id.offset), (3, 42));
/// assert_eq!(id.to_string(), "3@42");
/// assert_eq!("orders.markers/3@42".parse::<ScheduleId>(), Ok(id));
/// assert!("3-42".parse::<ScheduleId>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ScheduleId {
    /// Markers partition of the Schedule marker.
    pub partition: i32,
    /// Offset of the Schedule marker.
    pub offset: i64,
}

impl std::fmt::Display for ScheduleId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}@{}", self.partition, self.offset)
    }
}

impl std::str::FromStr for ScheduleId {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || format!("`{s}` is not a schedule id (partition@offset)");
        // Topic names cannot contain '/', so whatever precedes one is the markers topic.
        let coordinates = s.rsplit('/').next().unwrap_or(s);
        let (p, o) = coordinates.split_once('@').ok_or_else(bad)?;
        let partition: i32 = p.parse().map_err(|_| bad())?;
        let offset: i64 = o.parse().map_err(|_| bad())?;
        if partition < 0 || offset < 0 {
            return Err(bad());
        }
        Ok(ScheduleId { partition, offset })
    }
}

/// What [`Scheduler::cancel`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelOutcome {
    /// The schedule was pending; it will never be delivered.
    Cancelled,
    /// It was already delivered to its target topic.
    AlreadyDelivered,
    /// It had been cancelled before.
    AlreadyCancelled,
    /// No schedule has this id (never written, or removed by the markers topic's retention).
    NotFound,
}

impl ScheduledRecord {
    /// A record for `topic`, with no key, value or headers yet; the partition is chosen from
    /// the key when it is delivered.
    pub fn to(topic: impl Into<String>) -> Self {
        ScheduledRecord {
            topic: topic.into(),
            partition: None,
            key: None,
            payload: None,
            headers: Vec::new(),
        }
    }

    /// Sets the record key.
    pub fn key(mut self, key: impl Into<Vec<u8>>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Sets the record value.
    pub fn payload(mut self, payload: impl Into<Vec<u8>>) -> Self {
        self.payload = Some(payload.into());
        self
    }

    /// Delivers to this partition rather than the key's.
    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    /// Adds a header.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        self.headers.push((name.into().into(), Some(value.into())));
        self
    }

    /// Caps this record's deliveries (the `kr-max-deliveries` header): its consumers
    /// dead-letter it after `n` deliveries, even if their retry policy allows more.
    pub fn max_deliveries(self, n: u32) -> Self {
        self.header(headers::MAX_DELIVERIES, n.to_string())
    }
}

/// Writes Schedule markers and cancels them. Cheap to clone; share one per process.
///
/// ```no_run
/// use std::time::Duration;
/// use kafka_redelivery::client::{CancelOutcome, ScheduledRecord, Scheduler, SchedulerConfig};
///
/// # async fn run() -> Result<(), kafka_redelivery::client::ClientError> {
/// let scheduler = Scheduler::new(SchedulerConfig::new("localhost:9092", "orders.markers")).await?;
/// let reminder = ScheduledRecord::to("emails").key("user-7").payload("your trial ends soon");
/// let id = scheduler.send_after(reminder, Duration::from_secs(3 * 24 * 3600)).await?;
/// // The user upgraded: no reminder.
/// match scheduler.cancel(id).await? {
///     CancelOutcome::Cancelled => {}
///     other => println!("too late to cancel {id}: {other:?}"),
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Scheduler {
    inner: Arc<Inner>,
}

struct Inner {
    config: SchedulerConfig,
    producer: QuietProducer,
    partitions: i32,
    /// `None`: the markers topic keeps records forever.
    retention: Option<Duration>,
    next_partition: AtomicUsize,
    events: EventBus,
}

/// How far before the markers topic's retention a schedule must fall due: a tenth of it, at
/// most an hour, so a tracker that is down for a while still finds the marker.
fn retention_margin(retention: Duration) -> Duration {
    (retention / 10).min(Duration::from_secs(3600))
}

impl Scheduler {
    /// Connects, checks the markers topic and reads its retention.
    pub async fn new(config: SchedulerConfig) -> Result<Self, ClientError> {
        let probe: BaseConsumer = config
            .client_config(&[("group.id", "kafka-redelivery-scheduler")])
            .create()
            .map_err(kafka("creating the metadata client"))?;
        let topic = config.markers_topic.clone();
        let partitions = tokio::task::spawn_blocking(move || markers_partitions(&probe, &topic))
            .await
            .map_err(|e| ClientError::MarkersTopic {
                topic: config.markers_topic.clone(),
                why: format!("metadata lookup failed: {e}"),
            })??;
        let retention = markers_retention(&config).await?;
        let producer: QuietProducer = config
            .client_config(&crate::kafka::DURABLE_PRODUCER)
            .create()
            .map_err(kafka("creating the schedule producer"))?;
        Ok(Scheduler {
            inner: Arc::new(Inner {
                config,
                producer,
                partitions,
                retention,
                next_partition: AtomicUsize::new(0),
                events: EventBus::default(),
            }),
        })
    }

    /// Events of this scheduler from now on: scheduled, cancelled. See [`crate::events`].
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<Event> {
        self.inner.events.subscribe()
    }

    /// How far ahead a record may be scheduled (the markers topic's retention less a margin);
    /// `None` when the topic keeps records forever.
    pub fn horizon(&self) -> Option<Duration> {
        self.inner
            .retention
            .map(|r| r.saturating_sub(retention_margin(r)))
    }

    /// Sends `record` to be delivered to its topic `delay` from now. The delay is measured on
    /// the broker's clock, from the moment the Schedule marker is appended.
    pub async fn send_after(
        &self,
        record: ScheduledRecord,
        delay: Duration,
    ) -> Result<ScheduleId, ClientError> {
        self.check_horizon(delay)?;
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.write(record, 0, delay_ms).await
    }

    /// Sends `record` to be delivered to its topic at `at` (as the broker's clock tells it).
    /// A time in the past means as soon as possible.
    pub async fn send_at(
        &self,
        record: ScheduledRecord,
        at: SystemTime,
    ) -> Result<ScheduleId, ClientError> {
        let due_in = at.duration_since(SystemTime::now()).unwrap_or_default();
        self.check_horizon(due_in)?;
        let at_ms = at
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        // 0 means "no absolute time" on the wire; the epoch itself is long past anyway.
        self.write(record, at_ms.max(1), 0).await
    }

    fn check_horizon(&self, due_in: Duration) -> Result<(), ClientError> {
        match (self.inner.retention, self.horizon()) {
            (Some(retention), Some(horizon)) if due_in > horizon => {
                Err(ClientError::BeyondRetention {
                    topic: self.inner.config.markers_topic.clone(),
                    due_in,
                    retention,
                })
            }
            _ => Ok(()),
        }
    }

    async fn write(
        &self,
        record: ScheduledRecord,
        not_before_ms: i64,
        delay_ms: u64,
    ) -> Result<ScheduleId, ClientError> {
        validate(&record)?;
        let inner = &self.inner;
        let n = inner.next_partition.fetch_add(1, Ordering::Relaxed);
        let partition = (n % inner.partitions.max(1) as usize) as i32;
        let target = record.topic.clone();
        let bytes = encode(&Marker::Schedule {
            not_before_ms,
            delay_ms,
            record: Box::new(record),
        });
        let sent = inner
            .producer
            .send(
                FutureRecord::<(), _>::to(&inner.config.markers_topic)
                    .partition(partition)
                    .payload(&bytes),
                Duration::from_secs(30),
            )
            .await;
        match sent {
            Ok(delivery) => {
                let id = ScheduleId {
                    partition: delivery.partition,
                    offset: delivery.offset,
                };
                inner.events.emit(|| {
                    Event::new(EventKind::Scheduled, self.marker_ref(id), 0).detail(target)
                });
                Ok(id)
            }
            Err(error) => Err(ClientError::Marker {
                marker: "schedule",
                record: SourceRef::new(target, -1, -1),
                error,
            }),
        }
    }

    /// Cancels a pending schedule. Not an error if it was already delivered, already
    /// cancelled, or never existed: the outcome says which.
    ///
    /// The scheduler reads the markers partition from the Schedule marker on to find out. If
    /// no End follows it, it writes one. A tracker that had already taken the schedule when
    /// the due time came may be producing it at that moment; if the End lands after the due
    /// time, the scheduler waits up to [`SchedulerConfig::settle_wait`] for that tracker's
    /// End and answers [`CancelOutcome::AlreadyDelivered`] if it comes. The scan reads every
    /// marker after the schedule in its partition, so it costs more the older the schedule is.
    pub async fn cancel(&self, id: ScheduleId) -> Result<CancelOutcome, ClientError> {
        let due_ms = match self.scan(id, Until::HighWatermark).await? {
            Settled::NotASchedule => return Ok(CancelOutcome::NotFound),
            Settled::EndedAt {
                timestamp_ms,
                due_ms,
                ..
            } => return Ok(ended_before_us(timestamp_ms, due_ms)),
            Settled::Pending { due_ms } => due_ms,
        };
        let inner = &self.inner;
        let source = SourceRef::new(inner.config.markers_topic.as_str(), id.partition, id.offset);
        let end = encode(&Marker::End {
            source: source.clone(),
        });
        let ours = inner
            .producer
            .send(
                FutureRecord::<(), _>::to(&inner.config.markers_topic)
                    .partition(id.partition)
                    .payload(&end),
                Duration::from_secs(30),
            )
            .await
            .map_err(|error| ClientError::Marker {
                marker: "end",
                record: source,
                error,
            })?
            .offset;
        // Whose End came first: read up to and including ours.
        match self.scan(id, Until::Offset(ours)).await? {
            Settled::EndedAt {
                offset,
                timestamp_ms,
                ..
            } if offset != ours => Ok(ended_before_us(timestamp_ms, due_ms)),
            Settled::EndedAt { timestamp_ms, .. } if timestamp_ms < due_ms => {
                Ok(self.cancelled(id))
            }
            // Ours landed at or after the due time: a tracker may have taken the schedule
            // just before reading it. If so, its End follows shortly.
            Settled::EndedAt { .. } => {
                let config = inner.config.clone();
                let later = blocking(move || schedule_scan::end_after(&config, id, ours)).await?;
                Ok(if later {
                    CancelOutcome::AlreadyDelivered
                } else {
                    self.cancelled(id)
                })
            }
            // Our End is durable, so the scan cannot miss it; this would be a broker bug.
            Settled::Pending { .. } | Settled::NotASchedule => Err(ClientError::Scan(format!(
                "the End written at {}@{ours} was not read back",
                id.partition
            ))),
        }
    }

    fn marker_ref(&self, id: ScheduleId) -> SourceRef {
        SourceRef::new(
            self.inner.config.markers_topic.as_str(),
            id.partition,
            id.offset,
        )
    }

    async fn scan(&self, id: ScheduleId, until: Until) -> Result<Settled, ClientError> {
        let config = self.inner.config.clone();
        blocking(move || schedule_scan::find(&config, id, until)).await
    }
}

impl Scheduler {
    fn cancelled(&self, id: ScheduleId) -> CancelOutcome {
        self.inner
            .events
            .emit(|| Event::new(EventKind::Cancelled, self.marker_ref(id), 0));
        CancelOutcome::Cancelled
    }
}

/// An End read before the due time can only be a cancel; the tracker writes its End after
/// delivering, which it does at the due time or later.
fn ended_before_us(end_timestamp_ms: i64, due_ms: i64) -> CancelOutcome {
    if end_timestamp_ms < due_ms {
        CancelOutcome::AlreadyCancelled
    } else {
        CancelOutcome::AlreadyDelivered
    }
}

/// Runs a blocking librdkafka read off the async runtime.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ClientError> + Send + 'static,
) -> Result<T, ClientError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| ClientError::Scan(format!("the scan thread failed: {e}")))?
}

/// Refuses what the marker format cannot carry.
fn validate(record: &ScheduledRecord) -> Result<(), ClientError> {
    let bad = |why: String| Err(ClientError::InvalidSchedule(why));
    if record.topic.is_empty() || record.topic.len() > 249 {
        return bad(format!("`{}` is not a Kafka topic name", record.topic));
    }
    if record.partition.is_some_and(|p| p < 0) {
        return bad("a partition cannot be negative".into());
    }
    if record.headers.len() > usize::from(u16::MAX) {
        return bad(format!(
            "{} headers; a schedule carries at most 65535",
            record.headers.len()
        ));
    }
    if record
        .headers
        .iter()
        .any(|(name, _)| name.as_bytes().len() > usize::from(u16::MAX))
    {
        return bad("a header name is longer than 65535 bytes".into());
    }
    if let Some((name, _)) = record.headers.iter().find(|(n, _)| n.as_str().is_none()) {
        return bad(format!(
            "header name {name:?} is not UTF-8; a schedule carries text names"
        ));
    }
    Ok(())
}

/// The markers topic's `retention.ms`; `None` when it is unlimited.
async fn markers_retention(config: &SchedulerConfig) -> Result<Option<Duration>, ClientError> {
    let admin: AdminClient<DefaultClientContext> = config
        .client_config(&[])
        .create()
        .map_err(kafka("creating the admin client"))?;
    let unusable = |why: String| ClientError::MarkersTopic {
        topic: config.markers_topic.clone(),
        why,
    };
    let results = admin
        .describe_configs(
            &[ResourceSpecifier::Topic(&config.markers_topic)],
            &AdminOptions::new().request_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .map_err(|e| unusable(format!("describing its configuration failed: {e}")))?;
    let resource = results
        .into_iter()
        .next()
        .ok_or_else(|| unusable("the broker returned no configuration".into()))?
        .map_err(|e| unusable(format!("describing its configuration failed: {e:?}")))?;
    let retention = resource
        .get("retention.ms")
        .and_then(|entry| entry.value.as_deref())
        .ok_or_else(|| unusable("its configuration has no retention.ms".into()))?;
    match retention.parse::<i64>() {
        Ok(ms) if ms < 0 => Ok(None),
        Ok(ms) => Ok(Some(Duration::from_millis(ms as u64))),
        Err(_) => Err(unusable(format!("retention.ms is `{retention}`"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_margin_is_a_tenth_of_retention_at_most_an_hour() {
        assert_eq!(
            retention_margin(Duration::from_secs(600)),
            Duration::from_secs(60)
        );
        assert_eq!(
            retention_margin(Duration::from_secs(7 * 24 * 3600)),
            Duration::from_secs(3600)
        );
    }

    #[test]
    fn records_the_format_cannot_carry_are_refused() {
        assert!(validate(&ScheduledRecord::to("orders").key("k")).is_ok());
        for bad in [
            ScheduledRecord::to(""),
            ScheduledRecord::to("x".repeat(250)),
            ScheduledRecord::to("orders").partition(-3),
        ] {
            assert!(
                matches!(validate(&bad), Err(ClientError::InvalidSchedule(_))),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn max_deliveries_is_a_header() {
        let r = ScheduledRecord::to("t").max_deliveries(3);
        assert_eq!(
            headers::text(&r.headers, headers::MAX_DELIVERIES),
            Some("3")
        );
    }
}
