//! The client library: a Kafka consumer whose records are acknowledged one by one.
//!
//! [`RedeliveryConsumer`] polls the source topics on a background thread, writes a Start marker
//! for each record, commits only what those markers cover, and hands each record out as a
//! [`Delivery`] to settle. See `poller` for the protocol steps and ARCHITECTURE.md for why
//! nothing is lost.
//!
//! ```no_run
//! use std::time::Duration;
//! use kafka_redelivery::client::{ConsumerConfig, RedeliveryConsumer};
//!
//! # async fn work() -> Result<(), Box<dyn std::error::Error>> {
//! let config = ConsumerConfig::new("localhost:9092", "billing", ["orders"], "orders.markers");
//! let mut consumer = RedeliveryConsumer::new(config).await?;
//! while let Some(delivery) = consumer.recv().await {
//!     match delivery.payload() {
//!         Some(b"poison") => delivery.reject("cannot parse").await?,
//!         Some(b"later") => delivery.nack_after(Duration::from_secs(60)).await?,
//!         Some(_) if delivery.attempt() < 3 => delivery.nack().await?, // the retry policy
//!         _ => delivery.ack().await?,
//!     }
//! }
//! # Ok(()) }
//! ```

mod answer;
mod body;
mod broker_check;
mod coalesce;
mod concurrent;
mod config;
mod context;
mod delivery;
mod error;
mod lease;
mod poller;
mod retry;
mod schedule_scan;
mod scheduler;
mod settlement;
mod settler;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kafka::producer::QuietProducer;
use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::runtime::Handle;
use tokio::sync::mpsc;

pub use config::{ConsumerConfig, MarkerFormat};
pub use delivery::Delivery;
pub use error::ClientError;
pub use retry::{Backoff, RetryPolicy};
pub use scheduler::{CancelOutcome, ScheduleId, Scheduler, SchedulerConfig};
pub use settlement::Settlement;

/// The record a schedule carries; build one with [`ScheduledRecord::to`].
pub use crate::marker::ScheduledRecord;

use coalesce::Coalescer;
use context::PollContext;
use poller::Poller;
use settler::{MarkerWriter, Settler};

/// A consumer that hands out records as [`Delivery`] handles and guarantees, with a running
/// tracker, that each record is acked, dead-lettered, or redelivered.
///
/// Settle deliveries concurrently for throughput: each settle waits for one marker to be
/// durable, and the bound on unsettled deliveries keeps the number in hand limited.
///
/// ```no_run
/// use kafka_redelivery::client::{ConsumerConfig, RedeliveryConsumer};
///
/// # async fn run() -> Result<(), kafka_redelivery::client::ClientError> {
/// let config = ConsumerConfig::new("localhost:9092", "mailer", ["emails"], "emails.markers")
///     .max_unsettled(256);
/// let mut consumer = RedeliveryConsumer::new(config).await?;
/// while let Some(delivery) = consumer.recv().await {
///     tokio::spawn(async move {
///         // ... send the e-mail ...
///         if let Err(e) = delivery.ack().await {
///             eprintln!("ack failed, the e-mail may be sent again: {e}");
///         }
///     });
/// }
/// # Ok(()) }
/// ```
pub struct RedeliveryConsumer {
    deliveries: mpsc::Receiver<Vec<Delivery>>,
    /// The rest of the batch `recv` last took from the channel. Taken one by one from the
    /// batch's own vector: moving a batch of 2,000 deliveries into a queue first was a
    /// memcpy of about 400 KB per batch in the client's profile.
    ready: std::vec::IntoIter<Delivery>,
    auto_keep_alive: bool,
    settler: Arc<Settler>,
    stop: Arc<AtomicBool>,
    /// Why the poll thread died, if it did (set before the delivery channel closes).
    died: Arc<Mutex<Option<String>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// How long [`RedeliveryConsumer::close`] waits for the poll thread: a poll, a batch's Starts
/// and one commit, each bounded by librdkafka's own timeouts, fit well within it.
const CLOSE_WAIT: Duration = Duration::from_secs(30);

impl RedeliveryConsumer {
    /// Connects, checks the markers topic, subscribes and starts polling. The metadata lookup
    /// (up to 10 s against a slow broker) runs on a blocking thread, not on the caller's
    /// async runtime.
    pub async fn new(config: ConsumerConfig) -> Result<Self, ClientError> {
        // The runtime the settlements' delivery reports are awaited on: the caller's.
        let runtime = tokio::runtime::Handle::current();
        tokio::task::spawn_blocking(move || Self::connect(config, runtime))
            .await
            .map_err(|e| ClientError::PollThread(format!("could not be set up: {e}")))?
    }

    fn connect(config: ConsumerConfig, runtime: Handle) -> Result<Self, ClientError> {
        let consumer: BaseConsumer<PollContext> = config
            .client_config(&[
                ("group.id", &config.group_id),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("auto.offset.reset", "earliest"),
                crate::kafka::FETCH_PACING,
            ])
            .create_with_context(PollContext::default())
            .map_err(kafka("creating the consumer"))?;
        let partitions = markers_partitions(&consumer, &config.markers_topic)?;
        broker_check::check(&config)?;
        let producer: QuietProducer = config
            .client_config(&crate::kafka::DURABLE_PRODUCER)
            .create()
            .map_err(kafka("creating the markers producer"))?;
        // Starts hold back their batch's handout; settlements do not. Each has its producer,
        // so a Start never lingers for settlements' sake (`kafka::start_producer`).
        let start_producer: QuietProducer = config
            .client_config(&crate::kafka::start_producer())
            .create()
            .map_err(kafka("creating the Start markers producer"))?;
        let topics: Vec<&str> = config.topics.iter().map(String::as_str).collect();
        consumer.subscribe(&topics).map_err(kafka("subscribing"))?;

        let writer = MarkerWriter::new(producer, config.markers_topic.clone(), partitions);
        let starts = MarkerWriter::new(start_producer, config.markers_topic.clone(), partitions);
        let settler = Arc::new(settler(&config, starts, writer, runtime)?);
        // Counted in batches; `max_unsettled` bounds the records (the poll thread takes no
        // more than the room left).
        let (tx, rx) = mpsc::channel(config.max_unsettled.max(1));
        let auto_keep_alive = config.auto_keep_alive;
        let stop = Arc::new(AtomicBool::new(false));
        let died = Arc::new(Mutex::new(None));
        // Keeps the channel open until a failure is recorded, so that whoever sees `recv`
        // return `None` also sees why.
        let hold_open = tx.clone();
        let poller = Poller {
            consumer,
            settler: settler.clone(),
            retry: Arc::new(config.retry.clone()),
            config,
            out: tx,
            stop: stop.clone(),
            held: Default::default(),
            resuming: Default::default(),
            revoked: Default::default(),
            refused_since: Default::default(),
            leases: Default::default(),
            settled_groups: Default::default(),
            topics: Default::default(),
            chunks: Default::default(),
            last_batch: Default::default(),
        };
        let thread = spawn_poller(poller, died.clone(), hold_open)?;
        Ok(RedeliveryConsumer {
            deliveries: rx,
            ready: Vec::new().into_iter(),
            auto_keep_alive,
            settler,
            stop,
            died,
            thread: Some(thread),
        })
    }

    /// Why the consumer stopped on its own: the poll thread died, with the reason. `None` while
    /// it runs or after an orderly [`close`](Self::close).
    pub fn failure(&self) -> Option<ClientError> {
        let why = self.died.lock().ok()?.clone()?;
        Some(ClientError::PollThread(format!("died: {why}")))
    }

    /// The next delivery, or `None` once the consumer has stopped: closed, or its poll thread
    /// died ([`failure`](Self::failure) and [`close`](Self::close) then say why).
    ///
    /// A delivery whose timeout passed while it waited here for the application is not handed
    /// out: the tracker redelivers its record, and handing it out too would deliver it twice.
    /// It is counted ([`expired_before_handout`](Self::expired_before_handout)), announced
    /// ([`EventKind::Expired`](crate::events::EventKind::Expired)) and logged.
    pub async fn recv(&mut self) -> Option<Delivery> {
        let mut now = None;
        loop {
            if self.ready.as_slice().is_empty() {
                // Cancel-safe: a batch is either still in the channel or already in `ready`.
                self.ready = self.deliveries.recv().await?.into_iter();
                now = None;
            }
            let Some(mut d) = self.ready.next() else {
                continue;
            };
            // One clock reading per call and batch, whatever it skips.
            if d.expired(*now.get_or_insert_with(Instant::now)) {
                d.pass_over();
                continue;
            }
            if self.auto_keep_alive {
                // Started here, on the application's runtime; the poll thread has none.
                d.auto_keep_alive();
            }
            return Some(d);
        }
    }

    /// Every delivery that is here already, at least one: the rest of the poll batch the
    /// last [`recv`](Self::recv) took from, or the next whole batch (up to
    /// [`ConsumerConfig::max_batch`] records). `None` once the consumer has stopped, as for
    /// `recv`. With [`Delivery::ack_many`], the cheap way to work in batches: one call and
    /// one future per batch instead of one per record. Deliveries that timed out while they
    /// waited are left out, as in `recv`.
    pub async fn recv_batch(&mut self) -> Option<Vec<Delivery>> {
        loop {
            let mut batch: Vec<Delivery> = if self.ready.as_slice().is_empty() {
                // Cancel-safe as `recv`: a batch is either still in the channel or returned.
                self.deliveries.recv().await?
            } else {
                self.ready.by_ref().collect()
            };
            let now = Instant::now();
            batch.retain_mut(|d| {
                let expired = d.expired(now);
                if expired {
                    d.pass_over();
                }
                !expired
            });
            if batch.is_empty() {
                continue;
            }
            if self.auto_keep_alive {
                for d in &mut batch {
                    d.auto_keep_alive();
                }
            }
            return Some(batch);
        }
    }

    /// The next delivery if one arrives within `timeout`.
    pub async fn recv_timeout(&mut self, timeout: Duration) -> Option<Delivery> {
        tokio::time::timeout(timeout, self.recv())
            .await
            .ok()
            .flatten()
    }

    /// Events of this consumer's deliveries from now on: delivered, acked, nacked,
    /// dead-lettered (rejected). See [`crate::events`].
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<crate::events::Event> {
        self.settler.events.subscribe()
    }

    /// Records polled so far whose `kr-timeout-ms`, `kr-max-deliveries` or `kr-attempt` header
    /// was out of its documented range and was clamped or ignored (each is logged, at most
    /// once per 10 s). See [`crate::headers::checked`].
    pub fn odd_headers(&self) -> u64 {
        self.settler.odd_header_count()
    }

    /// Deliveries whose timeout passed while they waited in this consumer for the application
    /// to take them (`recv`, `recv_batch`): not handed out, since the tracker redelivers their
    /// records. A count that grows says the application takes deliveries more slowly than they
    /// time out: lower [`ConsumerConfig::max_unsettled`] or [`ConsumerConfig::max_batch`], or
    /// raise the timeout.
    pub fn expired_before_handout(&self) -> u64 {
        self.settler.expired_before_handout.load(Ordering::Relaxed)
    }

    /// Records this consumer polled and started but did not hand out, because a rebalance could
    /// give their partitions to another worker (the group refused a commit, or took a partition
    /// away while its Starts were on their way), and kept alive until the group settled. Their
    /// partition's next owner, this consumer or another, delivers them; the tracker does not
    /// redeliver them meanwhile, however long the rebalance lasts (up to five minutes).
    pub fn held_through_rebalances(&self) -> u64 {
        self.settler
            .held_through_rebalances
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Deliveries handed out and not yet settled.
    pub fn unsettled(&self) -> usize {
        self.settler.unsettled()
    }

    /// Stops polling and waits (up to 30 s) for the poll thread. Deliveries already handed out
    /// can still be settled; deliveries waiting in the channel are released for redelivery.
    ///
    /// An error says the poll thread had died, and why, or that it did not stop in time (it
    /// is left to finish on its own; nothing it held was committed or handed out).
    pub async fn close(mut self) -> Result<(), ClientError> {
        self.stop.store(true, Ordering::Relaxed);
        self.deliveries.close();
        self.ready = Vec::new().into_iter();
        while self.deliveries.try_recv().is_ok() {}
        if let Some(thread) = self.thread.take() {
            let joined = tokio::task::spawn_blocking(move || thread.join());
            if tokio::time::timeout(CLOSE_WAIT, joined).await.is_err() {
                return Err(ClientError::PollThread(format!(
                    "did not stop within {CLOSE_WAIT:?}"
                )));
            }
        }
        self.failure().map_or(Ok(()), Err)
    }
}

impl Drop for RedeliveryConsumer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn kafka(what: &'static str) -> impl FnOnce(rdkafka::error::KafkaError) -> ClientError {
    move |source| ClientError::Kafka { what, source }
}

/// The partition count of the markers topic, which fixes where each source's markers go.
fn markers_partitions<C: rdkafka::consumer::ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
) -> Result<i32, ClientError> {
    let unusable = |why: String| ClientError::MarkersTopic {
        topic: topic.to_string(),
        why,
    };
    let metadata = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(|e| unusable(format!("metadata request failed: {e}")))?;
    let t = metadata
        .topics()
        .iter()
        .find(|t| t.name() == topic)
        .ok_or_else(|| unusable("not in the metadata".into()))?;
    if let Some(e) = t.error() {
        return Err(unusable(format!(
            "broker says {e:?}; create it with `redelivery-tracker topics create`"
        )));
    }
    match t.partitions().len() {
        0 => Err(unusable("it has no partitions".into())),
        n => Ok(i32::try_from(n).unwrap_or(i32::MAX)),
    }
}

/// The settler of a new consumer: version 2 settlements go through a coalescer thread.
fn settler(
    config: &ConsumerConfig,
    starts: MarkerWriter,
    writer: MarkerWriter,
    runtime: Handle,
) -> Result<Settler, ClientError> {
    let coalescer = match config.marker_format {
        MarkerFormat::V1 => None,
        _ => Some(
            Coalescer::start(
                config.settle_window,
                config.max_settle_batch,
                writer.clone(),
                runtime,
            )
            .map_err(ClientError::Thread)?,
        ),
    };
    Ok(Settler::new(starts, writer, coalescer))
}

/// Runs the poll thread. A panic in it is recorded in `died` before `hold_open` (a sender of
/// the deliveries channel) is dropped, so whoever sees `recv` end also sees why.
fn spawn_poller(
    poller: Poller,
    died: Arc<Mutex<Option<String>>>,
    hold_open: mpsc::Sender<Vec<Delivery>>,
) -> Result<std::thread::JoinHandle<()>, ClientError> {
    std::thread::Builder::new()
        .name("redelivery-poll".into())
        .spawn(move || {
            let run = std::panic::AssertUnwindSafe(|| poller.run());
            if let Err(panic) = std::panic::catch_unwind(run) {
                let why = crate::panic_message(panic.as_ref());
                tracing::error!(reason = %why, "the poll thread died; the consumer stops");
                if let Ok(mut slot) = died.lock() {
                    *slot = Some(why);
                }
            }
            drop(hold_open);
        })
        .map_err(ClientError::Thread)
}
