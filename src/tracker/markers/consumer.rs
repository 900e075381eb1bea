//! The markers consumer: one thread that reads markers, keeps the partition states, wakes at the
//! next deadline, hands due deliveries to the redelivery worker, and commits.
//!
//! The thread owns the `BaseConsumer`, and librdkafka runs rebalance callbacks inside `poll` on
//! this same thread. So the callbacks can act on the partition states directly (commit what a
//! revoked partition allows, start catch-up for an assigned one) without any cross-thread
//! hand-off: the `Mutex` around the states is never contended, it only satisfies `Sync`, and it
//! is never held across `poll`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::SyncSender;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::kafka::producer::DeliveryFuture;
use futures::FutureExt;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::FutureRecord;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use crate::marker::{decode, encode, Marker, SourceRef};

use crate::resume::{ResumeCheck, Verdict};
use crate::tracker::config::TrackerConfig;
use crate::tracker::core::fence::Fence;
use crate::tracker::core::group_hold::{Committed, HoldPolicy};
use crate::tracker::inspect::{SharedView, TrackerView};
use crate::tracker::markers::group_offsets::GroupOffsets;
use crate::tracker::markers::partition::{OwnedPartition, Restore};
use crate::tracker::markers::plan;
use crate::tracker::markers::refusal::Refusals;
use crate::tracker::markers::restart;
use crate::tracker::metrics::intake::{ConsumeFailed, MarkerUndecodable, Tombstone};
use crate::tracker::metrics::progress::{CommitFinished, RestoreFailed};
use crate::tracker::metrics::work::{HeldForGroup, ProduceFailed};
use crate::tracker::metrics::Metrics;
use crate::tracker::metrics::Problem;
use crate::tracker::redeliver::producers::Producers;
use crate::tracker::redeliver::read_ahead::Hints;
use crate::tracker::redeliver::worker::Job;
use crate::tracker::snapshot::policy;
use crate::tracker::snapshot::restorer::Restorer;

/// Longest sleep in `poll`, so stop requests and Tick retries are noticed promptly.
const MAX_WAIT: Duration = Duration::from_millis(200);
/// Jobs waiting for the redelivery worker before the consumer stops taking due deliveries.
pub(crate) const MAX_QUEUED_JOBS: usize = 16;

/// Partition states shared between the poll loop and the rebalance callbacks.
#[derive(Default)]
pub(crate) struct Owned {
    pub(crate) partitions: BTreeMap<i32, OwnedPartition>,
    assigned_once: bool,
}

/// The consumer's context: where rebalance and commit callbacks land.
pub(crate) struct TrackerContext {
    owned: Mutex<Owned>,
    metrics: Metrics,
    markers_topic: String,
    /// Where this tracker writes snapshots: `None` when snapshots are off or the topic is not
    /// usable. Reading them (the restorer) does not depend on it.
    snapshots: Option<String>,
    /// Ownership as the redelivery worker sees it.
    fence: Arc<Fence>,
    /// Reads snapshots for newly assigned partitions, off this thread.
    restorer: Restorer,
}

/// How long a revocation waits for a redelivery pass already acting for the partition. A pass
/// normally takes milliseconds; the bound keeps a graceful stop within its grace period (10 s)
/// with room for the final commit.
pub(crate) const PASS_WAIT: Duration = Duration::from_secs(5);

impl TrackerContext {
    pub(crate) fn new(
        metrics: Metrics,
        config: Arc<TrackerConfig>,
        snapshots: Option<String>,
        fence: Arc<Fence>,
        restorer: Restorer,
    ) -> Self {
        TrackerContext {
            restorer,
            owned: Mutex::new(Owned::default()),
            metrics,
            markers_topic: config.markers_topic.clone(),
            snapshots,
            fence,
        }
    }

    /// Stops the redelivery worker acting for `ids` (queued and parked work is dropped) and
    /// waits for a pass under way, before the partitions are committed and given up.
    fn fence_off(&self, ids: &[i32]) {
        if !self.fence.revoke(ids, PASS_WAIT) {
            self.metrics.emit(Problem::PassOutlivedRevocation {
                partitions: ids,
                wait: PASS_WAIT,
            });
        }
    }

    /// Pauses the newly assigned partitions `ids` and asks the restore thread for their
    /// snapshots: no marker of theirs is applied until it answers (see `restorer`).
    fn ask_restore(&self, consumer: &BaseConsumer<Self>, ids: &[i32]) {
        if ids.is_empty() {
            return;
        }
        let mut pause = TopicPartitionList::new();
        let mut ask = Vec::with_capacity(ids.len());
        {
            let mut owned = self.lock();
            for id in ids {
                if let Some(p) = owned.partitions.get_mut(id) {
                    p.restore = Restore::Asked;
                    pause.add_partition(&self.markers_topic, *id);
                    ask.push((*id, p.generation));
                }
            }
        }
        if let Err(e) = consumer.pause(&pause) {
            self.metrics.emit(Problem::PauseFailed { error: &e });
        }
        if !self.restorer.ask(ask) {
            self.metrics.emit(Problem::RestoreThreadGone);
        }
    }

    /// Installs the restore thread's answers: a restored (or unneeded) snapshot resumes its
    /// partition; a failure keeps it paused and asks again after a while.
    fn install_restores(&self, consumer: &BaseConsumer<Self>, now: Instant) {
        let mut resume = TopicPartitionList::new();
        let mut again = Vec::new();
        {
            let mut owned = self.lock();
            for answer in self.restorer.answers() {
                let Some(p) = owned.partitions.get_mut(&answer.partition) else {
                    continue;
                };
                if p.generation != answer.generation || p.restore != Restore::Asked {
                    continue; // for an earlier grant of the partition
                }
                match answer.result {
                    Ok(restored) => {
                        if let policy::Restored::State(pointer, state) = restored {
                            p.restore(pointer, *state);
                        }
                        p.restore = Restore::Done;
                        resume.add_partition(&self.markers_topic, p.id);
                    }
                    Err(why) => {
                        self.metrics.emit(RestoreFailed {
                            partition: p.id,
                            why: &why,
                        });
                        p.restore = Restore::RetryAt(now + policy::RESTORE_RETRY);
                    }
                }
            }
            for p in owned.partitions.values_mut() {
                if matches!(p.restore, Restore::RetryAt(t) if t <= now) {
                    p.restore = Restore::Asked;
                    again.push((p.id, p.generation));
                }
            }
        }
        if resume.count() > 0 {
            if let Err(e) = consumer.resume(&resume) {
                self.metrics.emit(Problem::ResumeFailed { error: &e });
            }
        }
        if !self.restorer.ask(again) {
            self.metrics.emit(Problem::RestoreThreadGone);
        }
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Owned> {
        // A poisoned lock only means a panic elsewhere on this thread; the data is still whole.
        self.owned.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Commits the safe offset of each partition in `ids` synchronously.
    fn commit_now(&self, consumer: &BaseConsumer<Self>, owned: &mut Owned, ids: &[i32]) {
        let commits = plan::final_commits(&mut owned.partitions, ids, Instant::now());
        if !commits.is_empty() {
            let tpl = commit_list(&self.markers_topic, &commits);
            self.metrics.emit(CommitFinished {
                result: &consumer.commit(&tpl, CommitMode::Sync),
            });
        }
    }
}

/// The planned commits as librdkafka wants them, each with its snapshot pointer as metadata.
fn commit_list(topic: &str, commits: &[plan::Commit]) -> TopicPartitionList {
    let mut tpl = TopicPartitionList::new();
    for c in commits {
        let mut e = tpl.add_partition(topic, c.partition);
        // Only an offset that is not a real offset is refused; ours are.
        let _ = e.set_offset(Offset::Offset(c.offset));
        if let Some(m) = &c.metadata {
            e.set_metadata(m.clone());
        }
    }
    tpl
}

impl ClientContext for TrackerContext {
    /// librdkafka's statistics (every `statistics.interval.ms`): publishes how many markers are
    /// written but not yet read, per owned partition.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let Some(topic) = statistics.topics.get(&self.markers_topic) else {
            return;
        };
        let owned = self.lock();
        for (id, p) in &topic.partitions {
            if owned.partitions.contains_key(id) && p.hi_offset >= 0 && p.app_offset >= 0 {
                self.metrics
                    .markers_lag(*id, (p.hi_offset - p.app_offset).max(0));
            }
        }
    }
}

impl ConsumerContext for TrackerContext {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        match rebalance {
            Rebalance::Revoke(tpl) => {
                let ids: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
                self.fence_off(&ids);
                let mut owned = self.lock();
                self.commit_now(consumer, &mut owned, &ids);
                for id in ids {
                    if let Some(p) = owned.partitions.remove(&id) {
                        tracing::info!(
                            partition = id,
                            in_flight = p.state.in_flight(),
                            "partition revoked"
                        );
                        self.metrics.forget_partition(id);
                    }
                }
            }
            Rebalance::Assign(_) => {}
            Rebalance::Error(e) => self.metrics.emit(Problem::RebalanceError { error: e }),
        }
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let mut owned = self.lock();
            owned.assigned_once = true;
            let mut new = Vec::new();
            for e in tpl.elements() {
                let id = e.partition();
                owned.partitions.entry(id).or_insert_with(|| {
                    tracing::info!(partition = id, "partition assigned; replaying");
                    new.push(id);
                    let mut p = OwnedPartition::new(&self.markers_topic, id, random_nonce());
                    p.generation = self.fence.grant(id);
                    p
                });
            }
            drop(owned);
            // Paused before the first poll can hand out any of their markers.
            self.ask_restore(consumer, &new);
        }
    }
}

/// The host's wall clock in milliseconds since the epoch: only a plausibility bound on marker
/// timestamps while a partition replays (see `clock`), never partition time itself.
fn wall_clock_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

fn random_nonce() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // RandomState is seeded from the OS; hashing the time gives a fresh value per call.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.finish()
}

/// Most markers handled after one waiting poll before the loop looks at its deadlines again.
const MAX_DRAIN: usize = 10_000;

/// Handles `first` (what a waiting poll returned), then whatever `poll_now` has ready without
/// waiting, up to [`MAX_DRAIN`] more.
///
/// The monotonic clock is read after each poll, never before: a marker is anchored at the
/// moment it was in hand. An instant read before a later poll would anchor a newer marker too
/// early and put partition time ahead of the broker's clock, which publishes schedules and
/// redeliveries early (seen in CI on a loaded machine: 786 of 3,000 schedules early, when one
/// reading served a whole drain). The wall clock is only the replay plausibility bound (30 s of
/// slack), so one reading per drain serves; reading it per marker cost a quarter of the loop's
/// CPU. Generic over the poll, the clock and the handler so that this order is unit-tested.
fn drain<R>(
    first: R,
    mut poll_now: impl FnMut() -> Option<R>,
    mut now: impl FnMut() -> Instant,
    wall_ms: i64,
    mut handle: impl FnMut(R, Instant, i64),
) {
    handle(first, now(), wall_ms);
    for _ in 0..MAX_DRAIN {
        match poll_now() {
            Some(result) => handle(result, now(), wall_ms),
            None => break,
        }
    }
}

/// The poll loop and what it needs.
pub(crate) struct MarkersLoop {
    pub(crate) consumer: BaseConsumer<TrackerContext>,
    pub(crate) producers: Producers,
    pub(crate) config: Arc<TrackerConfig>,
    pub(crate) metrics: Metrics,
    pub(crate) jobs: SyncSender<Job>,
    /// Where records due soon are listed for reading ahead, if that is on.
    pub(crate) read_ahead: Option<Hints>,
    pub(crate) queued: Arc<AtomicUsize>,
    pub(crate) ready: crate::tracker::Readiness,
    pub(crate) view: SharedView,
    pub(crate) stop: Arc<AtomicBool>,
    /// Kafka refusing the tracker its group or the markers topic (`refusal.rs`).
    pub(crate) refusals: RefCell<Refusals>,
    /// The source group's committed offsets, with `--source-group` (`group_offsets.rs`).
    pub(crate) group_offsets: Option<GroupOffsets>,
}

/// How the poll loop ended.
#[derive(Debug)]
pub(crate) enum Ended {
    /// A stop was requested; every owned partition was committed.
    Stopped,
    /// Kafka refused this tracker its group or the markers topic from the start: the
    /// broker's last word on it. Nothing was committed.
    Refused(String),
}

impl MarkersLoop {
    /// Runs until a stop is requested, then commits every owned partition; or until a refusal
    /// that lasted from the start ends it.
    pub(crate) fn run(self) -> Ended {
        let mut ticks: Vec<DeliveryFuture> = Vec::new();
        let mut next_commit = Instant::now() + self.config.commit_interval;
        while !self.stop.load(Ordering::Relaxed) && !self.refused_for_good() {
            let wait = crate::kafka::whole_ms(self.wait_time(next_commit));
            if let Some(result) = self.consumer.poll(wait) {
                drain(
                    result,
                    || self.consumer.poll(Duration::ZERO),
                    Instant::now,
                    wall_clock_ms(),
                    |result, at, wall_ms| self.handle(result, at, wall_ms),
                );
            }
            self.consumer
                .context()
                .install_restores(&self.consumer, Instant::now());
            if self.became_ready() {
                self.refusals.borrow_mut().became_ready();
                // Ready, its view and its gauges said together, at once.
                self.commit_and_publish();
                next_commit = Instant::now() + self.config.commit_interval;
            }
            // After the dispatch: a partition it found not read through to a deadline gets its
            // Tick in this same turn.
            self.dispatch_due();
            self.send_ticks(&mut ticks);
            self.list_read_ahead();
            if Instant::now() >= next_commit {
                self.commit_and_publish();
                next_commit = Instant::now() + self.config.commit_interval;
            }
        }
        if let Some(why) = self.refusals.borrow().for_good(Instant::now()) {
            tracing::error!(reason = why, "Kafka refused this tracker its group or the markers topic since it started; stopping");
            // Never ready, so there is nothing of its own to commit.
            return Ended::Refused(why.to_string());
        }
        let ctx = self.consumer.context();
        let ids: Vec<i32> = ctx.lock().partitions.keys().copied().collect();
        // Before the group is left: the worker must not act for partitions a replica takes.
        ctx.fence_off(&ids);
        let mut owned = ctx.lock();
        ctx.commit_now(&self.consumer, &mut owned, &ids);
        tracing::info!(partitions = ids.len(), "final commit done");
        Ended::Stopped
    }

    /// Whether a refusal since the start has lasted long enough to end the loop (`refusal.rs`).
    fn refused_for_good(&self) -> bool {
        self.refusals.borrow().for_good(Instant::now()).is_some()
    }

    /// Applies one markers record read at `at` (host wall clock `wall_ms`, the bound on
    /// marker timestamps during replay).
    fn handle(&self, result: KafkaResult<BorrowedMessage<'_>>, at: Instant, wall_ms: i64) {
        let m = match result {
            Ok(m) => m,
            Err(e) => {
                self.refusals.borrow_mut().saw(&e, at);
                return self.metrics.emit(ConsumeFailed { error: &e });
            }
        };
        self.refusals.borrow_mut().read_something();
        let mut owned = self.consumer.context().lock();
        let Some(p) = owned.partitions.get_mut(&m.partition()) else {
            return;
        };
        if p.restore != Restore::Done {
            let (id, offset) = (p.id, m.offset());
            drop(owned);
            return self.rewind(id, offset);
        }
        if let Some(check) = p.resume.as_mut() {
            let topic = &self.config.markers_topic;
            match check.check(&self.consumer, topic, m.partition(), m.offset()) {
                Verdict::Skip => return,
                Verdict::Keep => p.resume = None,
            }
        }
        if !p.stamp_checked {
            p.stamp_checked = true;
            if matches!(m.timestamp(), rdkafka::Timestamp::CreateTime(_)) {
                self.metrics
                    .emit(Problem::MarkersNotBrokerStamped { partition: p.id });
            }
        }
        let ts = p.observe(
            m.offset(),
            m.timestamp().to_millis(),
            at,
            wall_ms,
            &self.metrics,
        );
        if m.offset() < p.snapshots.skip_below {
            return; // already in the restored snapshot
        }
        let Some(ts) = ts else {
            return self.metrics.emit(MarkerUndecodable {
                partition: m.partition(),
                offset: m.offset(),
                error: &crate::marker::DecodeError::InvalidValue {
                    field: "timestamp",
                    value: "none".into(),
                },
            });
        };
        match m.payload() {
            None => self.metrics.emit(Tombstone {
                partition: m.partition(),
                offset: m.offset(),
            }),
            Some(bytes) => match decode(bytes) {
                Ok(marker) => p.apply(m.offset(), ts, &marker, &self.metrics),
                Err(e) => self.metrics.emit(MarkerUndecodable {
                    partition: m.partition(),
                    offset: m.offset(),
                    error: &e,
                }),
            },
        }
    }

    /// A marker of partition `id` arrived before its snapshot was restored. The partition is
    /// paused before its first poll, so this cannot happen; if librdkafka handed one out
    /// anyway, it is read again once the snapshot is in. If even the rewind fails, the tracker
    /// stops, so that the partition is replayed by its next owner.
    fn rewind(&self, id: i32, offset: i64) {
        self.metrics.emit(Problem::ReadBeforeRestore {
            partition: id,
            offset,
        });
        if let Err(e) = self.consumer.seek(
            &self.config.markers_topic,
            id,
            Offset::Offset(offset),
            Duration::from_secs(5),
        ) {
            self.metrics.emit(Problem::RewindFailed {
                partition: id,
                error: &e,
            });
            self.stop.store(true, Ordering::Relaxed);
        } else if let Some(p) = self.consumer.context().lock().partitions.get_mut(&id) {
            p.resume = Some(ResumeCheck::at(offset));
        }
    }

    /// Sleep until the earliest deadline of a ready partition, the next commit, or `MAX_WAIT`.
    fn wait_time(&self, next_commit: Instant) -> Duration {
        let now = Instant::now();
        let room = self.queued.load(Ordering::Relaxed) < MAX_QUEUED_JOBS;
        let mut owned = self.consumer.context().lock();
        let read_ahead = self.read_ahead.as_ref().map(|_| self.config.read_ahead);
        plan::wake_at(
            &mut owned.partitions,
            now,
            next_commit,
            MAX_WAIT,
            room,
            read_ahead,
        )
        .saturating_duration_since(now)
    }

    /// Whether the last partition has just read its Tick back while the tracker still says it
    /// is not ready: then the interval's work (readiness, the `/inspect` view, gauges, commits)
    /// is done at once rather than at the next commit interval, which made every restart look
    /// up to an interval slower than it was. Becoming unready still waits for the interval:
    /// readiness is for probes and operators, while what may be redelivered is decided per
    /// partition by its own Tick.
    fn became_ready(&self) -> bool {
        if self.ready.is_ready() {
            return false;
        }
        let owned = self.consumer.context().lock();
        plan::all_ready(&owned.partitions, owned.assigned_once)
    }

    fn send_ticks(&self, pending: &mut Vec<DeliveryFuture>) {
        pending.retain_mut(|f| match f.now_or_never() {
            None => true,
            Some(Ok(Ok(_))) => false,
            Some(Ok(Err((e, _)))) => {
                self.refusals.borrow_mut().saw(&e, Instant::now());
                self.metrics.emit(ProduceFailed {
                    what: "tick",
                    target: &self.config.markers_topic,
                    error: &e,
                });
                false
            }
            Some(Err(_)) => false,
        });
        let now = Instant::now();
        let mut stalled = Vec::new();
        let mut owned = self.consumer.context().lock();
        for p in owned.partitions.values_mut() {
            if let Some(held) = p.proof_tick_due(now) {
                if let Some(held) = held {
                    self.metrics.emit(Problem::RedeliveriesHeld {
                        partition: p.id,
                        held,
                    });
                }
                // Any nonce: it only has to be read back, and no catch-up waits for it.
                self.write_tick(p.id, random_nonce(), pending);
                p.proof_sent(now);
            }
            let Some(nonce) = p.tick_due(now) else {
                continue;
            };
            if let Some(silent) = p.silent_since_tick(now) {
                self.metrics.emit(Problem::ReplayStalled {
                    partition: p.id,
                    silent,
                });
                stalled.push((p.id, p.next_offset));
            }
            self.write_tick(p.id, nonce, pending);
            p.tick_sent(now);
        }
        drop(owned);
        for (id, next) in stalled {
            self.restart_fetch(id, next);
        }
    }

    /// Writes a Tick with `nonce` to markers partition `id`; its delivery report goes to
    /// `pending`.
    fn write_tick(&self, id: i32, nonce: u64, pending: &mut Vec<DeliveryFuture>) {
        let payload = encode(&Marker::Tick { nonce });
        let record = FutureRecord::<(), _>::to(&self.config.markers_topic)
            .partition(id)
            .payload(&payload);
        // Through the producer the worker writes this partition's Ends with, so a Tick and the
        // Ends before it reach the partition in the order they were written, as with one.
        let producer = self
            .producers
            .for_target(&self.config.markers_topic, Some(id));
        match producer.send_result(record) {
            Ok(f) => pending.push(f),
            Err((e, _)) => self.metrics.emit(ProduceFailed {
                what: "tick",
                target: &self.config.markers_topic,
                error: &e,
            }),
        }
    }

    /// Resumes partition `id` and seeks it to where it should be fetching (`restart.rs`);
    /// the records from there are checked as after any seek ([`crate::resume`]).
    fn restart_fetch(&self, id: i32, next: Option<i64>) {
        match restart::restart_fetch(&self.consumer, &self.config.markers_topic, id, next) {
            Ok(Offset::Offset(o)) => {
                if let Some(p) = self.consumer.context().lock().partitions.get_mut(&id) {
                    p.resume = Some(ResumeCheck::at(o));
                }
            }
            Ok(_) => {}
            Err(why) => tracing::warn!(
                partition = id,
                why,
                "could not restart the fetch of a stalled partition; trying again at the next Tick retry"
            ),
        }
    }

    fn dispatch_due(&self) {
        let room = MAX_QUEUED_JOBS.saturating_sub(self.queued.load(Ordering::Relaxed));
        let committed = |s: &SourceRef| {
            self.group_offsets
                .as_ref()
                .map_or(Committed::Nothing, |g| g.committed(s))
        };
        let check = self.group_offsets.as_ref().map(|_| plan::GroupCheck {
            policy: HoldPolicy::waiting(
                i64::try_from(self.config.source_group_wait.as_millis()).unwrap_or(i64::MAX),
            ),
            committed: &committed,
        });
        let due = {
            let mut owned = self.consumer.context().lock();
            plan::due_jobs(
                &mut owned.partitions,
                Instant::now(),
                room,
                self.config.expiry_batch,
                check.as_ref(),
            )
        };
        if due.held > 0 || due.copied_after_hold.total() > 0 {
            self.metrics.emit(HeldForGroup {
                held: due.held,
                copied_after_hold: due.copied_after_hold,
            });
        }
        for job in due.jobs {
            self.queued.fetch_add(1, Ordering::Relaxed);
            if self.jobs.send(job).is_err() {
                self.metrics.emit(Problem::WorkerGone);
                self.stop.store(true, Ordering::Relaxed);
                return;
            }
        }
    }

    /// Hands the records falling due within the read-ahead window to the read-ahead thread.
    fn list_read_ahead(&self) {
        let Some(hints) = &self.read_ahead else {
            return;
        };
        let sources = {
            let mut owned = self.consumer.context().lock();
            plan::read_ahead(
                &mut owned.partitions,
                Instant::now(),
                self.config.read_ahead,
                self.config.expiry_batch,
            )
        };
        hints.send(sources);
    }

    fn commit_and_publish(&self) {
        let now = Instant::now();
        let snapshots = self.consumer.context().snapshots.clone();
        let mut owned = self.consumer.context().lock();
        let assigned_once = owned.assigned_once;
        let plan = plan::interval(&mut owned.partitions, assigned_once, now, |p, oldest| {
            policy::poll_in_flight(p, &self.metrics);
            if let Some(topic) = &snapshots {
                policy::maybe_start(
                    p,
                    &self.config,
                    topic,
                    self.producers.first(),
                    &self.metrics,
                    now,
                    oldest,
                );
            }
        });
        for v in &plan.views {
            self.metrics.partition_gauges(
                v.partition,
                v.in_flight,
                v.scheduled,
                v.oldest_age_ms,
                v.ready,
            );
        }
        self.ready.set(plan.all_ready);
        self.metrics
            .readiness(plan.all_ready, owned.partitions.len());
        drop(owned);
        if let Ok(mut view) = self.view.lock() {
            *view = TrackerView {
                ready: plan.all_ready,
                partitions: plan.views,
            };
        }
        if plan.commits.is_empty() {
            return;
        }
        // Synchronous, so success and failure are both seen and counted (librdkafka does not
        // report async commit results to a BaseConsumer without a commit callback queue).
        // One round trip per interval, off the per-marker path.
        let result = self.consumer.commit(
            &commit_list(&self.config.markers_topic, &plan.commits),
            CommitMode::Sync,
        );
        let mut owned = self.consumer.context().lock();
        plan::committed(&mut owned.partitions, &plan.commits, result.is_ok());
        drop(owned);
        self.metrics.emit(CommitFinished { result: &result });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// Each marker of a drain is anchored at a clock reading taken after it was polled: the
    /// regression test for one reading reused across a drain (partition time ahead, schedules
    /// published early). The fake clock moves 1 ms per reading and each fake poll notes the
    /// time it ran, so an anchor earlier than its marker's poll shows.
    #[test]
    fn each_marker_of_a_drain_is_anchored_after_its_own_poll() {
        let base = Instant::now();
        let ticks = Cell::new(0u64);
        let clock = || {
            ticks.set(ticks.get() + 1);
            base + Duration::from_millis(ticks.get())
        };
        let polled_at = |_: ()| base + Duration::from_millis(ticks.get());
        let left = Cell::new(5);
        let mut anchored = Vec::new();
        drain(
            polled_at(()),
            || {
                // Time passes between the polls, as it does while a marker is applied.
                ticks.set(ticks.get() + 10);
                (left.get() > 0).then(|| {
                    left.set(left.get() - 1);
                    polled_at(())
                })
            },
            clock,
            7,
            |polled, at, wall_ms| {
                assert_eq!(wall_ms, 7);
                anchored.push((polled, at));
            },
        );
        assert_eq!(anchored.len(), 6, "the first and the five ready ones");
        for (polled, at) in anchored {
            assert!(
                at >= polled,
                "anchored {at:?} before its poll at {polled:?}"
            );
        }
    }

    /// A drain stops at the bound even if markers keep coming, so deadlines are looked at.
    #[test]
    fn a_drain_stops_after_its_bound() {
        let mut handled = 0usize;
        drain((), || Some(()), Instant::now, 0, |(), _, _| handled += 1);
        assert_eq!(handled, MAX_DRAIN + 1);
    }
}
