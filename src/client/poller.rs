//! The poll thread: the client side of the protocol.
//!
//! For each batch it polls, in this order and no other:
//! 1. queue a Start marker for every record (idempotent producer, `acks=all`);
//! 2. wait until every Start is acknowledged;
//! 3. commit, per source partition, only up to the first record whose Start failed, and seek
//!    back to that record so it is polled again;
//! 4. hand the records with durable Starts to the application; if the group refused the
//!    commit because it moved on without this member's generation (a rebalance), hand out
//!    nothing and seek back instead, so that the batch is delivered once, here or by the
//!    partitions' next owner (for up to `REFUSED_GRACE`; then as after any failed commit).
//!
//! Up to `PIPELINE_DEPTH` batches are between steps 1 and 4 at once (the next batch's Starts
//! travel while the oldest batch waits for its own); batches are finished strictly in the order
//! they were polled, so each batch's steps 2–4 still happen in that order.
//!
//! A partition revoked while a batch is in flight is left out of that batch: none of its
//! records is handed out or committed, because its next owner reads them again from the
//! committed offset (see `without_revoked`).
//!
//! Records whose Starts are durable but which were not handed out for a rebalance's sake (a
//! refused commit, a revocation) are kept alive until the group settles, so that a rebalance
//! longer than the timeout does not have them redelivered as well as read again by their
//! next owner (`lease.rs`).
//!
//! If the seek back fails, the partition is *held*: nothing of it from that record on is handed
//! out or committed, and the seek is retried on every turn of the loop until it succeeds (or
//! the partition is taken away, and its next owner starts from the committed offset).
//!
//! So a source offset is never committed before its Start is durable. A crash before step 3
//! re-polls the batch (duplicate Starts, which the tracker absorbs); a crash after it leaves the
//! Starts in the markers topic, and the tracker redelivers after the timeout.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use futures::future::join_all;
use futures::FutureExt;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::{KafkaError, KafkaResult};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::events::{Event, EventKind};
use crate::failpoint;
use crate::headers::{self, checked, HeaderList};
use crate::marker::{
    duration_to_ms_u32, Marker, Offsets, SourceRef, StartBatch, MAX_BATCH_RECORDS,
};

use crate::resume::{committed_many, ResumeChecks};

use super::body::{Body, Chunks};
use super::coalesce::Op;
use super::config::{ConsumerConfig, MarkerFormat};
use super::context::PollContext;
use super::delivery::Delivery;
use super::lease::Leases;
use super::retry::RetryPolicy;
use super::settler::Settler;

/// A polled record, copied once out of librdkafka's buffer: what the Start marker and the
/// delivery need, moved (not copied again) into the delivery.
struct Polled {
    source: SourceRef,
    timestamp_ms: Option<i64>,
    body: Body,
    headers: HeaderList,
    attempt: u32,
    timeout: Duration,
}

pub(crate) struct Poller {
    pub(crate) consumer: BaseConsumer<PollContext>,
    pub(crate) settler: Arc<Settler>,
    pub(crate) config: ConsumerConfig,
    /// Handed-out batches, in the order polled.
    pub(crate) out: mpsc::Sender<Vec<Delivery>>,
    /// The consumer's retry policy, shared by every delivery.
    pub(crate) retry: Arc<RetryPolicy>,
    pub(crate) stop: Arc<AtomicBool>,
    /// Partitions whose seek back to a failed Start failed too: from that offset on, nothing
    /// of them is handed out or committed until a seek succeeds.
    pub(crate) held: RefCell<BTreeMap<(String, i32), i64>>,
    /// Partitions assigned or sought whose first record is not checked yet: where they
    /// resume is checked ([`crate::resume`]). Empty but for a moment after a rebalance.
    pub(crate) resuming: RefCell<ResumeChecks>,
    /// Partitions a rebalance took away since the batches in flight were last told (see
    /// [`InFlight::revoked`]).
    pub(crate) revoked: RefCell<Vec<(String, i32)>>,
    /// Since when commits have been refused by a rebalance without a success in between.
    pub(crate) refused_since: std::cell::Cell<Option<Instant>>,
    /// Records started but not handed out while a rebalance may move them, kept alive until
    /// the group settles (`lease.rs`).
    pub(crate) leases: RefCell<Leases>,
    /// How many assignments have come (each means the group settled), and how many had come
    /// when the partitions in `revoked` were taken away.
    pub(crate) settled_groups: std::cell::Cell<(u64, Option<u64>)>,
    /// One shared name per subscribed topic, given to every record of it (see [`Topics`]).
    pub(crate) topics: Topics,
    /// The scratch buffer records' bodies are copied into, kept from batch to batch
    /// (`body.rs`).
    pub(crate) chunks: std::cell::Cell<Chunks>,
    /// How many records the last poll batch took: the next one makes room for as many up
    /// front. Grown one push at a time, a batch of 2,000 moved to a bigger buffer nine times
    /// (BENCHMARKS.md, "One answer per Settle marker"); sized by `max_batch`, a trickle of
    /// records would allocate a full batch's room on every poll.
    pub(crate) last_batch: std::cell::Cell<usize>,
}

/// The names of the topics records came from, one allocation each: every record's
/// [`SourceRef`] shares its topic's name instead of copying it, and the coalescer matches a
/// settlement to its partition's gathering by pointer.
#[derive(Default)]
pub(crate) struct Topics(RefCell<Vec<Arc<str>>>);

impl Topics {
    /// The shared name of `topic`. A consumer reads a handful of topics, so a list is searched.
    fn get(&self, topic: &str) -> Arc<str> {
        let mut known = self.0.borrow_mut();
        if let Some(name) = known.iter().find(|n| ***n == *topic) {
            return name.clone();
        }
        let name: Arc<str> = topic.into();
        known.push(name.clone());
        name
    }
}

/// Batches whose Starts are on their way, at most this many at once: while the oldest waits
/// for its Starts to become durable, the next one is polled and its Starts sent, so the round
/// trip to the broker overlaps with useful work instead of idling the poll thread.
const PIPELINE_DEPTH: usize = 2;

/// How long commits refused by a rebalance make the poll thread poll their batches again
/// rather than hand them out. A rebalance normally ends within seconds; past this, batches
/// are handed out uncommitted, as for any other failed commit.
const REFUSED_GRACE: Duration = Duration::from_secs(10);

/// How long the application may hold every allowed delivery before fetching pauses.
const PAUSE_AFTER: Duration = Duration::from_millis(250);

/// A polled batch whose Start markers were sent and are not all known durable yet.
struct InFlight {
    batch: Vec<Polled>,
    /// Resolves to one flag per record of `batch`: its Start is durable.
    starts: Pin<Box<dyn Future<Output = Vec<bool>> + Send>>,
    /// Records of these partitions from these offsets on were rewound (an earlier batch's
    /// Start failed there and the consumer seeked back): they will be polled again, so this
    /// batch must neither hand them out nor commit past them.
    rewound: Vec<(String, i32, i64)>,
    /// Partitions taken away by a rebalance after this batch was polled. Their records are
    /// neither handed out nor committed: the partition's next owner reads them again from the
    /// committed offset, so handing them out here as well would deliver each twice.
    revoked: Vec<(String, i32)>,
    /// How many assignments had come when `revoked` was first added to: if more have come by
    /// the time this batch is finished, the group settled since, and the revoked records'
    /// next owner may be reading them already.
    revoked_at: Option<u64>,
    /// When its Starts were sent: each record's deadline counts from here (`Delivery::expires`).
    started_at: Instant,
}

impl Poller {
    pub(crate) fn run(self) {
        let mut paused = false;
        let mut stalled_since: Option<Instant> = None;
        let mut backoff = Duration::from_millis(50);
        let mut pipeline: VecDeque<InFlight> = VecDeque::new();
        let max = self.config.max_unsettled;
        while !self.stop.load(Ordering::Relaxed) && !self.out.is_closed() {
            self.retry_held(&mut pipeline);
            self.renew_leases();
            let queued: usize = pipeline.iter().map(|b| b.batch.len()).sum();
            let room = max.saturating_sub(self.settler.unsettled() + queued);
            paused = self.back_pressure(paused, &mut stalled_since, room);
            if room == 0 && !paused && pipeline.is_empty() {
                self.settler.wait_for_room(Duration::from_millis(5));
                continue;
            }
            let polled = self.take_batch(&mut pipeline, room, paused);
            match self.hand_out_oldest(&mut pipeline, !polled) {
                Some(true) => backoff = Duration::from_millis(50),
                Some(false) => {
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
                None => {}
            }
        }
        // Batches still in flight were neither committed nor handed out: they are polled again
        // by whoever owns their partitions next (duplicate Starts, which the tracker absorbs).
        tracing::debug!(unfinished = pipeline.len(), "poll thread stopped");
    }

    /// Back-pressure; returns whether fetching is now paused. A short stall (the application
    /// settles a moment later) only waits: pausing would make librdkafka drop what it has
    /// prefetched and fetch it again on resume, which under steady load costs more than it
    /// saves. A stall that lasts pauses fetching, so nothing piles up while the application is
    /// stuck; fetching resumes once half the room is free again.
    fn back_pressure(
        &self,
        paused: bool,
        stalled_since: &mut Option<Instant>,
        room: usize,
    ) -> bool {
        *stalled_since = if room == 0 {
            stalled_since.or_else(|| Some(Instant::now()))
        } else {
            None
        };
        let stalled_long = stalled_since.is_some_and(|t| t.elapsed() >= PAUSE_AFTER);
        if !paused && stalled_long {
            self.set_paused(true)
        } else if paused && room * 2 >= self.config.max_unsettled {
            self.set_paused(false)
        } else {
            paused
        }
    }

    /// Polls a batch and queues its Starts, if the pipeline and the room allow; whether it
    /// got any record.
    fn take_batch(&self, pipeline: &mut VecDeque<InFlight>, room: usize, paused: bool) -> bool {
        if pipeline.len() >= PIPELINE_DEPTH || (room == 0 && !paused) {
            return false;
        }
        // Paused, the poll serves rebalances. A partition assigned meanwhile is paused as it
        // is assigned (`PollContext`), but records fetched before that may be queued: at most
        // one is taken per poll.
        let limit = if paused {
            1
        } else {
            room.min(self.config.max_batch)
        };
        // With batches in flight, take only what is already fetched: the oldest batch is
        // waiting to be handed out.
        let wait = match (pipeline.is_empty(), paused) {
            (false, _) => Duration::ZERO,
            (true, true) => Duration::from_millis(10),
            (true, false) => Duration::from_millis(100),
        };
        let batch = self.poll_batch(limit, wait);
        // Every batch already in flight was polled before the partitions just revoked were
        // taken away (the new batch was sorted out as it was polled, see `poll_batch`).
        let revoked = std::mem::take(&mut *self.revoked.borrow_mut());
        if !revoked.is_empty() {
            let (settled, at) = self.settled_groups.get();
            let at = at.unwrap_or(settled);
            self.settled_groups.set((settled, None));
            for b in pipeline.iter_mut() {
                b.revoked.extend(revoked.iter().cloned());
                b.revoked_at = Some(b.revoked_at.map_or(at, |a| a.min(at)));
            }
        }
        // After every poll, not only an empty one: the other partitions' records may keep
        // the polls full while one partition gets nothing.
        if !paused {
            self.check_stalled_resumes();
        }
        if batch.is_empty() {
            return false;
        }
        pipeline.push_back(self.start(batch));
        true
    }

    /// Commits and hands out the oldest batch once its Starts are durable, waiting for them
    /// when the pipeline is full or nothing new came (`must_wait`). `None` when nothing was
    /// finished; otherwise whether it went well (see [`Self::finish`]).
    fn hand_out_oldest(&self, pipeline: &mut VecDeque<InFlight>, must_wait: bool) -> Option<bool> {
        let must_wait = must_wait || pipeline.len() >= PIPELINE_DEPTH;
        let oldest = pipeline.front_mut()?;
        let durable = if must_wait {
            block_on(oldest.starts.as_mut())
        } else {
            oldest.starts.as_mut().now_or_never()?
        };
        let oldest = pipeline.pop_front()?;
        Some(self.finish(oldest, durable, pipeline))
    }

    /// Pauses or resumes every assigned partition; returns the new paused state. Pausing is how
    /// back-pressure reaches the broker: nothing is fetched, nothing piles up in memory.
    fn set_paused(&self, pause: bool) -> bool {
        let Ok(assignment) = self.consumer.assignment() else {
            return !pause;
        };
        let result = if pause {
            self.consumer.pause(&assignment)
        } else {
            self.consumer.resume(&assignment)
        };
        if result.is_ok() {
            self.consumer.context().set_paused(pause);
        }
        match result {
            Ok(()) if !pause => {
                // A paused partition's prefetched records are dropped; resumed, it fetches
                // again from its position, which may lie inside a record batch.
                self.check_resumes_at_positions();
                false
            }
            Ok(()) => pause,
            Err(e) => {
                tracing::warn!(error = %e, pause, "could not pause/resume fetching");
                !pause
            }
        }
    }

    fn poll_batch(&self, limit: usize, wait: Duration) -> Vec<Polled> {
        let mut batch = Vec::with_capacity(self.last_batch.get().min(limit));
        let mut chunks = self.chunks.take();
        let mut timeout = wait;
        while batch.len() < limit {
            let polled = self.consumer.poll(timeout);
            let revoked = self.note_rebalance();
            if !revoked.is_empty() {
                // Polled before the revocation, no Start sent yet: the next owner reads them.
                batch.retain(|p: &Polled| !in_partitions(&revoked, &p.source));
            }
            match polled {
                None => break,
                Some(Ok(m)) if self.resume_skips(&m) => {}
                Some(Ok(m)) => batch.push(self.polled(&m, &mut chunks)),
                Some(Err(e)) => {
                    self.settler.consumer_error(&e);
                    break;
                }
            }
            timeout = Duration::ZERO;
        }
        chunks.seal(batch.iter_mut().map(|p| &mut p.body));
        self.chunks.set(chunks);
        self.last_batch.set(batch.len());
        batch
    }

    /// Takes the partitions a rebalance assigned (their resume is to be checked) and let go;
    /// returns those let go, which are also kept for the batches in flight.
    fn note_rebalance(&self) -> Vec<(String, i32)> {
        let changes = self.consumer.context().take();
        // A rebalance revokes before it assigns: a revocation taken with an assignment came
        // before the group settled.
        let (settled, at) = self.settled_groups.get();
        let at = if changes.revoked.is_empty() {
            at
        } else {
            Some(at.unwrap_or(settled))
        };
        self.settled_groups
            .set((settled + changes.assignments as u64, at));
        if changes.assignments > 0 {
            self.group_settled();
        }
        if changes.assigned.is_empty() && changes.revoked.is_empty() {
            return Vec::new();
        }
        self.revoked
            .borrow_mut()
            .extend(changes.revoked.iter().cloned());
        let moved: Vec<(String, i32)> = changes
            .revoked
            .iter()
            .chain(&changes.assigned)
            .cloned()
            .collect();
        // One look-up for all of them, here rather than on each one's first record. A
        // partition with nothing committed starts where `auto.offset.reset` says: unchecked.
        let committed = committed_many(&self.consumer, &changes.assigned);
        self.resuming.borrow_mut().rebalanced(&moved, committed);
        changes.revoked
    }

    /// Whether `m` is to be dropped while its partition's resume is checked (it comes before
    /// the resume offset, or the consumer was sent back and it will come again in order).
    fn resume_skips(&self, m: &BorrowedMessage<'_>) -> bool {
        let mut resuming = self.resuming.borrow_mut();
        !resuming.is_empty() && resuming.skips(&self.consumer, m.topic(), m.partition(), m.offset())
    }

    /// Checks that saw no record for a while send their partition back a step (see
    /// [`crate::resume::ResumeCheck::stalled`]): a broker may answer a fetch inside the last batch with
    /// nothing.
    fn check_stalled_resumes(&self) {
        let mut resuming = self.resuming.borrow_mut();
        if !resuming.is_empty() {
            resuming.stalled(&self.consumer);
        }
    }

    /// After a resume of fetching, each partition's next record is checked against its
    /// position (see [`crate::resume`]), unless its resume is being checked already: then
    /// the position may lie before the resume offset (`ResumeChecks::fetch_resumed`).
    fn check_resumes_at_positions(&self) {
        let Ok(positions) = self.consumer.position() else {
            return;
        };
        let mut resuming = self.resuming.borrow_mut();
        for e in positions.elements() {
            if let Offset::Offset(at) = e.offset() {
                resuming.fetch_resumed(e.topic(), e.partition(), at);
            }
        }
    }

    /// After a seek of our own, the partition's resume is checked like after an assignment.
    fn check_resume_at(&self, topic: &str, partition: i32, offset: i64) {
        self.resuming.borrow_mut().sought(topic, partition, offset);
    }

    fn polled(&self, message: &BorrowedMessage<'_>, chunks: &mut Chunks) -> Polled {
        let headers = headers::from_kafka(message.headers());
        // Most records carry no headers at all: skip the three look-ups (about 200
        // instructions a record in the client's profile) when there is nothing to look in.
        let (attempt, timeout) = if headers.is_empty() {
            (1, self.config.default_timeout)
        } else {
            let odd = checked::odd_ones(&headers);
            if !odd.is_empty() {
                self.settler.odd_headers(message.topic(), &odd);
            }
            let attempt = checked::attempt(&headers).value().unwrap_or(1);
            let timeout = checked::timeout(&headers)
                .value()
                .unwrap_or(self.config.default_timeout);
            (attempt, timeout)
        };
        Polled {
            source: SourceRef {
                topic: self.topics.get(message.topic()),
                partition: message.partition(),
                offset: message.offset(),
            },
            timestamp_ms: message.timestamp().to_millis(),
            body: chunks.add(message.key(), message.payload()),
            headers,
            attempt,
            timeout,
        }
    }

    /// Step 1 for one batch: queues its Start markers, one per record (version 1) or one per
    /// source partition (version 2).
    fn start(&self, batch: Vec<Polled>) -> InFlight {
        failpoint::hit("after-poll");
        // Read before the Starts go: the tracker's deadlines count from their broker
        // timestamps, later still, so a delivery expired by this reading is due there too.
        let started_at = Instant::now();
        let markers = match self.config.marker_format {
            MarkerFormat::V1 => batch
                .iter()
                .enumerate()
                .map(|(i, p)| (vec![i], start_v1(p)))
                .collect(),
            _ => start_batches(&batch, self.config.default_timeout),
        };
        let futures: Vec<_> = markers
            .into_iter()
            .map(|(records, marker)| {
                // A failpoint can make a Start fail as the broker would: never written.
                let sent = (!failpoint::fails("start")).then(|| self.settler.send(&marker));
                (records, sent)
            })
            .collect();
        failpoint::hit("after-start-sent");
        let count = batch.len();
        let starts = async move {
            let mut durable = vec![false; count];
            let answers = join_all(futures.into_iter().map(|(records, sent)| async move {
                let ok = match sent {
                    Some(Ok(f)) => matches!(f.await, Ok(Ok(_))),
                    Some(Err(_)) | None => false,
                };
                (records, ok)
            }))
            .await;
            for (records, ok) in answers {
                for i in records {
                    durable[i] = ok;
                }
            }
            durable
        };
        InFlight {
            batch,
            starts: Box::pin(starts),
            rewound: Vec::new(),
            revoked: Vec::new(),
            revoked_at: None,
            started_at,
        }
    }

    /// Steps 2–4 for a batch whose Starts have all been answered (`durable`, per record).
    /// Returns false if some Start failed.
    fn finish(&self, done: InFlight, durable: Vec<bool>, later: &mut VecDeque<InFlight>) -> bool {
        failpoint::hit("after-start-durable");
        let InFlight {
            batch,
            rewound,
            revoked,
            revoked_at,
            started_at,
            ..
        } = done;
        let (batch, durable, released) = without_revoked(batch, durable, &revoked);
        if released.records > 0 {
            // Kept alive only while the group has not settled since: after that, their next
            // owner's Start may already have come (and a KeepAlive then only adds noise).
            let settling = revoked_at.is_some_and(|at| at == self.settled_groups.get().0);
            let kept_alive = if settling { released.started.len() } else { 0 };
            tracing::info!(
                records = released.records,
                kept_alive,
                partitions = ?revoked,
                "records of partitions revoked while their Starts were in flight: not handed \
                 out or committed; their next owner reads them again"
            );
            if settling {
                self.hold_through_rebalance(released.started);
            }
        }
        // Nothing rewound or held is the rule: then the batch is not moved again.
        let (batch, durable): (Vec<Polled>, Vec<bool>) =
            if rewound.is_empty() && self.held.borrow().is_empty() {
                (batch, durable)
            } else {
                batch
                    .into_iter()
                    .zip(durable)
                    .filter(|(p, _)| !is_rewound(&rewound, &p.source) && !self.is_held(&p.source))
                    .unzip()
            };
        let (handed, failed) = split_at_first_failure(batch, durable);
        for (topic, partition, offset) in &failed {
            tracing::warn!(
                topic,
                partition,
                offset,
                "Start marker not durable; not committing past it and polling it again"
            );
            self.rewind(topic, *partition, *offset, later);
        }
        let committed = self.commit(&handed);
        let refused_for = match &committed {
            Err(e) if moved_by_rebalance(e) => {
                let since = self.refused_since.get().unwrap_or_else(Instant::now);
                self.refused_since.set(Some(since));
                since.elapsed()
            }
            _ => {
                self.refused_since.set(None);
                Duration::ZERO
            }
        };
        if let Err(e) = committed {
            if moved_by_rebalance(&e) && refused_for < REFUSED_GRACE {
                // The group moved on without this member's generation: its partitions may
                // go to another worker, which reads from the committed offset. Handed out
                // here too, the batch would be delivered twice; polled again instead, it is
                // delivered here if the partitions stay, and there if they move.
                let firsts = first_offsets(&handed);
                tracing::info!(
                    error = %e,
                    records = handed.len(),
                    "commit refused by a rebalance; not handing the batch out, polling it again \
                     (kept alive until the group settles)"
                );
                for ((topic, partition), offset) in firsts {
                    self.rewind(&topic, partition, offset, later);
                }
                self.hold_through_rebalance(
                    handed.into_iter().map(|p| (p.source, p.timeout)).collect(),
                );
                // No back-off: the next poll is what lets the rebalance finish.
                return true;
            }
            // The Starts are durable, so handing over is still safe: at worst the batch is
            // polled again after a rebalance and delivered twice. A group that goes on
            // refusing (a member stuck behind its group) is served so too after the grace:
            // polling again would refresh the Starts for ever and deliver nothing.
            tracing::warn!(error = %e, "commit of source offsets failed");
        }
        failpoint::hit("after-commit");
        self.leases
            .borrow_mut()
            .handed_out(handed.iter().map(|p| &p.source));
        // The batch goes over as one message: a send per record (and the wake-up of the
        // receiving task each can cost) showed in the profile.
        // Counted once for the batch: the count is shared with the application's thread,
        // which takes one off at every settlement.
        self.settler.handed_out(handed.len());
        let deliveries: Vec<Delivery> = handed
            .into_iter()
            .map(|p| self.delivery(p, started_at))
            .collect();
        if !deliveries.is_empty() {
            // If the application dropped the consumer, the deliveries' Drop releases them.
            let _ = self.out.blocking_send(deliveries);
        }
        failed.is_empty()
    }

    /// Makes `topic`/`partition` come again from `offset`: seeks back (or holds the partition
    /// if the seek fails), and tells the batches polled after this one (`later`), whose
    /// records past the offset will come again.
    fn rewind(&self, topic: &str, partition: i32, offset: i64, later: &mut VecDeque<InFlight>) {
        if !self.seek_back(topic, partition, offset) {
            let mut held = self.held.borrow_mut();
            let at = held.entry((topic.to_string(), partition)).or_insert(offset);
            *at = (*at).min(offset);
        }
        for b in later.iter_mut() {
            b.rewound.push((topic.to_string(), partition, offset));
        }
    }

    /// Seeks `topic`/`partition` back to `offset`; false (logged) if that failed.
    fn seek_back(&self, topic: &str, partition: i32, offset: i64) -> bool {
        let result = if failpoint::fails("seek") {
            Err(rdkafka::error::KafkaError::Seek("failpoint".into()))
        } else {
            self.consumer.seek(
                topic,
                partition,
                Offset::Offset(offset),
                Duration::from_secs(5),
            )
        };
        match result {
            Ok(()) => {
                self.check_resume_at(topic, partition, offset);
                true
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    topic,
                    partition,
                    offset,
                    "seek back failed; holding the partition (nothing of it from this offset on \
                     is handed out or committed) and trying again"
                );
                false
            }
        }
    }

    /// Whether `s` lies in a held partition at or after the record it must be re-read from.
    fn is_held(&self, s: &SourceRef) -> bool {
        let held = self.held.borrow();
        // Almost always empty: then no key (a copy of the topic name) is built.
        !held.is_empty()
            && held
                .get(&(s.topic.to_string(), s.partition))
                .is_some_and(|&from| s.offset >= from)
    }

    /// Tries the seek of each held partition again. A partition no longer assigned is let go:
    /// its next owner starts from the committed offset, which never passed the held record.
    fn retry_held(&self, pipeline: &mut VecDeque<InFlight>) {
        if self.held.borrow().is_empty() {
            return;
        }
        let assigned = self.consumer.assignment().ok();
        let held: Vec<((String, i32), i64)> = self
            .held
            .borrow()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for ((topic, partition), offset) in held {
            let ours = assigned
                .as_ref()
                .is_none_or(|a| a.find_partition(&topic, partition).is_some());
            if ours && !self.seek_back(&topic, partition, offset) {
                continue;
            }
            self.held.borrow_mut().remove(&(topic.clone(), partition));
            // Batches polled while held may hold records past the seek: those come again.
            for b in pipeline.iter_mut() {
                b.rewound.push((topic.clone(), partition, offset));
            }
            tracing::info!(topic, partition, offset, ours, "held partition released");
        }
    }

    /// Writes the KeepAlives due for the records kept alive through a rebalance, and reports
    /// those that failed.
    fn renew_leases(&self) {
        let mut leases = self.leases.borrow_mut();
        if leases.is_idle() {
            return;
        }
        let now = Instant::now();
        if let Some((failed, error)) = leases.answered(now) {
            tracing::warn!(
                failed,
                error,
                "keep-alives of records waiting for their partitions' next owner failed; the \
                 tracker may redeliver them too (a duplicate, never a loss)"
            );
        }
        if leases.waiting() {
            return;
        }
        match leases.due(now) {
            Ok(due) => {
                for (source, timeout_ms) in due {
                    let answer = self.settler.queue(&source, Op::KeepAlive(timeout_ms));
                    leases.written(answer);
                }
            }
            Err(records) => tracing::warn!(
                records,
                limit_s = super::lease::LEASE_LIMIT.as_secs(),
                "the group has not settled within the limit; no longer keeping alive the records \
                 not handed out for its sake (the tracker redelivers them when they time out)"
            ),
        }
    }

    /// Keeps `records` alive until the group settles, and counts them.
    fn hold_through_rebalance(&self, records: Vec<(SourceRef, Duration)>) {
        self.settler
            .held_through_rebalances
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        self.leases.borrow_mut().hold(records, Instant::now());
    }

    /// An assignment came: the group has settled, and the records kept alive for its sake
    /// are left to their next owner.
    fn group_settled(&self) {
        let (records, held_for) = self.leases.borrow_mut().settled(Instant::now());
        if records > 0 {
            tracing::info!(
                records,
                held_for_ms = held_for.as_millis() as u64,
                "group settled; records kept alive through the rebalance are left to their next \
                 owner"
            );
        }
    }

    fn commit(&self, handed: &[Polled]) -> KafkaResult<()> {
        let mut next: BTreeMap<(&str, i32), i64> = BTreeMap::new();
        for p in handed {
            let e = next
                .entry((&*p.source.topic, p.source.partition))
                .or_insert(0);
            *e = (*e).max(p.source.offset + 1);
        }
        let mut tpl = TopicPartitionList::new();
        for ((topic, partition), offset) in next {
            let _ = tpl.add_partition_offset(topic, partition, Offset::Offset(offset));
        }
        if tpl.count() == 0 {
            return Ok(());
        }
        // Synchronous, so that a batch handed out is committed: a crash after this point leaves
        // the batch to the tracker and it is not polled again (tests/crash_points.rs,
        // `after-commit`). An asynchronous commit was measured to gain nothing once fetching
        // no longer paused (BENCHMARKS.md), and a crash right after it re-polled the batch.
        self.consumer.commit(&tpl, CommitMode::Sync)
    }

    fn delivery(&self, p: Polled, started_at: Instant) -> Delivery {
        let original = headers::original(&p.headers).map(Box::new);
        self.settler
            .events
            .emit(|| Event::new(EventKind::Delivered, p.source.clone(), p.attempt));
        Delivery {
            timestamp_ms: p.timestamp_ms,
            body: p.body,
            headers: p.headers,
            source: p.source,
            attempt: p.attempt,
            original,
            timeout: p.timeout,
            expires: started_at.checked_add(p.timeout),
            settler: self.settler.clone(),
            retry: self.retry.clone(),
            settled: false,
            keep_alive: None,
        }
    }
}

/// Whether `m` lies in a partition range that was rewound after this batch was polled.
fn start_v1(p: &Polled) -> Marker {
    Marker::Start {
        source: p.source.clone(),
        timeout_ms: duration_to_ms_u32(p.timeout),
        attempt: p.attempt,
    }
}

/// Version 2 Starts for a poll batch: one per source partition (split at
/// [`MAX_BATCH_RECORDS`]), each with the positions in `batch` of the records it covers. The
/// default timeout is the consumer's; records with their own timeout or attempt are listed.
fn start_batches(batch: &[Polled], default: Duration) -> Vec<(Vec<usize>, Marker)> {
    let timeout_ms = duration_to_ms_u32(default);
    let mut groups: Vec<(Vec<usize>, StartBatch)> = Vec::new();
    for (i, p) in batch.iter().enumerate() {
        let s = &p.source;
        // A partition's records come in offset order; one that does not (a seek back between
        // polls) goes into a marker of its own.
        let open = groups.iter().rposition(|(records, b)| {
            b.partition == s.partition
                && *b.topic == *s.topic
                && records.len() < MAX_BATCH_RECORDS
                && b.offsets.last().is_some_and(|last| last < s.offset)
        });
        let g = open.unwrap_or_else(|| {
            groups.push((
                Vec::new(),
                StartBatch {
                    topic: s.topic.to_string(),
                    partition: s.partition,
                    timeout_ms,
                    offsets: Offsets::new(),
                    attempts: Vec::new(),
                    timeouts: Vec::new(),
                },
            ));
            groups.len() - 1
        });
        let (records, b) = &mut groups[g];
        b.offsets.push(s.offset);
        if p.attempt != 1 {
            b.attempts.push((s.offset, p.attempt));
        }
        let own = duration_to_ms_u32(p.timeout);
        if own != timeout_ms {
            b.timeouts.push((s.offset, own));
        }
        records.push(i);
    }
    groups
        .into_iter()
        .map(|(records, b)| (records, Marker::StartBatch(Box::new(b))))
        .collect()
}

/// What [`without_revoked`] took out of a batch.
struct Released {
    /// How many records.
    records: usize,
    /// Those whose Starts are durable, with their timeouts: the tracker would redeliver them.
    started: Vec<(SourceRef, Duration)>,
}

/// Takes out of `batch` (with its per-record `durable` flags) the records of partitions
/// revoked while it was in flight; returns what is left and what was taken out. Nothing
/// of those is committed or handed out: the partition's next owner reads them again, and its
/// Starts take over the ones written here (the tracker keeps one delivery per record, and a
/// second Start refreshes it). No End is written for them: an End names only the record, so
/// one arriving after the next owner's Start would end that owner's delivery, and a crash of
/// that owner would then lose the record. Those started are kept alive until the group settles
/// instead (`lease.rs`).
fn without_revoked(
    batch: Vec<Polled>,
    durable: Vec<bool>,
    revoked: &[(String, i32)],
) -> (Vec<Polled>, Vec<bool>, Released) {
    let mut released = Released {
        records: 0,
        started: Vec::new(),
    };
    if revoked.is_empty() {
        return (batch, durable, released);
    }
    let mut kept = Vec::with_capacity(batch.len());
    let mut kept_durable = Vec::with_capacity(batch.len());
    for (p, ok) in batch.into_iter().zip(durable) {
        if !in_partitions(revoked, &p.source) {
            kept.push(p);
            kept_durable.push(ok);
            continue;
        }
        released.records += 1;
        if ok {
            released.started.push((p.source, p.timeout));
        }
    }
    (kept, kept_durable, released)
}

/// Whether a failed commit means the group has moved on without this member's generation
/// (a rebalance under way, or the member fenced or forgotten), so that its partitions may be
/// handed to another worker, rather than that the coordinator could not be reached.
fn moved_by_rebalance(e: &KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as C;
    matches!(
        e.rdkafka_error_code(),
        Some(
            C::IllegalGeneration
                | C::UnknownMemberId
                | C::RebalanceInProgress
                | C::FencedInstanceId
                | C::StaleMemberEpoch
                | C::FencedMemberEpoch
                | C::AssignmentLost
        )
    )
}

/// The first (lowest) offset of each source partition in `batch`.
fn first_offsets(batch: &[Polled]) -> BTreeMap<(String, i32), i64> {
    let mut firsts = BTreeMap::new();
    for p in batch {
        let e = firsts
            .entry((p.source.topic.to_string(), p.source.partition))
            .or_insert(p.source.offset);
        *e = (*e).min(p.source.offset);
    }
    firsts
}

/// Whether `s` lies in one of `partitions`.
fn in_partitions(partitions: &[(String, i32)], s: &SourceRef) -> bool {
    partitions
        .iter()
        .any(|(t, p)| *p == s.partition && **t == *s.topic)
}

fn is_rewound(rewound: &[(String, i32, i64)], s: &SourceRef) -> bool {
    rewound
        .iter()
        .any(|(t, p, o)| **t == *s.topic && *p == s.partition && s.offset >= *o)
}

/// Splits a batch into the records that may be handed over (in each source partition, those
/// before the first failed Start) and, per partition, the offset of that first failure.
fn split_at_first_failure(
    batch: Vec<Polled>,
    durable: Vec<bool>,
) -> (Vec<Polled>, Vec<(String, i32, i64)>) {
    // Every Start durable is the rule: then no key (a copy of the topic name) is built.
    if durable.iter().all(|&ok| ok) {
        return (batch, Vec::new());
    }
    let mut first_failure: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (p, ok) in batch.iter().zip(&durable) {
        if !ok {
            let key = (p.source.topic.to_string(), p.source.partition);
            let e = first_failure.entry(key).or_insert(i64::MAX);
            *e = (*e).min(p.source.offset);
        }
    }
    let handed = batch
        .into_iter()
        .filter(|p| {
            first_failure
                .get(&(p.source.topic.to_string(), p.source.partition))
                .is_none_or(|&f| p.source.offset < f)
        })
        .collect();
    let failed = first_failure
        .into_iter()
        .map(|((t, p), o)| (t, p, o))
        .collect();
    (handed, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn polled(topic: &str, partition: i32, offset: i64) -> Polled {
        Polled {
            source: SourceRef::new(topic, partition, offset),
            timestamp_ms: None,
            body: Body::new(None, None),
            headers: Vec::new(),
            attempt: 1,
            timeout: Duration::from_secs(1),
        }
    }

    fn coords(batch: &[Polled]) -> Vec<(String, i32, i64)> {
        batch
            .iter()
            .map(|p| {
                (
                    p.source.topic.to_string(),
                    p.source.partition,
                    p.source.offset,
                )
            })
            .collect()
    }

    #[test]
    fn a_poll_batch_gives_one_start_per_source_partition_with_its_exceptions() {
        let mut batch = vec![
            polled("a", 0, 10),
            polled("a", 1, 5),
            polled("a", 0, 11),
            polled("a", 0, 13),
            polled("a", 0, 3), // a seek back between polls: a marker of its own
        ];
        batch[2].attempt = 3;
        batch[3].timeout = Duration::from_secs(9);
        let starts = start_batches(&batch, Duration::from_secs(1));
        let got: Vec<_> = starts
            .iter()
            .map(|(records, m)| match m {
                Marker::StartBatch(b) => (
                    records.clone(),
                    b.partition,
                    b.offsets.iter().collect::<Vec<_>>(),
                    b.attempts.clone(),
                    b.timeouts.clone(),
                    b.timeout_ms,
                ),
                other => panic!("not a batch Start: {other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    vec![0, 2, 3],
                    0,
                    vec![10, 11, 13],
                    vec![(11, 3)],
                    vec![(13, 9000)],
                    1000
                ),
                (vec![1], 1, vec![5], vec![], vec![], 1000),
                (vec![4], 0, vec![3], vec![], vec![], 1000),
            ]
        );
    }

    #[test]
    fn a_rewind_covers_its_partition_from_its_offset_on() {
        let rewound = vec![("a".to_string(), 0, 11)];
        let covered: Vec<_> = [
            ("a", 0, 10),
            ("a", 0, 11),
            ("a", 0, 12),
            ("a", 1, 11),
            ("b", 0, 11),
        ]
        .iter()
        .map(|&(t, p, o)| is_rewound(&rewound, &polled(t, p, o).source))
        .collect();
        assert_eq!(covered, vec![false, true, true, false, false]);
    }

    #[test]
    fn a_failed_start_holds_back_its_partition_from_that_record_on() {
        let batch = vec![
            polled("a", 0, 10),
            polled("a", 0, 11),
            polled("a", 1, 5),
            polled("a", 0, 12),
            polled("b", 0, 1),
            polled("a", 1, 6),
        ];
        let durable = vec![true, false, true, true, true, false];
        failpoint::hit("after-start-durable");
        let (handed, failed) = split_at_first_failure(batch, durable);
        // a/0: 11 failed, so 12 waits even though its own Start was durable.
        assert_eq!(
            coords(&handed),
            vec![("a".into(), 0, 10), ("a".into(), 1, 5), ("b".into(), 0, 1)]
        );
        assert_eq!(failed, vec![("a".into(), 0, 11), ("a".into(), 1, 6)]);
    }

    #[test]
    fn records_of_a_revoked_partition_are_taken_out_of_a_batch_in_flight() {
        let batch = vec![polled("a", 0, 1), polled("a", 1, 1), polled("b", 0, 2)];
        let revoked = vec![("a".to_string(), 0), ("c".to_string(), 3)];
        let (kept, durable, released) = without_revoked(batch, vec![true, false, true], &revoked);
        assert_eq!(coords(&kept), [("a".into(), 1, 1), ("b".into(), 0, 2)]);
        assert_eq!(durable, [false, true], "each record keeps its own flag");
        assert_eq!(released.records, 1);
        let started: Vec<i64> = released.started.iter().map(|(s, _)| s.offset).collect();
        assert_eq!(started, [1], "a durable Start is kept alive");
        let (kept, _, released) = without_revoked(kept, durable, &[]);
        assert_eq!((kept.len(), released.records), (2, 0));
    }

    #[test]
    fn records_of_one_topic_share_its_name() {
        let topics = Topics::default();
        let (a, b, other) = (
            topics.get("orders"),
            topics.get("orders"),
            topics.get("audit"),
        );
        assert!(
            Arc::ptr_eq(&a, &b),
            "one allocation per topic, not per record"
        );
        assert_eq!((&*a, &*other), ("orders", "audit"));
        assert!(Arc::ptr_eq(&other, &topics.get("audit")));
    }

    #[test]
    fn all_durable_hands_over_everything() {
        let batch = vec![polled("a", 0, 1), polled("a", 0, 2)];
        let (handed, failed) = split_at_first_failure(batch, vec![true, true]);
        assert_eq!(handed.len(), 2);
        assert!(failed.is_empty());
    }
}
