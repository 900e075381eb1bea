//! The in-memory state of one markers partition: a plain struct with no I/O and no clock.
//!
//! The tracker feeds it markers in offset order with [`PartitionState::on_marker`], asks it which
//! deliveries are past their deadline with [`PartitionState::expired`], and how long to sleep with
//! [`PartitionState::next_deadline`]. Time is always passed in (milliseconds of partition time,
//! see [`super::clock`]), so tests drive it without Kafka and without sleeping.
//!
//! Memory is the thing to watch here: a tracker may hold millions of deliveries. An in-flight
//! delivery costs one hash map slot (a 16-byte key with the topic interned to a number, and a
//! 24-byte entry) and one 24-byte heap slot. Payloads are never held. The map uses the Fx hash:
//! keys come from our own markers topic, not from an adversary choosing collisions, and it is
//! several times cheaper than SipHash on a 16-byte key (see BENCHMARKS.md).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};

use rustc_hash::FxHashMap as HashMap;

use crate::marker::{Marker, SourceRef};

use super::interner::Interner;

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
    Waiting,
    /// The consumer gave it back; "expires" when the nack delay is over.
    Nacked,
    /// The consumer refused it; due at once for the dead-letter topic.
    Rejected,
    /// Handed to the redelivery worker; stays here (holding back the commit) until the End the
    /// worker writes comes back, but never expires again.
    Dispatched,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    deadline_ms: i64,
    /// Offset of the Start marker that began this delivery. The committed markers offset never
    /// passes the smallest of these, so a restart replays every Start still in progress.
    start_offset: i64,
    attempt: u32,
    phase: Phase,
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
    /// A clock probe with this nonce.
    Tick(u64),
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Summary {
    /// The markers offset it is safe to commit.
    pub commit_offset: i64,
    /// Deliveries in flight, including those being redelivered.
    pub in_flight: usize,
    /// Age in ms of the oldest delivery in flight (0 when none), to within a second.
    pub oldest_age_ms: i64,
}

/// Deliveries in progress for one markers partition.
#[derive(Debug, Default)]
pub struct PartitionState {
    topics: Interner,
    inflight: HashMap<Key, Entry>,
    /// Min-heap of (deadline, key). Entries go stale when a delivery is kept alive or settled;
    /// they are skipped when popped and swept when they outnumber live ones.
    deadlines: BinaryHeap<Reverse<(i64, Key)>>,
    /// Reasons of rejected deliveries, only until they are dispatched.
    reject_reasons: HashMap<Key, String>,
    /// (Start marker offset, timestamp) samples at most one per second, to tell the age of the
    /// oldest delivery without storing a start time per delivery.
    time_index: VecDeque<(i64, i64)>,
}

impl PartitionState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
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
                self.start(offset, timestamp_ms, source, deadline, *attempt)
            }
            Marker::KeepAlive { source, timeout_ms } => {
                let deadline = timestamp_ms.saturating_add(i64::from(*timeout_ms));
                self.reschedule(source, deadline, Phase::Waiting, Applied::KeptAlive)
            }
            Marker::Nack { source, delay_ms } => {
                let delay = i64::try_from(*delay_ms).unwrap_or(i64::MAX);
                let due = timestamp_ms.saturating_add(delay);
                self.reschedule(source, due, Phase::Nacked, Applied::Nacked)
            }
            Marker::Reject { source, reason } => {
                let applied =
                    self.reschedule(source, timestamp_ms, Phase::Rejected, Applied::Rejected);
                if applied == Applied::Rejected {
                    if let Some(key) = self.key(source) {
                        self.reject_reasons.insert(key, reason.clone());
                    }
                }
                applied
            }
            Marker::End { source } => self.end(source),
            Marker::Tick { nonce } => Applied::Tick(*nonce),
        }
    }

    fn start(
        &mut self,
        offset: i64,
        ts: i64,
        source: &SourceRef,
        deadline: i64,
        attempt: u32,
    ) -> Applied {
        let key = self.intern(source);
        if let Some(entry) = self.inflight.get_mut(&key) {
            if entry.phase == Phase::Dispatched {
                return Applied::Odd(Oddity::LateForRedelivery);
            }
            // A re-polled batch: keep the earliest Start offset so the commit stays behind it.
            entry.deadline_ms = deadline;
            entry.attempt = entry.attempt.max(attempt);
            entry.phase = Phase::Waiting;
            self.reject_reasons.remove(&key);
            self.push_deadline(deadline, key);
            return Applied::Restarted;
        }
        self.inflight.insert(
            key,
            Entry {
                deadline_ms: deadline,
                start_offset: offset,
                attempt,
                phase: Phase::Waiting,
            },
        );
        self.push_deadline(deadline, key);
        if self.time_index.back().is_none_or(|&(_, t)| ts >= t + 1000) {
            self.time_index.push_back((offset, ts));
        }
        Applied::Started
    }

    fn reschedule(&mut self, source: &SourceRef, due: i64, phase: Phase, ok: Applied) -> Applied {
        let Some(key) = self.key(source) else {
            return Applied::Odd(Oddity::SettleWithoutStart);
        };
        let Some(entry) = self.inflight.get_mut(&key) else {
            return Applied::Odd(Oddity::SettleWithoutStart);
        };
        if entry.phase == Phase::Dispatched {
            return Applied::Odd(Oddity::LateForRedelivery);
        }
        // Once nacked or rejected, a late KeepAlive must not turn it back into a plain delivery.
        if phase == Phase::Waiting && entry.phase != Phase::Waiting {
            return Applied::KeptAlive;
        }
        entry.deadline_ms = due;
        entry.phase = phase;
        self.push_deadline(due, key);
        ok
    }

    fn end(&mut self, source: &SourceRef) -> Applied {
        let removed = self.key(source).and_then(|key| {
            self.reject_reasons.remove(&key);
            self.inflight.remove(&key)
        });
        match removed {
            Some(_) => Applied::Ended,
            None => Applied::Odd(Oddity::EndWithoutStart),
        }
    }

    /// Takes every delivery due at `now_ms` (at most `limit`), in deadline order, and marks it
    /// dispatched: it will not expire again, but stays in flight until its End is read.
    pub fn expired(&mut self, now_ms: i64, limit: usize) -> Vec<Expiry> {
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(&Reverse((deadline, key))) = self.deadlines.peek() else {
                break;
            };
            if deadline > now_ms {
                break;
            }
            self.deadlines.pop();
            let Some(entry) = self.live_entry(deadline, key) else {
                continue;
            };
            let (phase, attempt) = (entry.phase, entry.attempt);
            entry.phase = Phase::Dispatched;
            let cause = match phase {
                Phase::Nacked => Cause::Nacked,
                Phase::Rejected => {
                    Cause::Rejected(self.reject_reasons.remove(&key).unwrap_or_default())
                }
                _ => Cause::Timeout,
            };
            out.push(Expiry {
                source: SourceRef::new(self.topics.name(key.topic), key.partition, key.offset),
                attempt,
                cause,
                deadline_ms: deadline,
            });
        }
        out
    }

    /// The earliest deadline still pending, in partition time (ms).
    pub fn next_deadline(&mut self) -> Option<i64> {
        while let Some(&Reverse((deadline, key))) = self.deadlines.peek() {
            if self.live_entry(deadline, key).is_some() {
                return Some(deadline);
            }
            self.deadlines.pop();
        }
        None
    }

    /// Number of deliveries in flight, including those being redelivered.
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// The commit offset, size and oldest age, given the offset after the last marker read and
    /// the current partition time.
    pub fn summary(&mut self, next_offset: i64, now_ms: i64) -> Summary {
        let min_start = self.inflight.values().map(|e| e.start_offset).min();
        let Some(min_start) = min_start else {
            self.time_index.clear();
            return Summary {
                commit_offset: next_offset,
                in_flight: 0,
                oldest_age_ms: 0,
            };
        };
        // Keep the last sample at or before the oldest Start; older ones are no longer needed.
        while self.time_index.get(1).is_some_and(|&(o, _)| o <= min_start) {
            self.time_index.pop_front();
        }
        let oldest_ts = self.time_index.front().map_or(now_ms, |&(_, t)| t);
        Summary {
            commit_offset: min_start,
            in_flight: self.inflight.len(),
            oldest_age_ms: (now_ms - oldest_ts).max(0),
        }
    }

    fn live_entry(&mut self, deadline: i64, key: Key) -> Option<&mut Entry> {
        self.inflight
            .get_mut(&key)
            .filter(|e| e.deadline_ms == deadline && e.phase != Phase::Dispatched)
    }

    fn push_deadline(&mut self, deadline: i64, key: Key) {
        self.deadlines.push(Reverse((deadline, key)));
        // Stale entries pile up when deliveries are acked long before their deadline; sweep them
        // once they outnumber the live ones, which keeps the sweep amortised O(1) per push.
        if self.deadlines.len() > 2 * self.inflight.len() + 1024 {
            let inflight = &self.inflight;
            self.deadlines.retain(|Reverse((d, k))| {
                inflight
                    .get(k)
                    .is_some_and(|e| e.deadline_ms == *d && e.phase != Phase::Dispatched)
            });
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

#[cfg(test)]
mod tests;
