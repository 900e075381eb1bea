//! The poll thread: the client side of the protocol.
//!
//! For each batch it polls, in this order and no other:
//! 1. queue Start markers that cover every record (version 2: one per source partition of the
//!    batch; version 1: one per record) through an idempotent producer, `acks=all`;
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
//!
//! The steps in order are here; apart from them, `starts.rs` builds a batch's Start markers,
//! `rewind.rs` makes records come again after a failed Start, and `rebalance.rs` follows the
//! group's rebalances (partitions revoked while a batch is in flight, records kept alive).

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use futures::FutureExt;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaResult;
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::{Offset, TopicPartitionList};
use tokio::sync::mpsc;

use crate::events::{Event, EventKind};
use crate::failpoint;
use crate::headers::{self, checked, HeaderList};
use crate::marker::SourceRef;
use crate::resume::ResumeChecks;

use super::body::{Body, Chunks};
use super::config::ConsumerConfig;
use super::context::PollContext;
use super::delivery::Delivery;
use super::lease::Leases;
use super::retry::RetryPolicy;
use super::settler::Settler;

mod rebalance;
mod rewind;
mod starts;

use rebalance::{in_partitions, moved_by_rebalance, without_revoked};
use rewind::{first_offsets, is_rewound, split_at_first_failure};

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
        // The body first: a record's headers follow its value in the fetched batch, so once
        // the copy has read the value, the header count librdkafka reads next is close by.
        // In that order the poll thread used about 7 % less CPU per record at 1 KiB
        // (BENCHMARKS.md, "The body copied before the headers are read").
        let body = chunks.add(message.key(), message.payload());
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
            body,
            headers,
            attempt,
            timeout,
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

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn polled(topic: &str, partition: i32, offset: i64) -> Polled {
        Polled {
            source: SourceRef::new(topic, partition, offset),
            timestamp_ms: None,
            body: Body::new(None, None),
            headers: Vec::new(),
            attempt: 1,
            timeout: Duration::from_secs(1),
        }
    }

    pub(super) fn coords(batch: &[Polled]) -> Vec<(String, i32, i64)> {
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
}
