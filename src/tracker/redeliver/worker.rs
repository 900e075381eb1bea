//! The redelivery worker: turns due deliveries into copies and Ends.
//!
//! It runs on its own thread so that slow reads and produces never hold up the markers
//! consumer. For each job it reads the original records (most of them were read ahead,
//! `read_ahead.rs`), hands the copies to the producer (to the source partition, or to a
//! dead-letter topic) and passes the pass on to the landing thread (`worker/landing.rs`),
//! then takes its next job while those copies travel. The landing thread waits until they
//! are durable and only then hands the End markers that let the tracker forget them to the
//! Ends thread (`ender`), which writes them while later passes run. A crash anywhere in
//! between leaves the delivery in flight in the markers log, so it is redelivered again after
//! a restart: a duplicate at worst, never a loss.
//!
//! A copy the broker refuses for good (too large for its topic, a topic the tracker may not
//! write) goes to the dead-letter topic instead, with reason `copy-rejected`. If the
//! dead-letter topic refuses it too, the delivery is *parked*: no End is written, so it stays
//! in flight and holds the markers commit, and it is tried again with back-off (up to
//! [`MAX_PARK`]) without holding up other redeliveries. `redelivery_parked_deliveries` shows
//! how many wait so.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::message::{Message, OwnedMessage};

use crate::headers;
use crate::marker::SourceRef;
use crate::tracker::metrics::work::{Fenced, SourceReadFailed};
use crate::tracker::metrics::Problem;

use crate::marker::MAX_BATCH_RECORDS;
use crate::tracker::config::TrackerConfig;
use crate::tracker::core::action::{decide, Action, DlqReason};
use crate::tracker::core::copy::copy_headers;
use crate::tracker::core::fence::Fence;
use crate::tracker::core::state::Expiry;
use crate::tracker::metrics::Metrics;
use crate::tracker::redeliver::outgoing::{end_marker, settle_ends_marker, Outgoing, Sender};
use crate::tracker::redeliver::producers::Producers;
use crate::tracker::redeliver::published_check::already_published;
use crate::tracker::redeliver::read_ahead::ReadAheadCache;
use crate::tracker::redeliver::scheduled::unpack;
use crate::tracker::redeliver::source_reader::{ReadOutcome, SourceReader};

mod landing;
use landing::{Landing, SentPass};

/// Due deliveries of one markers partition, handed over by the consumer thread.
#[derive(Debug)]
pub struct Job {
    /// The markers partition they were tracked in; their Ends go back there.
    pub markers_partition: i32,
    /// The grant of that partition they were taken under (see `fence`).
    pub generation: u64,
    /// The due deliveries.
    pub expiries: Vec<Expiry>,
    /// Partition time when they were taken, and the local instant of that reading, to measure
    /// deadline-to-redelivery lag.
    pub taken_at_ms: i64,
    /// Local instant matching `taken_at_ms`.
    pub taken_at: Instant,
}

/// Where a due delivery came from: its markers partition (where its End goes) and when the
/// consumer took it (to measure deadline-to-redelivery lag; 0 for a retried parked one).
#[derive(Debug, Clone, Copy)]
struct Origin {
    markers_partition: i32,
    generation: u64,
    taken_at_ms: i64,
    taken_at: Instant,
}

/// Most due deliveries handled in one pass. Jobs queued while the worker was busy are merged
/// up to this, so that one read, one round of produces and one round of Ends serve them all:
/// under load the batches grow and the per-delivery cost falls.
const MAX_BATCH: usize = 5_000;

/// One due delivery with its decision and, once read, its copy.
struct Pending {
    expiry: Expiry,
    action: Action,
    record: Option<OwnedMessage>,
    copy: Option<Outgoing>,
}

/// A delivery whose copy was refused everywhere, waiting to be tried again.
struct Parked {
    expiry: Expiry,
    markers_partition: i32,
    generation: u64,
    retry_at: Instant,
}

/// Owns the source reader and the producers; see the module docs.
pub struct Redeliverer {
    config: Arc<TrackerConfig>,
    reader: SourceReader,
    producers: Producers,
    metrics: Metrics,
    stop: Arc<AtomicBool>,
    /// Which partitions this tracker still owns: work for any other is dropped.
    fence: Arc<Fence>,
    /// Deliveries whose copies every target refused; the landing thread parks them, this
    /// thread tries them again when due.
    parked: Arc<Mutex<Vec<Parked>>>,
    /// Records read ahead of their deadline (`read_ahead.rs`), if reading ahead is on.
    read_ahead: Option<Arc<ReadAheadCache>>,
    /// Waits for the copies of the passes sent, and writes their Ends (`worker/landing.rs`),
    /// so the next pass need not wait. Declared last: dropped after the rest, it waits for
    /// the passes still on their way.
    landing: Landing,
}

const IDLE_WAKE: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// The longest wait before a parked delivery is tried again.
pub const MAX_PARK: Duration = Duration::from_secs(300);

impl Redeliverer {
    /// Creates the worker's clients.
    pub fn new(
        config: Arc<TrackerConfig>,
        producers: Producers,
        metrics: Metrics,
        stop: Arc<AtomicBool>,
        fence: Arc<Fence>,
        read_ahead: Option<Arc<ReadAheadCache>>,
    ) -> Result<Self, crate::tracker::TrackerError> {
        let parked = Arc::new(Mutex::new(Vec::new()));
        let landing = Landing::start(
            config.clone(),
            producers.clone(),
            metrics.clone(),
            stop.clone(),
            fence.clone(),
            parked.clone(),
        )
        .map_err(|e| {
            crate::tracker::TrackerError::Thread(format!("the landing or Ends thread: {e}"))
        })?;
        Ok(Redeliverer {
            reader: SourceReader::new(&config, &metrics)?,
            landing,
            config,
            producers,
            metrics,
            stop,
            fence,
            parked,
            read_ahead,
        })
    }

    /// Handles jobs until the sender is dropped or a stop is requested.
    /// `queued` counts jobs sent but not yet finished; the consumer reads it to bound the queue.
    pub fn run(mut self, jobs: Receiver<Job>, queued: &AtomicUsize) {
        loop {
            // Wake at least once a second to notice a stop even when no job comes.
            let wait = lock(&self.parked)
                .iter()
                .map(|p| p.retry_at.saturating_duration_since(Instant::now()))
                .min()
                .unwrap_or(IDLE_WAKE)
                .min(IDLE_WAKE);
            let next = jobs.recv_timeout(wait);
            if self.stopping() {
                break;
            }
            match next {
                Ok(job) => {
                    let mut size = job.expiries.len();
                    let mut batch = vec![job];
                    while size < MAX_BATCH {
                        match jobs.try_recv() {
                            Ok(more) => {
                                size += more.expiries.len();
                                batch.push(more);
                            }
                            Err(_) => break,
                        }
                    }
                    let n = batch.len();
                    self.handle(batch);
                    queued.fetch_sub(n, Ordering::Relaxed);
                }
                Err(RecvTimeoutError::Timeout) => self.retry_parked(),
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
    }

    /// Hands the parked deliveries that are due back to [`Self::handle`], one job per markers
    /// partition.
    fn retry_parked(&mut self) {
        let now = Instant::now();
        let all = std::mem::take(&mut *lock(&self.parked));
        let (held, revoked): (Vec<Parked>, Vec<Parked>) = all
            .into_iter()
            .partition(|p| self.fence.holds(p.markers_partition, p.generation));
        if !revoked.is_empty() {
            self.metrics.emit(Fenced {
                n: revoked.len(),
                stage: "parked",
            });
        }
        let (due, wait): (Vec<Parked>, Vec<Parked>) =
            held.into_iter().partition(|p| p.retry_at <= now);
        // The landing thread may have parked more meanwhile: keep those too.
        lock(&self.parked).extend(wait);
        let mut jobs: BTreeMap<(i32, u64), Vec<Expiry>> = BTreeMap::new();
        for p in due {
            jobs.entry((p.markers_partition, p.generation))
                .or_default()
                .push(p.expiry);
        }
        let jobs = jobs
            .into_iter()
            .map(|((markers_partition, generation), expiries)| Job {
                markers_partition,
                generation,
                expiries,
                taken_at_ms: 0,
                taken_at: now,
            })
            .collect::<Vec<_>>();
        if !jobs.is_empty() {
            self.handle(jobs);
        }
        let parked = lock(&self.parked).len();
        self.metrics.parked(parked);
    }

    fn sender(&self) -> Sender<'_> {
        Sender {
            producers: &self.producers,
            metrics: &self.metrics,
            stop: &self.stop,
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// One pass over `jobs`, for the partitions this tracker still owns (see `fence`).
    fn handle(&mut self, jobs: Vec<Job>) {
        let work: Vec<(i32, u64)> = jobs
            .iter()
            .map(|j| (j.markers_partition, j.generation))
            .collect();
        let allowed = self.fence.begin_pass(&work);
        let guard = PassGuard {
            fence: self.fence.clone(),
            partitions: work
                .iter()
                .zip(&allowed)
                .filter(|(_, ok)| **ok)
                .map(|((p, _), _)| *p)
                .collect(),
        };
        let (jobs, revoked): (Vec<(Job, bool)>, Vec<_>) =
            jobs.into_iter().zip(allowed).partition(|(_, ok)| *ok);
        let dropped: usize = revoked.iter().map(|(j, _)| j.expiries.len()).sum();
        if dropped > 0 {
            self.metrics.emit(Fenced {
                n: dropped,
                stage: "queued",
            });
        }
        let jobs = jobs.into_iter().map(|(j, _)| j);
        self.pass(jobs.collect(), guard);
    }

    /// Reads the sources of `jobs`' deliveries, sends their copies and hands the pass to the
    /// landing thread, which waits for them; `guard` ends the fence's pass once it has landed.
    fn pass(&mut self, jobs: Vec<Job>, guard: PassGuard) {
        let oldest_job = jobs.iter().map(|j| j.taken_at).min();
        let taken_late_ms = jobs
            .iter()
            .filter(|j| j.taken_at_ms > 0)
            .flat_map(|j| j.expiries.iter().map(|e| j.taken_at_ms - e.deadline_ms))
            .max()
            .unwrap_or(0);
        let (origins, expiries) = gather(jobs);
        let timing = PassTiming::start(oldest_job, expiries.len(), taken_late_ms);
        let mut pending = self.read_sources(expiries);
        let read = timing.started.elapsed();
        if self.stopping() {
            return;
        }
        self.drop_revoked(&mut pending, &origins, &guard.fence);
        let published = self.take_already_published(&mut pending);
        let round: Vec<usize> = (0..pending.len())
            .filter(|&i| pending[i].copy.is_some())
            .collect();
        let copies = copies_of(&pending, &round);
        let started = self.sender().start(&copies);
        self.landing.land(SentPass {
            pending,
            published,
            origins,
            round,
            copies,
            started,
            timing,
            read,
            guard,
        });
    }

    /// Revoked while reading: nothing of it copied yet, so it is left to the new owner.
    fn drop_revoked(&self, pending: &mut Vec<Pending>, origins: &Origins, fence: &Fence) {
        let before = pending.len();
        pending.retain(|p| {
            origins
                .get(&p.expiry.source)
                .is_some_and(|o| fence.holds(o.markers_partition, o.generation))
        });
        if pending.len() < before {
            self.metrics.emit(Fenced {
                n: before - pending.len(),
                stage: "read",
            });
        }
    }

    /// Removes from `pending` the schedules a previous owner of the partition already
    /// published (see `published_check`). If the check fails they are published anyway: a
    /// possible duplicate, logged, rather than a possible loss.
    fn take_already_published(&self, pending: &mut Vec<Pending>) -> Vec<Pending> {
        // Per target topic: the earliest due time and the ids to look for.
        let mut targets: BTreeMap<String, (i64, HashSet<String>)> = BTreeMap::new();
        for p in pending.iter() {
            if p.action == Action::Publish && p.expiry.due_before_takeover && p.record.is_some() {
                let entry = targets
                    .entry(home_topic(p).to_string())
                    .or_insert((i64::MAX, HashSet::new()));
                entry.0 = entry.0.min(p.expiry.deadline_ms);
                entry.1.insert(p.expiry.source.to_string());
            }
        }
        let mut found = HashSet::new();
        for (topic, (since, wanted)) in targets {
            match already_published(
                &self.config,
                &self.metrics,
                &topic,
                since,
                &wanted,
                &self.stop,
            ) {
                Ok(ids) => found.extend(ids),
                Err(why) => self.metrics.emit(Problem::PublishedCheckFailed {
                    target: &topic,
                    schedules: wanted.len(),
                    why: &why,
                }),
            }
        }
        if found.is_empty() {
            return Vec::new();
        }
        let (published, rest): (Vec<Pending>, Vec<Pending>) =
            std::mem::take(pending).into_iter().partition(|p| {
                p.action == Action::Publish && found.contains(&p.expiry.source.to_string())
            });
        *pending = rest;
        published
    }

    /// Reads every source record, retrying errors that may pass, and builds the copies.
    fn read_sources(&mut self, expiries: Vec<Expiry>) -> Vec<Pending> {
        let mut groups: BTreeMap<(String, i32), Vec<Expiry>> = BTreeMap::new();
        for e in expiries {
            groups
                .entry((e.source.topic.to_string(), e.source.partition))
                .or_default()
                .push(e);
        }
        for group in groups.values_mut() {
            group.sort_by_key(|e| e.source.offset);
        }
        // Records read ahead first; then every partition of a topic at once; what that cannot
        // finish, one by one.
        let mut read: BTreeMap<(String, i32), BTreeMap<i64, ReadOutcome>> = BTreeMap::new();
        let mut topics: BTreeMap<&str, Vec<(i32, Vec<i64>)>> = BTreeMap::new();
        for ((topic, partition), group) in &groups {
            let ahead = self.read_ahead_of(group);
            let mut offsets: Vec<i64> = group
                .iter()
                .map(|e| e.source.offset)
                .filter(|o| !ahead.contains_key(o))
                .collect();
            offsets.dedup();
            if !ahead.is_empty() {
                read.insert((topic.clone(), *partition), ahead);
            }
            if !offsets.is_empty() {
                topics.entry(topic).or_default().push((*partition, offsets));
            }
        }
        for (topic, wanted) in topics {
            if self.stopping() {
                break;
            }
            for (partition, outcomes) in self.reader.read_partitions(topic, &wanted) {
                read.entry((topic.to_string(), partition))
                    .or_default()
                    .extend(outcomes);
            }
        }
        let mut out = Vec::new();
        for ((topic, partition), group) in groups {
            let mut results = read.remove(&(topic.clone(), partition)).unwrap_or_default();
            let rest: Vec<Expiry> = group
                .iter()
                .filter(|e| !results.contains_key(&e.source.offset))
                .cloned()
                .collect();
            if !rest.is_empty() {
                results.extend(self.read_group(&topic, partition, &rest));
            }
            for e in group {
                let action = decide(&e, self.config.max_deliveries);
                let outcome = results.remove(&e.source.offset);
                out.push(self.pending(e, action, outcome));
            }
        }
        out
    }

    /// The records of `group` that were read ahead of their deadline.
    fn read_ahead_of(&self, group: &[Expiry]) -> BTreeMap<i64, ReadOutcome> {
        let Some(cache) = &self.read_ahead else {
            return BTreeMap::new();
        };
        group
            .iter()
            .filter_map(|e| {
                let record = cache.take(&e.source)?;
                Some((e.source.offset, ReadOutcome::Found(record)))
            })
            .collect()
    }

    fn read_group(
        &mut self,
        topic: &str,
        partition: i32,
        group: &[Expiry],
    ) -> BTreeMap<i64, ReadOutcome> {
        let mut results = BTreeMap::new();
        let mut backoff = Duration::from_millis(100);
        loop {
            let left: Vec<i64> = group
                .iter()
                .map(|e| e.source.offset)
                .filter(|o| !results.contains_key(o))
                .collect();
            if left.is_empty() || self.stopping() {
                return results;
            }
            let (done, error) = self.reader.read_many(topic, partition, &left);
            results.extend(done);
            if let Some(error) = error {
                let at = SourceRef::new(topic, partition, left.first().copied().unwrap_or(-1));
                self.metrics.emit(SourceReadFailed {
                    source: &at,
                    error: &error,
                });
                // librdkafka reports a deleted topic to an assigned consumer only after
                // `topic.metadata.propagation.max.ms`; the metadata says so at once.
                if let Some(why) = self.reader.missing(topic, partition) {
                    for offset in left {
                        results.insert(offset, ReadOutcome::Gone(why.clone()));
                    }
                    continue;
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
                if let Err(e) = self.reader.reset(&self.config) {
                    self.metrics.emit(SourceReadFailed {
                        source: &at,
                        error: &e,
                    });
                }
            }
        }
    }

    fn pending(&self, expiry: Expiry, action: Action, outcome: Option<ReadOutcome>) -> Pending {
        // A schedule's "source record" is its marker: deliver the record inside it.
        let outcome = match (outcome, &action) {
            (Some(ReadOutcome::Found(marker)), Action::Publish) => {
                Some(unpack(&marker).map_or_else(ReadOutcome::Gone, ReadOutcome::Found))
            }
            (outcome, _) => outcome,
        };
        let (action, record) = match outcome {
            Some(ReadOutcome::Found(m)) => (action, Some(m)),
            Some(ReadOutcome::Gone(why)) => (
                Action::DeadLetter {
                    reason: DlqReason::SourceUnreadable,
                    detail: why,
                },
                None,
            ),
            // Only when stopping: nothing is produced, the delivery stays in flight.
            None => {
                return Pending {
                    expiry,
                    action,
                    record: None,
                    copy: None,
                }
            }
        };
        let copy = Some(build_copy(&self.config, &expiry, &action, record.as_ref()));
        Pending {
            expiry,
            action,
            record,
            copy,
        }
    }
}

/// The record that redelivers, dead-letters or publishes `expiry`, made from its source
/// `record` (none when it could not be read).
fn build_copy(
    config: &TrackerConfig,
    expiry: &Expiry,
    action: &Action,
    record: Option<&OwnedMessage>,
) -> Outgoing {
    let original = record.map_or_else(Vec::new, |m| headers::from_kafka(m.headers()));
    let source = &expiry.source;
    let (what, topic, partition, headers) = match action {
        Action::Publish => {
            let mut headers = original;
            headers.push((
                crate::headers::SCHEDULE_ID.into(),
                Some(source.to_string().into_bytes()),
            ));
            let (topic, partition) = record.map_or((source.topic.to_string(), None), |m| {
                (
                    m.topic().to_string(),
                    Some(m.partition()).filter(|p| *p >= 0),
                )
            });
            ("scheduled", topic, partition, headers)
        }
        Action::Redeliver { attempt } => (
            "copy",
            source.topic.to_string(),
            Some(source.partition),
            copy_headers(&original, source, *attempt, None),
        ),
        Action::DeadLetter { reason, detail } => (
            "dead_letter",
            config.dlq_topic_for(record.map_or(&*source.topic, |m| m.topic())),
            None,
            copy_headers(&original, source, expiry.attempt, Some((*reason, detail))),
        ),
    };
    Outgoing {
        what,
        topic,
        partition,
        key: record.and_then(|m| m.key().map(<[u8]>::to_vec)),
        payload: record.and_then(|m| m.payload().map(<[u8]>::to_vec)),
        headers,
    }
}

/// The copies of `pending[i]` for each `i` of `round`, in that order.
fn copies_of(pending: &[Pending], round: &[usize]) -> Vec<Outgoing> {
    round
        .iter()
        .filter_map(|&i| pending[i].copy.clone())
        .collect()
}

/// Where each due delivery of a pass came from.
type Origins = HashMap<SourceRef, Origin>;

/// The expiries of a pass's jobs, and the origin of each.
fn gather(jobs: Vec<Job>) -> (Origins, Vec<Expiry>) {
    let mut origins = Origins::default();
    let mut expiries = Vec::new();
    for job in jobs {
        let origin = Origin {
            markers_partition: job.markers_partition,
            generation: job.generation,
            taken_at_ms: job.taken_at_ms,
            taken_at: job.taken_at,
        };
        for e in job.expiries {
            origins.insert(e.source.clone(), origin);
            expiries.push(e);
        }
    }
    (origins, expiries)
}

/// The markers that end `ended` (markers partition, delivery), and the markers partitions
/// they go to. A delivery's End is one Settle marker (format version 2) per markers
/// partition and source partition, the way a client settles a batch: in a burst of
/// redeliveries the tracker used to write, and read back, one marker per copy. A schedule's
/// End stays a version 1 End: clients' schedule look-ups (`client/schedule_scan.rs`) read
/// it, and clients are upgraded after the tracker.
fn end_markers<'a>(
    markers_topic: &str,
    ended: impl Iterator<Item = (i32, &'a SourceRef)>,
) -> (Vec<i32>, Vec<Outgoing>) {
    let mut partitions = Vec::new();
    let mut out = Vec::new();
    let mut settles: BTreeMap<(i32, &str, i32), Vec<i64>> = BTreeMap::new();
    for (markers_partition, source) in ended {
        if !partitions.contains(&markers_partition) {
            partitions.push(markers_partition);
        }
        if *source.topic == *markers_topic {
            out.push(end_marker(markers_topic, markers_partition, source));
        } else {
            settles
                .entry((markers_partition, &source.topic, source.partition))
                .or_default()
                .push(source.offset);
        }
    }
    for ((markers_partition, topic, partition), mut offsets) in settles {
        offsets.sort_unstable();
        offsets.dedup();
        for chunk in offsets.chunks(MAX_BATCH_RECORDS) {
            out.push(settle_ends_marker(
                markers_topic,
                markers_partition,
                topic,
                partition,
                chunk,
            ));
        }
    }
    (partitions, out)
}

/// The topic a pending delivery belongs to: the target of a schedule, else the source topic.
/// Its dead-letter topic is derived from it.
fn home_topic(p: &Pending) -> &str {
    p.record
        .as_ref()
        .map_or(&*p.expiry.source.topic, |m| m.topic())
}

/// Where a redelivery pass spent its time, logged at debug level: how late after its deadline
/// the latest expiry was taken, how long its oldest job waited in the queue, then reading the sources, producing the copies, and handing the Ends
/// to the Ends thread (`ends_ms`: only a wait if that thread is behind).
struct PassTiming {
    started: Instant,
    expiries: usize,
    queued_for: Duration,
    /// How long after its deadline (partition time) the latest-taken expiry was taken from the
    /// deadline heap: the markers consumer's share of the lag.
    taken_late_ms: i64,
}

impl PassTiming {
    /// `oldest_job`: when the first of the merged jobs was taken from the deadline heap.
    fn start(oldest_job: Option<Instant>, expiries: usize, taken_late_ms: i64) -> Self {
        let queued_for = oldest_job.map(|t| t.elapsed()).unwrap_or_default();
        PassTiming {
            started: Instant::now(),
            expiries,
            queued_for,
            taken_late_ms,
        }
    }

    fn log(&self, read: Duration, copied: Duration) {
        tracing::debug!(
            expiries = self.expiries,
            taken_late_ms = self.taken_late_ms,
            queued_ms = self.queued_for.as_secs_f64() * 1e3,
            read_ms = read.as_secs_f64() * 1e3,
            copies_ms = (copied - read).as_secs_f64() * 1e3,
            ends_ms = (self.started.elapsed() - copied).as_secs_f64() * 1e3,
            "redelivery pass"
        );
    }
}

/// Ends the fence's pass for `partitions` when dropped: however [`Redeliverer::pass`] returns,
/// or once the landing thread is done with the pass.
struct PassGuard {
    fence: Arc<Fence>,
    partitions: Vec<i32>,
}

impl Drop for PassGuard {
    fn drop(&mut self) {
        self.fence.end_pass(&self.partitions);
    }
}

/// The parked deliveries; a poisoned lock only means a panic elsewhere, the list is whole.
fn lock(parked: &Mutex<Vec<Parked>>) -> MutexGuard<'_, Vec<Parked>> {
    parked.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests;
