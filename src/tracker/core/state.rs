//! The in-memory state of one markers partition: a plain struct with no I/O and no clock.
//!
//! The tracker feeds it markers in offset order with [`PartitionState::on_marker`], asks it which
//! deliveries are past their deadline with [`PartitionState::expired`], and how long to sleep with
//! [`PartitionState::next_deadline`]. Time is always passed in (milliseconds of partition time,
//! see the tracker's `clock` module), so tests drive it without Kafka and without sleeping.
//!
//! Memory is the thing to watch here: a tracker may hold millions of deliveries. Each one lives
//! in a 32-byte slot of a slab (its key with the topic interned to a number, its deadline, and
//! its Start offset, attempt and phase packed into one `u64`). A hash table of 4-byte slot
//! numbers finds a slot by key, and the deadline heap holds (deadline, slot number) pairs of 16
//! bytes. Payloads are never held. BENCHMARKS.md has the measured bytes per delivery.
//!
//! Records started together by one version 2 batch Start cost far less: they share a *group*
//! (`groups.rs`, one bit per record and one heap entry per group) until one of them is treated
//! apart, which promotes it to a slot of its own.
//!
//! Keys are hashed with the Fx hash: they come from our own markers topic, not from an adversary
//! choosing collisions, and it is several times cheaper than SipHash on a 16-byte key.

use std::collections::BinaryHeap;
use std::hash::BuildHasher;

use hashbrown::HashTable;
use rustc_hash::{FxBuildHasher, FxHashMap as HashMap};

use crate::marker::{Marker, SourceRef};

use crate::tracker::core::interner::Interner;
use deadlines::Deadlines;
use groups::{Groups, Member};

/// Heap entries naming a group rather than a slot carry this bit (slot numbers stay below it:
/// 2^31 slots would not fit in memory).
const GROUP_TAG: u32 = 1 << 31;

/// A delivery's identity inside one partition state: its source coordinates with the topic
/// replaced by an interned number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Key {
    topic: u32,
    partition: i32,
    offset: i64,
}

/// Where a delivery is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Handed to a consumer; expires at the deadline unless kept alive or settled.
    Waiting = 0,
    /// The consumer gave it back; "expires" when the nack delay is over.
    Nacked = 1,
    /// The consumer refused it; due at once for the dead-letter topic.
    Rejected = 2,
    /// Handed to the redelivery worker; stays here (holding back the commit) until the End the
    /// worker writes comes back, but never expires again.
    Dispatched = 3,
    /// The slot holds no delivery and is on the free list.
    Free = 4,
    /// A Schedule marker waiting for its due time; its key is the marker's own coordinates.
    Scheduled = 5,
}

/// Start offset (48 bits), attempt (13 bits) and phase (3 bits) in one word. 2^48 markers is
/// nine years at a million markers a second; a larger offset is stored as the largest one, which
/// only makes commits more cautious. Attempts saturate at 8191.
#[derive(Debug, Clone, Copy)]
struct Meta(u64);

const OFFSET_BITS: u32 = 48;
const ATTEMPT_BITS: u32 = 13;
const MAX_OFFSET: i64 = (1 << OFFSET_BITS) - 1;
const MAX_ATTEMPT: u32 = (1 << ATTEMPT_BITS) - 1;
// The public bound (headers, `--max-deliveries`) is what these bits can hold.
const _: () = assert!(MAX_ATTEMPT == crate::headers::checked::MAX_ATTEMPT);

impl Meta {
    fn new(start_offset: i64, attempt: u32, phase: Phase) -> Self {
        let offset = start_offset.clamp(0, MAX_OFFSET) as u64;
        let attempt = u64::from(attempt.min(MAX_ATTEMPT));
        Meta(offset | attempt << OFFSET_BITS | (phase as u64) << (OFFSET_BITS + ATTEMPT_BITS))
    }

    fn start_offset(self) -> i64 {
        (self.0 & MAX_OFFSET as u64) as i64
    }

    fn attempt(self) -> u32 {
        ((self.0 >> OFFSET_BITS) & u64::from(MAX_ATTEMPT)) as u32
    }

    fn phase(self) -> Phase {
        match self.0 >> (OFFSET_BITS + ATTEMPT_BITS) {
            0 => Phase::Waiting,
            1 => Phase::Nacked,
            2 => Phase::Rejected,
            3 => Phase::Dispatched,
            5 => Phase::Scheduled,
            _ => Phase::Free,
        }
    }

    fn with(self, attempt: u32, phase: Phase) -> Self {
        Meta::new(self.start_offset(), attempt, phase)
    }
}

/// One tracked delivery.
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: Key,
    deadline_ms: i64,
    /// The Start offset in `meta` is the offset of the Start marker that began this delivery.
    /// The committed markers offset never passes the smallest of these, so a restart replays
    /// every Start still in progress.
    meta: Meta,
}

impl Slot {
    fn is_due_at(&self, deadline: i64) -> bool {
        self.deadline_ms == deadline
            && !matches!(self.meta.phase(), Phase::Dispatched | Phase::Free)
    }
}

/// Why a delivery is due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// Its deadline passed with no End.
    Timeout,
    /// The consumer nacked it and the delay is over.
    Nacked,
    /// The consumer rejected it, with this reason.
    Rejected(String),
    /// A Schedule marker fell due; `source` is the marker's own coordinates.
    Scheduled,
}

/// A delivery whose deadline has passed: the tracker must act on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Expiry {
    /// The record to redeliver or dead-letter.
    pub source: SourceRef,
    /// The delivery attempt that just ended (1 for the first delivery).
    pub attempt: u32,
    /// Why it is due.
    pub cause: Cause,
    /// When it was due, in partition time (ms); used to measure how late the tracker acts.
    pub deadline_ms: i64,
    /// It was due before this tracker caught up with its partition, so a previous owner may
    /// already have acted on it before crashing. Set by the owner, not by this state.
    pub due_before_takeover: bool,
}

/// What a marker did to the state. The tracker counts each outcome and logs the odd ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    /// A new delivery is tracked.
    Started,
    /// A Start for a delivery already tracked (a consumer re-polled its batch): deadline
    /// refreshed, nothing else changes.
    Restarted,
    /// Deadline pushed out.
    KeptAlive,
    /// Delivery settled and forgotten.
    Ended,
    /// Delivery due for redelivery after its delay.
    Nacked,
    /// Delivery due for the dead-letter topic.
    Rejected,
    /// A Schedule marker is tracked until its due time.
    Scheduled,
    /// An End for a schedule not yet due: cancelled, it will never be delivered.
    Cancelled,
    /// A clock probe with this nonce.
    Tick(u64),
    /// A version 2 marker: [`PartitionState::on_batch`] reports each record's outcome.
    Batch,
    /// The marker made no sense here and was skipped.
    Odd(Oddity),
}

/// A marker that was skipped because it contradicts the state. None of these can lose a
/// message: each leaves a delivery either tracked (so it is redelivered) or settled by a marker
/// that said so.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Oddity {
    /// KeepAlive, Nack or Reject for a delivery not in flight (already ended, or its Start
    /// was before the committed offset and ended).
    SettleWithoutStart,
    /// End for a delivery not in flight: an ack after the tracker already redelivered it, or a
    /// duplicate End.
    EndWithoutStart,
    /// A marker for a delivery the tracker is already redelivering; the redelivery goes on.
    LateForRedelivery,
}

impl Oddity {
    /// Every oddity.
    pub const ALL: [Oddity; 3] = [
        Oddity::SettleWithoutStart,
        Oddity::EndWithoutStart,
        Oddity::LateForRedelivery,
    ];

    /// Short stable name for metric labels.
    pub fn name(self) -> &'static str {
        match self {
            Oddity::SettleWithoutStart => "settle_without_start",
            Oddity::EndWithoutStart => "end_without_start",
            Oddity::LateForRedelivery => "late_for_redelivery",
        }
    }
}

/// A summary for commits and metrics, computed in one pass over the state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    /// The markers offset it is safe to commit.
    pub commit_offset: i64,
    /// Deliveries in flight, including those being redelivered; pending schedules are counted
    /// in `scheduled` instead (a schedule handed to the redelivery worker counts here).
    pub in_flight: usize,
    /// Age in ms of the oldest delivery in flight (0 when none), to within a second. Pending
    /// schedules do not count: waiting is what they are for.
    pub oldest_age_ms: i64,
    /// The oldest delivery in flight: the one holding the commit back.
    pub oldest: Option<SourceRef>,
    /// Schedules waiting for their due time (not yet handed to the redelivery worker).
    pub scheduled: usize,
}

/// Deliveries in progress for one markers partition.
#[derive(Debug, Default)]
pub struct PartitionState {
    /// The markers topic and partition this state belongs to: the coordinates of its Schedule
    /// markers.
    home: (String, i32),
    topics: Interner,
    slots: Vec<Slot>,
    free: Vec<u32>,
    /// Slot numbers, found by the hash of their slot's key.
    index: HashTable<u32>,
    /// Min-heap of (deadline, slot), in two parts for reading ahead (`deadlines.rs`). Entries
    /// go stale when a delivery is kept alive or settled; they are skipped when popped and
    /// swept when they outnumber live ones.
    deadlines: Deadlines,
    /// Reasons of rejected deliveries, only until they are dispatched.
    reject_reasons: HashMap<Key, String>,
    /// When in-flight items started, to tell the age of the oldest delivery without storing
    /// a start time per delivery; bounded in size.
    time_index: TimeIndex,
    /// Records of batch Starts that are still treated alike (see `groups.rs`).
    groups: Groups,
}

fn hash(key: &Key) -> u64 {
    FxBuildHasher.hash_one(key)
}

impl PartitionState {
    /// An empty state. Schedule markers get the coordinates (``, 0); see [`Self::at`].
    #[cfg(any(test, feature = "fuzzing"))]
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty state for markers partition `partition` of `markers_topic`, which is where its
    /// Schedule markers live and so what their message ids name.
    pub fn at(markers_topic: &str, partition: i32) -> Self {
        PartitionState {
            home: (markers_topic.to_string(), partition),
            ..Self::default()
        }
    }

    /// Applies one marker read at `offset` with broker timestamp `timestamp_ms`.
    pub fn on_marker(&mut self, offset: i64, timestamp_ms: i64, marker: &Marker) -> Applied {
        match marker {
            Marker::Start {
                source,
                timeout_ms,
                attempt,
            } => {
                let deadline = timestamp_ms.saturating_add(i64::from(*timeout_ms));
                let key = self.intern(source);
                self.start(offset, timestamp_ms, key, deadline, *attempt)
            }
            Marker::KeepAlive { source, timeout_ms } => {
                let key = self.key(source);
                self.keep_alive(key, timestamp_ms, *timeout_ms)
            }
            Marker::Nack { source, delay_ms } => {
                let key = self.key(source);
                self.nack(key, timestamp_ms, *delay_ms)
            }
            Marker::Reject { source, reason } => {
                let key = self.key(source);
                self.reject(key, timestamp_ms, reason)
            }
            Marker::End { source } => {
                let key = self.key(source);
                self.end(key)
            }
            Marker::Schedule {
                not_before_ms,
                delay_ms,
                ..
            } => {
                let delay = i64::try_from(*delay_ms).unwrap_or(i64::MAX);
                let due = timestamp_ms.saturating_add(delay).max(*not_before_ms);
                self.schedule(offset, timestamp_ms, due)
            }
            Marker::StartBatch(_) | Marker::Settle(_) => {
                self.on_batch(offset, timestamp_ms, marker, |_, _| {});
                Applied::Batch
            }
            Marker::Tick { nonce } => Applied::Tick(*nonce),
        }
    }

    /// Applies a version 2 marker read at `offset` with timestamp `timestamp_ms`: exactly what
    /// the version 1 markers it stands for would do, in the order `docs/markers.md` gives.
    /// `each` gets every record's outcome with its source offset. Anything else is ignored.
    pub fn on_batch(
        &mut self,
        offset: i64,
        timestamp_ms: i64,
        marker: &Marker,
        mut each: impl FnMut(Applied, i64),
    ) {
        match marker {
            Marker::StartBatch(b) => self.start_batch(offset, timestamp_ms, b, &mut each),
            Marker::Settle(s) => {
                let topic = self.topics.get(&s.topic);
                let key = |offset| {
                    topic.map(|topic| Key {
                        topic,
                        partition: s.partition,
                        offset,
                    })
                };
                for &(o, timeout_ms) in &s.keep_alives {
                    each(self.keep_alive(key(o), timestamp_ms, timeout_ms), o);
                }
                for &(o, delay_ms) in &s.nacks {
                    each(self.nack(key(o), timestamp_ms, delay_ms), o);
                }
                for (o, reason) in &s.rejects {
                    each(self.reject(key(*o), timestamp_ms, reason), *o);
                }
                for o in s.ends.iter() {
                    each(self.end(key(o)), o);
                }
            }
            _ => {}
        }
    }

    /// A batch Start: the records that are new and have the batch's own timeout and attempt 1
    /// share a group; the others (started again, copies, their own timeout) go one by one.
    fn start_batch(
        &mut self,
        offset: i64,
        ts: i64,
        b: &crate::marker::StartBatch,
        each: &mut impl FnMut(Applied, i64),
    ) {
        let topic = self.topics.intern(&b.topic);
        let key = |offset| Key {
            topic,
            partition: b.partition,
            offset,
        };
        let deadline = ts.saturating_add(i64::from(b.timeout_ms));
        let mut alike = Vec::with_capacity(b.offsets.len());
        for (source_offset, timeout_ms, attempt) in b.records() {
            let k = key(source_offset);
            if timeout_ms == b.timeout_ms && attempt == 1 && !self.tracked(&k) {
                alike.push(source_offset);
            } else {
                let deadline = ts.saturating_add(i64::from(timeout_ms));
                each(self.start(offset, ts, k, deadline, attempt), source_offset);
            }
        }
        match self
            .groups
            .insert(topic, b.partition, &alike, offset, deadline)
        {
            Some(group) => {
                self.push_deadline(deadline, GROUP_TAG | group);
                self.sample_time(offset, ts);
                for o in alike {
                    each(Applied::Started, o);
                }
            }
            None => {
                for o in alike {
                    each(self.start(offset, ts, key(o), deadline, 1), o);
                }
            }
        }
    }

    /// Whether `key` is in flight, in a slot or a group.
    fn tracked(&self, key: &Key) -> bool {
        self.find(key).is_some() || self.member(key).is_some()
    }

    fn member(&self, key: &Key) -> Option<Member> {
        self.groups.find(key.topic, key.partition, key.offset)
    }

    /// The slot of `key`, taking it out of its group first if it is in one: a record treated
    /// apart from its batch goes on as a delivery of its own, with the group's Start offset,
    /// deadline and attempt, dispatched if the group's was.
    ///
    /// A promoted waiting record gets no heap entry here: both callers (`start`, `reschedule`)
    /// give it a new deadline at once, or leave it alone only when it is dispatched, which
    /// needs none. An entry here would only go stale.
    fn find_promoting(&mut self, key: &Key) -> Option<u32> {
        if let Some(i) = self.find(key) {
            return Some(i);
        }
        let m = self.member(key)?;
        let dispatched = self.groups.is_dispatched(m);
        let g = self.groups.get(m.group)?;
        let phase = if dispatched {
            Phase::Dispatched
        } else {
            Phase::Waiting
        };
        let slot = Slot {
            key: *key,
            deadline_ms: g.deadline_ms,
            meta: Meta::new(g.start_offset, 1, phase),
        };
        self.groups.take(m);
        Some(self.insert(slot))
    }

    /// Whether the heap entry (deadline, `i`) still stands for something due then.
    fn is_live_entry(&self, deadline: i64, i: u32) -> bool {
        if i & GROUP_TAG != 0 {
            self.groups.is_due_at(i & !GROUP_TAG, deadline)
        } else {
            self.slots[i as usize].is_due_at(deadline)
        }
    }

    fn keep_alive(&mut self, key: Option<Key>, ts: i64, timeout_ms: u32) -> Applied {
        let deadline = ts.saturating_add(i64::from(timeout_ms));
        self.reschedule(key, deadline, Phase::Waiting, Applied::KeptAlive)
    }

    fn nack(&mut self, key: Option<Key>, ts: i64, delay_ms: u64) -> Applied {
        let due = ts.saturating_add(i64::try_from(delay_ms).unwrap_or(i64::MAX));
        self.reschedule(key, due, Phase::Nacked, Applied::Nacked)
    }

    fn reject(&mut self, key: Option<Key>, ts: i64, reason: &str) -> Applied {
        let applied = self.reschedule(key, ts, Phase::Rejected, Applied::Rejected);
        if let (Applied::Rejected, Some(key)) = (applied, key) {
            self.reject_reasons.insert(key, reason.to_string());
        }
        applied
    }

    fn start(&mut self, offset: i64, ts: i64, key: Key, deadline: i64, attempt: u32) -> Applied {
        if let Some(i) = self.find_promoting(&key) {
            let slot = &mut self.slots[i as usize];
            match slot.meta.phase() {
                Phase::Dispatched => return Applied::Odd(Oddity::LateForRedelivery),
                // A Start naming a pending schedule's coordinates: nobody consumed it.
                Phase::Scheduled => return Applied::Odd(Oddity::SettleWithoutStart),
                _ => {}
            }
            // A re-polled batch: keep the earliest Start offset so the commit stays behind it.
            slot.deadline_ms = deadline;
            slot.meta = slot
                .meta
                .with(slot.meta.attempt().max(attempt), Phase::Waiting);
            self.reject_reasons.remove(&key);
            self.push_deadline(deadline, i);
            return Applied::Restarted;
        }
        let slot = Slot {
            key,
            deadline_ms: deadline,
            meta: Meta::new(offset, attempt, Phase::Waiting),
        };
        let i = self.insert(slot);
        self.push_deadline(deadline, i);
        self.sample_time(offset, ts);
        Applied::Started
    }

    /// The coordinates of the marker at `offset` of this state's own markers partition: a
    /// schedule's id.
    pub fn home_ref(&self, offset: i64) -> SourceRef {
        SourceRef::new(self.home.0.clone(), self.home.1, offset)
    }

    /// Tracks the Schedule marker at `offset` until `due`. Its key is the marker's own place,
    /// so the commit offset stays behind it like behind a Start, and an End for it cancels it.
    fn schedule(&mut self, offset: i64, ts: i64, due: i64) -> Applied {
        let home = self.home_ref(offset);
        let key = self.intern(&home);
        if self.tracked(&key) {
            // One marker offset is read once per assignment; nothing to do if it repeats.
            return Applied::Scheduled;
        }
        let i = self.insert(Slot {
            key,
            deadline_ms: due,
            meta: Meta::new(offset, 0, Phase::Scheduled),
        });
        self.push_deadline(due, i);
        self.sample_time(offset, ts);
        Applied::Scheduled
    }

    fn sample_time(&mut self, offset: i64, ts: i64) {
        self.time_index.sample(offset, ts);
    }

    fn reschedule(&mut self, key: Option<Key>, due: i64, phase: Phase, ok: Applied) -> Applied {
        let Some(i) = key.and_then(|k| self.find_promoting(&k)) else {
            return Applied::Odd(Oddity::SettleWithoutStart);
        };
        let slot = &mut self.slots[i as usize];
        let current = slot.meta.phase();
        if current == Phase::Dispatched {
            return Applied::Odd(Oddity::LateForRedelivery);
        }
        if current == Phase::Scheduled {
            // Nobody consumes a schedule before it is due, so nobody can settle it but an End.
            return Applied::Odd(Oddity::SettleWithoutStart);
        }
        // Once nacked or rejected, a late KeepAlive must not turn it back into a plain delivery.
        if phase == Phase::Waiting && current != Phase::Waiting {
            return Applied::KeptAlive;
        }
        slot.deadline_ms = due;
        slot.meta = slot.meta.with(slot.meta.attempt(), phase);
        self.push_deadline(due, i);
        ok
    }

    fn end(&mut self, key: Option<Key>) -> Applied {
        let Some(key) = key else {
            return Applied::Odd(Oddity::EndWithoutStart);
        };
        if let Some(m) = self.member(&key) {
            self.groups.take(m);
            return Applied::Ended;
        }
        self.reject_reasons.remove(&key);
        let was_scheduled = self
            .find(&key)
            .is_some_and(|i| self.slots[i as usize].meta.phase() == Phase::Scheduled);
        match self.remove(&key) {
            Some(_) if was_scheduled => Applied::Cancelled,
            Some(_) => Applied::Ended,
            None => Applied::Odd(Oddity::EndWithoutStart),
        }
    }

    /// Takes every delivery due at `now_ms` (at most `limit`), in deadline order, and marks it
    /// dispatched: it will not expire again, but stays in flight until its End is read.
    pub fn expired(&mut self, now_ms: i64, limit: usize) -> Vec<Expiry> {
        let mut out = Vec::new();
        while out.len() < limit {
            let Some((deadline, i)) = self.deadlines.peek() else {
                break;
            };
            if deadline > now_ms {
                break;
            }
            if i & GROUP_TAG != 0 {
                if self.expire_group(i & !GROUP_TAG, deadline, limit - out.len(), &mut out) {
                    break; // the limit was reached with records still waiting
                }
                self.deadlines.pop();
                continue;
            }
            self.deadlines.pop();
            let slot = &mut self.slots[i as usize];
            if !slot.is_due_at(deadline) {
                continue;
            }
            let (phase, attempt, key) = (slot.meta.phase(), slot.meta.attempt(), slot.key);
            slot.meta = slot.meta.with(attempt, Phase::Dispatched);
            let cause = match phase {
                Phase::Nacked => Cause::Nacked,
                Phase::Rejected => {
                    Cause::Rejected(self.reject_reasons.remove(&key).unwrap_or_default())
                }
                Phase::Scheduled => Cause::Scheduled,
                _ => Cause::Timeout,
            };
            out.push(Expiry {
                source: SourceRef::new(self.topics.name(key.topic), key.partition, key.offset),
                attempt,
                cause,
                deadline_ms: deadline,
                due_before_takeover: false,
            });
        }
        out
    }

    /// Takes back the delivery of `source`, just taken by [`Self::expired`] and not acted on,
    /// and makes it due again at `until_ms`, as a KeepAlive would: the tracker holds back a
    /// copy that the source group makes unnecessary (`core/group_hold.rs`). A new Start for
    /// the record then refreshes it and an End ends it, as for any delivery in flight.
    /// Anything not just taken is left alone; returns whether it was held. Meant for
    /// timeouts: a held nack, reject or schedule would fall due again as a timeout.
    pub fn hold(&mut self, source: &SourceRef, until_ms: i64) -> bool {
        let Some(i) = self.key(source).and_then(|k| self.find_promoting(&k)) else {
            return false;
        };
        let slot = &mut self.slots[i as usize];
        if slot.meta.phase() != Phase::Dispatched {
            return false;
        }
        slot.deadline_ms = until_ms;
        slot.meta = slot.meta.with(slot.meta.attempt(), Phase::Waiting);
        // Announced already: its record was read ahead once, and reading it again at every
        // look would only repeat that while nothing is copied.
        self.deadlines.push_announced((until_ms, i));
        true
    }

    /// Dispatches up to `limit` waiting records of group `id` due at `deadline` into `out`;
    /// true if some still wait.
    fn expire_group(
        &mut self,
        id: u32,
        deadline: i64,
        limit: usize,
        out: &mut Vec<Expiry>,
    ) -> bool {
        if !self.groups.is_due_at(id, deadline) {
            return false;
        }
        let Some(g) = self.groups.get(id) else {
            return false;
        };
        let (topic, partition) = (self.topics.name(g.topic).to_string(), g.partition);
        let (offsets, more) = self.groups.dispatch(id, limit);
        out.extend(offsets.into_iter().map(|offset| Expiry {
            source: SourceRef::new(topic.clone(), partition, offset),
            attempt: 1,
            cause: Cause::Timeout,
            deadline_ms: deadline,
            due_before_takeover: false,
        }));
        more
    }

    /// The earliest deadline still pending, in partition time (ms).
    pub fn next_deadline(&mut self) -> Option<i64> {
        while let Some((deadline, i)) = self.deadlines.peek() {
            if self.is_live_entry(deadline, i) {
                return Some(deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    /// The records of deliveries due by `until_ms` that were not listed before, soonest first,
    /// for reading ahead: at least every record of one heap entry, then whole entries while
    /// fewer than `limit` are listed. Nothing is dispatched: each stays in flight and falls due
    /// at its own deadline, through [`Self::expired`], as if never listed.
    pub fn read_ahead(&mut self, until_ms: i64, limit: usize) -> Vec<SourceRef> {
        let mut out = Vec::new();
        while out.len() < limit {
            let Some((deadline, i)) = self.deadlines.peek_unannounced() else {
                break;
            };
            if deadline > until_ms {
                break;
            }
            if !self.is_live_entry(deadline, i) {
                self.deadlines.drop_unannounced();
                continue;
            }
            self.deadlines.announce_next();
            if i & GROUP_TAG != 0 {
                let Some(g) = self.groups.get(i & !GROUP_TAG) else {
                    continue;
                };
                let topic = self.topics.name(g.topic);
                out.extend(
                    g.waiting_offsets()
                        .map(|offset| SourceRef::new(topic, g.partition, offset)),
                );
            } else {
                let key = self.slots[i as usize].key;
                out.push(SourceRef::new(
                    self.topics.name(key.topic),
                    key.partition,
                    key.offset,
                ));
            }
        }
        out
    }

    /// The earliest deadline not yet listed by [`Self::read_ahead`], in partition time (ms).
    pub fn next_to_read_ahead(&mut self) -> Option<i64> {
        while let Some((deadline, i)) = self.deadlines.peek_unannounced() {
            if self.is_live_entry(deadline, i) {
                return Some(deadline);
            }
            self.deadlines.drop_unannounced();
        }
        None
    }

    /// The `n` earliest pending deadlines, soonest first. Scans the heap: meant for an operator's
    /// view once a second, not for the hot path.
    pub fn next_deadlines(&self, n: usize) -> Vec<i64> {
        // Keep the n smallest in a small max-heap rather than collecting every deadline.
        let mut smallest: BinaryHeap<i64> = BinaryHeap::with_capacity(n + 1);
        for (d, i) in self.deadlines.iter() {
            if !self.is_live_entry(*d, *i) || smallest.iter().any(|s| s == d) {
                continue;
            }
            smallest.push(*d);
            if smallest.len() > n {
                smallest.pop();
            }
        }
        smallest.into_sorted_vec()
    }

    /// Number of deliveries in flight, including those being redelivered.
    pub fn in_flight(&self) -> usize {
        self.index.len() + self.groups.live()
    }

    /// The commit offset, size and oldest age, given the offset after the last marker read and
    /// the current partition time.
    pub fn summary(&mut self, next_offset: i64, now_ms: i64) -> Summary {
        // (Start offset, key) of the item holding the commit back.
        let mut oldest: Option<(i64, Key)> = None;
        let mut oldest_delivery: Option<i64> = None;
        let mut scheduled = 0;
        let mut consider = |start: i64, key: Key| {
            if oldest.is_none_or(|(o, _)| start < o) {
                oldest = Some((start, key));
            }
        };
        for slot in &self.slots {
            let start = slot.meta.start_offset();
            match slot.meta.phase() {
                Phase::Free => continue,
                Phase::Scheduled => scheduled += 1,
                _ => oldest_delivery = Some(oldest_delivery.map_or(start, |o| o.min(start))),
            }
            consider(start, slot.key);
        }
        for g in self.groups.iter() {
            let Some(offset) = g.first_live() else {
                continue;
            };
            let start = g.start_offset;
            oldest_delivery = Some(oldest_delivery.map_or(start, |o| o.min(start)));
            let (topic, partition) = (g.topic, g.partition);
            consider(
                start,
                Key {
                    topic,
                    partition,
                    offset,
                },
            );
        }
        let Some((min_start, key)) = oldest else {
            self.time_index.clear();
            return Summary {
                commit_offset: next_offset,
                in_flight: 0,
                oldest_age_ms: 0,
                oldest: None,
                scheduled: 0,
            };
        };
        let oldest = SourceRef::new(self.topics.name(key.topic), key.partition, key.offset);
        self.time_index.prune(min_start);
        // The age is the oldest *delivery's*: a schedule for next week is not a stuck consumer.
        let oldest_age_ms = oldest_delivery.map_or(0, |start| {
            let ts = self.time_index.stamped_by(start).unwrap_or(now_ms);
            (now_ms - ts).max(0)
        });
        Summary {
            commit_offset: min_start,
            in_flight: self.in_flight() - scheduled,
            oldest_age_ms,
            oldest: Some(oldest),
            scheduled,
        }
    }

    fn find(&self, key: &Key) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(hash(key), |&i| slots[i as usize].key == *key)
            .copied()
    }

    fn insert(&mut self, slot: Slot) -> u32 {
        let i = match self.free.pop() {
            Some(i) => {
                self.slots[i as usize] = slot;
                i
            }
            None => {
                // More than 4 billion deliveries in flight in one partition cannot fit in memory.
                let i = self.slots.len() as u32;
                self.slots.push(slot);
                i
            }
        };
        let slots = &self.slots;
        self.index
            .insert_unique(hash(&slot.key), i, |&j| hash(&slots[j as usize].key));
        i
    }

    fn remove(&mut self, key: &Key) -> Option<u32> {
        let slots = &self.slots;
        let (i, _) = self
            .index
            .find_entry(hash(key), |&i| slots[i as usize].key == *key)
            .ok()?
            .remove();
        self.slots[i as usize].meta = Meta::new(0, 0, Phase::Free);
        self.free.push(i);
        Some(i)
    }

    fn push_deadline(&mut self, deadline: i64, slot: u32) {
        self.deadlines.push((deadline, slot));
        // Stale entries pile up when deliveries are acked long before their deadline; sweep them
        // once they outnumber the live ones, which keeps the sweep amortised O(1) per push.
        // A reused slot can make an old entry look live again when the new delivery has the
        // same deadline, so the sweep also drops duplicates.
        if self.deadlines.len() > 2 * self.in_flight() + 1024 {
            let mut deadlines = std::mem::take(&mut self.deadlines);
            deadlines.sweep(|&(d, i)| self.is_live_entry(d, i));
            self.deadlines = deadlines;
        }
    }

    fn intern(&mut self, source: &SourceRef) -> Key {
        Key {
            topic: self.topics.intern(&source.topic),
            partition: source.partition,
            offset: source.offset,
        }
    }

    fn key(&self, source: &SourceRef) -> Option<Key> {
        Some(Key {
            topic: self.topics.get(&source.topic)?,
            partition: source.partition,
            offset: source.offset,
        })
    }
}

mod deadlines;
mod export;
mod groups;
mod time_index;
pub use export::{EntryKind, Exported, ExportedEntry};
use time_index::TimeIndex;

#[cfg(test)]
mod tests;
