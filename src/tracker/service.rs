//! Wires a tracker together: the markers consumer thread, the redelivery worker thread, and a
//! graceful stop.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use crate::kafka::producer::QuietProducer;
use rdkafka::consumer::{BaseConsumer, Consumer};
use tokio::sync::oneshot;

use crate::tracker::config::TrackerConfig;
use crate::tracker::core::fence::Fence;
use crate::tracker::error::TrackerError;
use crate::tracker::inspect::SharedView;
use crate::tracker::markers::consumer::{Ended, MarkersLoop, TrackerContext, MAX_QUEUED_JOBS};
use crate::tracker::markers::group_offsets::GroupOffsets;
use crate::tracker::memory;
use crate::tracker::metrics::Metrics;
use crate::tracker::readiness::Readiness;
use crate::tracker::redeliver::producers::Producers;
use crate::tracker::redeliver::read_ahead;
use crate::tracker::redeliver::worker::Redeliverer;
use crate::tracker::snapshot::restorer::Restorer;

/// How long each thread may take to finish after a stop: the markers consumer its final commit
/// and close, the redelivery worker its current job.
const GRACE: Duration = Duration::from_secs(10);

/// The longest a stop can take: the consumer's grace period, then the worker's, then the worker
/// once more after it is told to give up (see `Threads::drain`). A supervisor that kills the
/// tracker sooner (Kubernetes' `terminationGracePeriodSeconds`, which the Helm chart sets above
/// this; tests/kubernetes.rs checks it) loses nothing, but the next owner replays more.
pub const LONGEST_STOP: Duration = Duration::from_secs(3 * GRACE.as_secs());

/// A RedeliveryTracker: consumes the markers topic and redelivers what times out.
///
/// ```no_run
/// # async fn demo() -> Result<(), kafka_redelivery::tracker::TrackerError> {
/// use kafka_redelivery::tracker::{Tracker, TrackerConfig};
/// let tracker = Tracker::new(TrackerConfig::new("localhost:9092", "orders.markers"));
/// let ready = tracker.readiness();
/// tracker.run(async { tokio::signal::ctrl_c().await.ok(); }).await?;
/// # Ok(()) }
/// ```
pub struct Tracker {
    config: Arc<TrackerConfig>,
    metrics: Metrics,
    ready: Readiness,
    view: SharedView,
}

impl Tracker {
    /// A tracker with its own metrics registry.
    pub fn new(config: TrackerConfig) -> Self {
        Self::with_metrics(config, Metrics::new())
    }

    /// A tracker that reports into `metrics`.
    pub fn with_metrics(config: TrackerConfig, metrics: Metrics) -> Self {
        Tracker {
            config: Arc::new(config),
            metrics,
            ready: Readiness::default(),
            view: SharedView::default(),
        }
    }

    /// The tracker's metrics, for an admin endpoint.
    pub fn metrics(&self) -> Metrics {
        self.metrics.clone()
    }

    /// Events from now on: schedules tracked, published (ready) and cancelled, copies
    /// redelivered (retried), records dead-lettered. See [`crate::events`].
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<crate::events::Event> {
        self.metrics.events.subscribe()
    }

    /// Whether every assigned markers partition has caught up (see `/readyz`).
    pub fn readiness(&self) -> Readiness {
        self.ready.clone()
    }

    /// What the tracker holds, refreshed every commit interval (see `/inspect`).
    pub fn view(&self) -> SharedView {
        self.view.clone()
    }

    /// Runs until `shutdown` completes, then stops consuming, commits, lets the redelivery
    /// worker finish its current job (up to a grace period) and returns.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), TrackerError> {
        self.check_config()?;
        // Debug output of the config hides secret librdkafka values (passwords, keys).
        tracing::debug!(config = ?self.config, "tracker starting");
        let mut threads = self.start().await?;
        // If this future is dropped instead of being told to stop, the threads must still end.
        let _guard = StopOnDrop(vec![
            threads.stop_consumer.clone(),
            threads.stop_worker.clone(),
        ]);
        tokio::select! {
            _ = shutdown => tracing::info!("stop requested; draining"),
            () = memory::give_back_after_replays(self.ready.subscribe()) => {}
            r = &mut threads.consumer => {
                if let Ended::Refused(why) = joined("markers", r)? {
                    threads.stop_worker.store(true, Ordering::Relaxed);
                    bounded("redelivery worker", &mut threads.worker, GRACE).await?;
                    return Err(TrackerError::Refused(why));
                }
                // Otherwise the loop only ends on its own when the worker is gone: say why.
                bounded("redelivery worker", &mut threads.worker, GRACE).await?;
                return Err(TrackerError::Thread("the redelivery worker stopped".into()));
            }
        }
        self.ready.set(false);
        threads.drain().await?;
        tracing::info!("tracker stopped");
        Ok(())
    }

    fn check_config(&self) -> Result<(), TrackerError> {
        let most = crate::headers::checked::MAX_ATTEMPT;
        if !(1..=most).contains(&self.config.max_deliveries) {
            return Err(TrackerError::Config(format!(
                "max deliveries must be 1 to {most} (the most attempts the tracker counts), not {}",
                self.config.max_deliveries
            )));
        }
        Ok(())
    }

    /// Creates the clients and starts the markers consumer and the redelivery worker.
    async fn start(&self) -> Result<Threads, TrackerError> {
        // The redelivery worker sends each pass's records together and waits for them, so
        // lingering would only add to every pass; batching comes from the pass itself.
        let mut settings = crate::kafka::DURABLE_PRODUCER.to_vec();
        settings.push(("linger.ms", "0"));
        let producers = Producers::create(&self.config, &settings)?;
        let snapshots = {
            let (producer, config) = (producers.first().clone(), self.config.clone());
            tokio::task::spawn_blocking(move || snapshots_topic(&producer, &config))
                .await
                .map_err(|e| TrackerError::Thread(e.to_string()))?
        };
        // Ownership as both threads see it: the consumer grants and revokes, the worker checks.
        let fence = Arc::new(Fence::default());
        let stop_consumer = Arc::new(AtomicBool::new(false));
        let consumer = self.markers_consumer(snapshots, &fence, &stop_consumer)?;
        let stop_worker = Arc::new(AtomicBool::new(false));
        let queued = Arc::new(AtomicUsize::new(0));
        let (jobs, job_rx) = mpsc::sync_channel(MAX_QUEUED_JOBS);
        let (hints, read_ahead) =
            read_ahead::start(&self.config, &self.metrics, stop_worker.clone())?
                .map_or((None, None), |(h, c)| (Some(h), Some(c)));
        let worker = Redeliverer::new(
            self.config.clone(),
            producers.clone(),
            self.metrics.clone(),
            stop_worker.clone(),
            fence,
            read_ahead,
        )?;
        let group_offsets = match &self.config.source_group {
            Some(group) => Some(GroupOffsets::start(&self.config, group)?),
            None => None,
        };
        let worker_queued = queued.clone();
        let worker = spawn_thread("redeliverer", move || worker.run(job_rx, &worker_queued))?;
        let markers = MarkersLoop {
            consumer,
            producers,
            config: self.config.clone(),
            metrics: self.metrics.clone(),
            jobs,
            read_ahead: hints,
            queued,
            ready: self.ready.clone(),
            view: self.view.clone(),
            stop: stop_consumer.clone(),
            refusals: Default::default(),
            group_offsets,
        };
        let consumer = spawn_thread("markers", move || markers.run()).inspect_err(|_| {
            // The worker is already running; without its consumer nobody would stop it.
            stop_worker.store(true, Ordering::Relaxed);
        })?;
        Ok(Threads {
            consumer,
            worker,
            stop_consumer,
            stop_worker,
        })
    }

    /// The markers consumer, subscribed, with its rebalance context.
    fn markers_consumer(
        &self,
        snapshots: Option<String>,
        fence: &Arc<Fence>,
        stop: &Arc<AtomicBool>,
    ) -> Result<BaseConsumer<TrackerContext>, TrackerError> {
        // Reads from the configured snapshots topic whatever this tracker's own snapshot
        // settings: a commit may already rely on a snapshot an earlier run wrote, and
        // replaying without it would forget what only it holds.
        let restorer = Restorer::start(
            self.config.clone(),
            self.metrics.clone(),
            self.config.snapshots_topic.clone(),
            stop.clone(),
        )?;
        let consumer: BaseConsumer<TrackerContext> = self
            .config
            .client_config(&[
                ("group.id", &self.config.group_id),
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
                ("auto.offset.reset", "earliest"),
                crate::kafka::FETCH_PACING,
                MARKERS_BATCHING,
                // Feeds the markers lag gauge.
                ("statistics.interval.ms", "5000"),
            ])
            .create_with_context(TrackerContext::new(
                self.metrics.clone(),
                self.config.clone(),
                snapshots,
                fence.clone(),
                restorer,
            ))
            .map_err(TrackerError::kafka("creating the markers consumer"))?;
        consumer
            .subscribe(&[&self.config.markers_topic])
            .map_err(TrackerError::kafka("subscribing to the markers topic"))?;
        Ok(consumer)
    }
}

/// How the markers consumer fetches: in batches while markers keep coming, at once when they
/// come after a quiet spell.
///
/// By default librdkafka sends the next fetch as soon as the last one is answered, and the
/// broker answers a fetch as soon as one new marker is there: at full speed the tracker sent
/// one fetch per marker produce request, 484 for 500,000 records, each one a request the broker
/// pays for (BENCHMARKS.md, "The markers read in batches"). With `queued.min.messages` at 1,
/// librdkafka waits [`crate::kafka::FETCH_PACING`] (10 ms) before the next fetch while the
/// last one's markers are still queued, so a busy partition is read in 10 ms slices: 99
/// fetches for the same run. A partition with nothing queued is fetched at once and the
/// fetch waits at the broker, so a marker after a quiet spell, and a Tick, are read as soon
/// as before, and an idle tracker fetches no more often.
///
/// What it costs: on a busy partition a marker is read up to 10 ms later. That does not hold
/// a deadline back, which waits only for a marker stamped 100 ms before it
/// (`READ_THROUGH_SLACK_MS`); but an End written in the last 10 ms or so before its deadline
/// is now likelier to be read after the copy was made (a duplicate, as the slack already
/// allowed). And a replay no longer fetches while it applies: the next fetch waits until the
/// last one's markers are applied. Replaying version 2's batch markers did not measurably
/// slow down; replaying a million version 1 markers took about 0.2 s longer (1.1–1.4 s
/// before). Larger fetches (8 MiB) did not make that up, so the fetch size is librdkafka's.
const MARKERS_BATCHING: (&str, &str) = ("queued.min.messages", "1");

/// The tracker's two threads and the flags that stop them.
struct Threads {
    consumer: oneshot::Receiver<Result<Ended, String>>,
    worker: oneshot::Receiver<Result<(), String>>,
    stop_consumer: Arc<AtomicBool>,
    stop_worker: Arc<AtomicBool>,
}

impl Threads {
    /// Stops the consumer (its final commit, leaving the group), then lets the worker finish
    /// its job; each within the grace period.
    async fn drain(mut self) -> Result<(), TrackerError> {
        self.stop_consumer.store(true, Ordering::Relaxed);
        // The final commit and the consumer's close wait for the group coordinator; with Kafka
        // gone they would wait forever, so a stop never waits longer than the grace period.
        // Giving up loses nothing: uncommitted markers are replayed by the next owner. These
        // warnings have no counter: the process is about to exit, so nothing would scrape it.
        if !bounded("markers", &mut self.consumer, GRACE).await? {
            tracing::warn!(
                grace = ?GRACE,
                "could not commit and leave the group within the grace period (is Kafka reachable?); \
                 the next owner replays from the last committed offset"
            );
        }
        if !bounded("redelivery worker", &mut self.worker, GRACE).await? {
            tracing::warn!("redelivery worker still busy after the grace period; its deliveries stay in flight");
            self.stop_worker.store(true, Ordering::Relaxed);
            if !bounded("redelivery worker", &mut self.worker, GRACE).await? {
                tracing::warn!("redelivery worker did not stop; leaving it behind");
            }
        }
        Ok(())
    }
}

/// The snapshots topic if snapshots are on and the topic can take them: it exists and has a
/// partition for every markers partition. Otherwise snapshots are off, with a warning: the
/// tracker works as before, and a restart replays from the oldest item in flight.
fn snapshots_topic(producer: &QuietProducer, config: &TrackerConfig) -> Option<String> {
    let topic = config.snapshots_topic.clone()?;
    if config.snapshot_after_markers == 0 {
        return None;
    }
    // All topics, not the one by name: a producer asking for a missing topic by name makes a
    // broker with auto-creation create it, with the wrong settings (found by the benchmark
    // suite: the check itself created a one-partition, non-compacted snapshots topic).
    let md = producer
        .client()
        .fetch_metadata(None, Duration::from_secs(10))
        .ok();
    let partitions = |name: &str| -> Option<usize> {
        let t = md.as_ref()?.topics().iter().find(|t| t.name() == name)?;
        (t.error().is_none() && !t.partitions().is_empty()).then_some(t.partitions().len())
    };
    match (partitions(&topic), partitions(&config.markers_topic)) {
        (Some(have), Some(need)) if have >= need => {
            crate::tracker::snapshot::metadata_check::metadata_kept(config).then_some(topic)
        }
        (have, need) => {
            tracing::warn!(
                snapshots_topic = %topic,
                partitions = ?have,
                markers_partitions = ?need,
                "snapshots off: the snapshots topic is missing or has fewer partitions than the \
                 markers topic (`redelivery-tracker topics create` makes it); a restart replays \
                 from the oldest item in flight"
            );
            None
        }
    }
}

/// What a tracker thread ended with: its result, or the message of the panic that ended it.
type Joined<T> = Result<Result<T, String>, oneshot::error::RecvError>;

/// A thread's end as the tracker's error: a panic is reported with its message.
fn joined<T>(name: &str, r: Joined<T>) -> Result<T, TrackerError> {
    match r {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(why)) => {
            tracing::error!(thread = name, reason = %why, "a tracker thread panicked");
            Err(TrackerError::Thread(format!(
                "the {name} thread panicked: {why}"
            )))
        }
        Err(_) => Err(TrackerError::Thread(format!("the {name} thread vanished"))),
    }
}

/// Runs `f` on a named OS thread and returns a receiver for its result, or for the message of
/// the panic that ended it.
///
/// Not `spawn_blocking`: a runtime waits for its blocking tasks when it is dropped, so a thread
/// stuck in librdkafka (closing a consumer whose coordinator is unreachable) would keep the
/// process alive after `run` returned.
fn spawn_thread<T: Send + 'static>(
    name: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<oneshot::Receiver<Result<T, String>>, TrackerError> {
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name(format!("tracker-{name}"))
        .spawn(move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
            let _ = tx.send(r.map_err(|p| crate::panic_message(p.as_ref())));
        })
        .map_err(|e| TrackerError::Thread(format!("starting the {name} thread: {e}")))?;
    Ok(rx)
}

/// Waits up to `limit` for a thread started by [`spawn_thread`]: `Ok(true)` if it ended in
/// time, `Ok(false)` if it is still running, an error if it panicked.
async fn bounded<T>(
    name: &str,
    thread: &mut oneshot::Receiver<Result<T, String>>,
    limit: Duration,
) -> Result<bool, TrackerError> {
    match tokio::time::timeout(limit, thread).await {
        Ok(r) => joined(name, r).map(|_| true),
        Err(_) => Ok(false),
    }
}

/// Sets every flag when dropped, so the tracker's threads end even if `run` is cancelled.
struct StopOnDrop(Vec<Arc<AtomicBool>>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        for flag in &self.0 {
            flag.store(true, Ordering::Relaxed);
        }
    }
}
