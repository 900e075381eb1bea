//! One owned markers partition: its state, its clock, and where it is in catch-up.
//!
//! Catch-up works like this. When a partition is assigned, the tracker writes a Tick marker with
//! a fresh random nonce to it. Everything before that Tick was written before the assignment,
//! so once the consumer reads its own Tick back, the state holds every delivery still in
//! progress and the clock holds the broker's current time. Only then does the partition become
//! ready and may redeliver. No redelivery ever happens from a half-replayed state.

use std::time::{Duration, Instant};

use crate::marker::{Marker, SourceRef};
use crate::resume::ResumeCheck;
use crate::tracker::metrics::intake::{
    BatchedRecords, ClockMoved, ClockOutlier, MarkerRead, OddMarker, ScheduleTracked,
};
use crate::tracker::metrics::progress::Cancelled;

use crate::tracker::core::clock::{PartitionClock, Reading};
use crate::tracker::core::group_hold::Holds;
use crate::tracker::core::state::{Applied, Expiry, PartitionState};
use crate::tracker::metrics::Metrics;
use crate::tracker::snapshot::store::{InFlight, Pointer};

/// How long to wait for a Tick to come back before writing another one.
pub const TICK_RETRY: Duration = Duration::from_secs(5);

/// How far past the newest marker read a deadline may lie and still fall due without more
/// proof that the partition was read through (see [`OwnedPartition::take_due`]). A busy
/// partition's markers come every few milliseconds, so they stay within it; a quiet one has a
/// Tick written when something falls due.
pub const READ_THROUGH_SLACK_MS: i64 = 100;

/// How long to wait for a read-through Tick to come back before writing another one.
pub const PROOF_RETRY: Duration = Duration::from_secs(1);

/// Redeliveries held this long for want of a read-through are reported (`redeliveries_held`).
pub const HELD_REPORT_AFTER: Duration = Duration::from_secs(5);

/// Whether a ready partition needs a Tick to show it was read through to a deadline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Proof {
    /// Nothing is due beyond what was read through.
    NotNeeded,
    /// Something is due beyond it since this instant; no Tick written yet.
    Wanted { since: Instant },
    /// Something is due beyond it since `since`; a Tick was last written at `sent_at`.
    Sent { since: Instant, sent_at: Instant },
}

/// Catch-up progress of a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CatchUp {
    /// Waiting for the Tick with this nonce, written at that instant (`None`: not yet written).
    Replaying {
        /// Nonce of the Tick that ends replay.
        nonce: u64,
        /// When the Tick was last written.
        sent_at: Option<Instant>,
    },
    /// The Tick came back: the state is complete.
    Ready,
}

/// Where a newly assigned partition stands in restoring its snapshot (see `restorer`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Restore {
    /// Restored, or nothing to restore: markers are applied.
    Done,
    /// The restore thread was asked; the partition is paused until it answers.
    Asked,
    /// The last try failed; still paused, asked again at this instant.
    RetryAt(Instant),
}

/// A markers partition owned by this tracker.
#[derive(Debug)]
pub struct OwnedPartition {
    /// Markers partition number.
    pub id: i32,
    /// Deliveries in progress.
    pub state: PartitionState,
    /// Partition time.
    pub clock: PartitionClock,
    /// Offset after the last marker read; what to commit when nothing is in flight.
    pub next_offset: Option<i64>,
    /// Catch-up progress.
    pub catch_up: CatchUp,
    /// The offset last committed, to skip commits that would change nothing.
    pub committed: Option<i64>,
    /// Deliveries handed to the redelivery worker since this partition was assigned.
    pub redeliveries: u64,
    /// Deliveries held back for the source group (`core/group_hold.rs`), with since when.
    pub holds: Holds,
    /// The generation of this grant of the partition (see `fence`); its jobs carry it.
    pub generation: u64,
    /// Broker time of the Tick that ended catch-up. Anything due before it may have been
    /// acted on by the previous owner.
    pub ready_at_ms: Option<i64>,
    /// Where its snapshots stand: the latest, the committed one, one being written.
    pub snapshots: SnapshotProgress,
    /// Where restoring its snapshot stands; paused until `Done`.
    pub restore: Restore,
    /// The broker timestamp of the last record read, as it came, and when it was read: the
    /// catch-up Tick sets the clock to it.
    last_read: Option<(i64, Instant)>,
    /// The newest timestamp a marker was applied at: every marker the broker appended before
    /// it has been read (markers topics are `LogAppendTime`, and a partition is read in order).
    read_through_ms: Option<i64>,
    /// Whether a read-through Tick is needed (see [`Self::take_due`]).
    pub proof: Proof,
    /// Whether the first marker read since assignment was checked for a broker timestamp.
    pub stamp_checked: bool,
    /// Where it resumed, until its first marker is checked ([`crate::resume`]).
    pub resume: Option<ResumeCheck>,
}

/// Where a partition's snapshots stand (see ARCHITECTURE.md, "Bounded replay").
#[derive(Debug, Default)]
pub struct SnapshotProgress {
    /// The latest durable snapshot of this partition, named in every commit.
    pub latest: Option<Pointer>,
    /// The epoch of the snapshot named by the last commit known to have succeeded. A new
    /// snapshot is begun only when this is the latest one: its chunks reuse the keys of the
    /// epoch before, which compaction may then remove, so that epoch must no longer be the
    /// committed one (commits that keep failing would otherwise leave it named).
    pub committed_epoch: Option<u64>,
    /// A snapshot being written.
    pub in_flight: Option<InFlight>,
    /// When the last snapshot was begun.
    pub last_begun_at: Option<Instant>,
    /// Markers before this offset are already in the restored snapshot and are skipped.
    pub skip_below: i64,
}

impl OwnedPartition {
    /// Partition `id` of `markers_topic`, just assigned, waiting for the Tick with `nonce`.
    pub fn new(markers_topic: &str, id: i32, nonce: u64) -> Self {
        OwnedPartition {
            id,
            state: PartitionState::at(markers_topic, id),
            clock: PartitionClock::default(),
            next_offset: None,
            catch_up: CatchUp::Replaying {
                nonce,
                sent_at: None,
            },
            committed: None,
            redeliveries: 0,
            holds: Holds::default(),
            generation: 0,
            ready_at_ms: None,
            snapshots: SnapshotProgress::default(),
            restore: Restore::Done,
            last_read: None,
            read_through_ms: None,
            proof: Proof::NotNeeded,
            stamp_checked: false,
            resume: Some(ResumeCheck::committed()),
        }
    }

    /// Installs the state of a restored snapshot; markers before `pointer.covers` are skipped.
    pub fn restore(&mut self, pointer: Pointer, state: PartitionState) {
        tracing::info!(
            partition = self.id,
            epoch = pointer.epoch,
            covers = pointer.covers,
            in_flight = state.in_flight(),
            "restored from a snapshot"
        );
        self.state = state;
        self.snapshots.latest = Some(pointer);
        self.snapshots.committed_epoch = Some(pointer.epoch);
        self.snapshots.skip_below = pointer.covers;
        self.restore = Restore::Done;
    }

    /// What may be committed at partition time `now_ms`, with the commit metadata: the oldest
    /// Start in flight, or the position when nothing is; never behind the snapshot the
    /// metadata names, which holds everything before the offset it covers.
    pub fn commit_point(&mut self, now_ms: i64) -> Option<(i64, Option<String>)> {
        let next = self.next_offset?;
        let oldest = self.state.summary(next, now_ms).commit_offset;
        Some(self.commit_point_from(oldest))
    }

    /// [`Self::commit_point`] from a summary's commit offset the caller already has (a
    /// summary walks every entry; the periodic commit needs it for its gauges anyway).
    pub fn commit_point_from(&self, oldest: i64) -> (i64, Option<String>) {
        match self.snapshots.latest {
            Some(s) => (oldest.max(s.covers), Some(s.to_metadata())),
            None => (oldest, None),
        }
    }

    /// Whether the latest snapshot is the one the last successful commit named (or there is
    /// none), so that a new one may reuse the keys of the one before it.
    pub fn snapshot_committed(&self) -> bool {
        self.snapshots
            .latest
            .is_none_or(|s| self.snapshots.committed_epoch == Some(s.epoch))
    }

    /// Whether replay is over.
    pub fn is_ready(&self) -> bool {
        self.catch_up == CatchUp::Ready
    }

    /// The nonce of a Tick that should be (re)written now, if any.
    pub fn tick_due(&self, now: Instant) -> Option<u64> {
        match self.catch_up {
            CatchUp::Replaying { nonce, sent_at } => sent_at
                .is_none_or(|t| now.duration_since(t) >= TICK_RETRY)
                .then_some(nonce),
            CatchUp::Ready => None,
        }
    }

    /// How long ago the Tick still awaited was last written, if nothing at all has been read
    /// from this partition since and its snapshot is restored: its fetch has delivered nothing
    /// although the Tick, at least, is there to read. A replay that reads anything, however
    /// long, is not silent.
    pub fn silent_since_tick(&self, now: Instant) -> Option<Duration> {
        let CatchUp::Replaying {
            sent_at: Some(sent),
            ..
        } = self.catch_up
        else {
            return None;
        };
        let read_since = self.last_read.is_some_and(|(_, at)| at >= sent);
        (self.restore == Restore::Done && !read_since).then(|| now.saturating_duration_since(sent))
    }

    /// Notes that the Tick was written at `now`.
    pub fn tick_sent(&mut self, now: Instant) {
        if let CatchUp::Replaying { nonce, .. } = self.catch_up {
            self.catch_up = CatchUp::Replaying {
                nonce,
                sent_at: Some(now),
            };
        }
    }

    /// Applies one decoded marker and counts what it did.
    pub fn apply(&mut self, offset: i64, timestamp_ms: i64, marker: &Marker, metrics: &Metrics) {
        metrics.emit(MarkerRead {
            kind: marker.marker_type(),
        });
        if let Some((topic, partition)) = marker
            .source_partition()
            .filter(|_| marker.source().is_none())
        {
            return self.apply_batch(offset, timestamp_ms, marker, (topic, partition), metrics);
        }
        match self.state.on_marker(offset, timestamp_ms, marker) {
            Applied::Tick(nonce) => self.on_tick(nonce, offset, timestamp_ms),
            Applied::Odd(oddity) => metrics.emit(OddMarker {
                partition: self.id,
                offset,
                oddity,
                source: marker.source(),
            }),
            Applied::Cancelled => {
                if let Some(id) = marker.source() {
                    metrics.emit(Cancelled { id });
                }
            }
            Applied::Scheduled => metrics.emit(ScheduleTracked {
                id: &self.state.home_ref(offset),
            }),
            _ => {}
        }
    }

    /// Version 2: one marker, many records of source partition `(topic, partition)`; only the
    /// odd outcomes need saying.
    fn apply_batch(
        &mut self,
        offset: i64,
        timestamp_ms: i64,
        marker: &Marker,
        (topic, partition): (&str, i32),
        metrics: &Metrics,
    ) {
        let id = self.id;
        let mut records = 0u64;
        self.state
            .on_batch(offset, timestamp_ms, marker, |applied, source_offset| {
                records += 1;
                match applied {
                    Applied::Odd(oddity) => {
                        let source = SourceRef::new(topic, partition, source_offset);
                        metrics.emit(OddMarker {
                            partition: id,
                            offset,
                            oddity,
                            source: Some(&source),
                        });
                    }
                    Applied::Cancelled => metrics.emit(Cancelled {
                        id: &SourceRef::new(topic, partition, source_offset),
                    }),
                    _ => {}
                }
            });
        metrics.emit(BatchedRecords {
            kind: marker.marker_type(),
            records,
        });
    }

    /// A Tick was read: if it is the one this owner wrote, catch-up is over.
    fn on_tick(&mut self, nonce: u64, offset: i64, timestamp_ms: i64) {
        if !matches!(self.catch_up, CatchUp::Replaying { nonce: want, .. } if want == nonce) {
            return;
        }
        self.catch_up = CatchUp::Ready;
        // The broker's time when this tracker took the partition, even if replay met a marker
        // stamped later (see `clock`).
        let (raw, at) = self.last_read.unwrap_or((timestamp_ms, Instant::now()));
        self.clock.reset(raw, at);
        self.ready_at_ms = Some(raw);
        tracing::info!(
            partition = self.id,
            offset,
            in_flight = self.state.in_flight(),
            "caught up; partition ready"
        );
    }

    /// Takes the due deliveries at partition time `now_ms` (at most `limit`), marking those
    /// due before catch-up ended (see [`Expiry::due_before_takeover`]).
    ///
    /// A deadline falls due only once the partition has been read through to it, less
    /// [`READ_THROUGH_SLACK_MS`]: a marker stamped at or after it has been read, so every End
    /// the broker appended before the deadline has been applied. Partition time runs on the
    /// monotonic clock between markers, so without this a deadline would pass while the
    /// partition cannot be read (its leader stopped or cut off) and the tracker would copy
    /// records whose Ends were written in time but are stuck behind the outage: each would be
    /// delivered twice. When something is due by the clock but not read through, `proof`
    /// asks for a Tick; reading it back (or any later marker) lets it fall due.
    pub fn take_due(&mut self, now_ms: i64, now: Instant, limit: usize) -> Vec<Expiry> {
        let until = self.read_limit_ms(now_ms);
        let mut due = self.state.expired(until, limit);
        let beyond = self
            .state
            .next_deadline()
            .is_some_and(|d| d > until && d <= now_ms);
        self.proof = match (beyond, self.proof) {
            (false, _) => Proof::NotNeeded,
            (true, Proof::NotNeeded) => Proof::Wanted { since: now },
            (true, waiting) => waiting,
        };
        let ready_at = self.ready_at_ms.unwrap_or(i64::MAX);
        for e in &mut due {
            e.due_before_takeover = e.deadline_ms <= ready_at;
        }
        due
    }

    /// The latest deadline that may fall due at partition time `now_ms`: `now_ms`, or less if
    /// the partition has not been read through that far (see [`Self::take_due`]).
    pub fn read_limit_ms(&self, now_ms: i64) -> i64 {
        self.read_through_ms
            .map_or(i64::MIN, |r| r.saturating_add(READ_THROUGH_SLACK_MS))
            .min(now_ms)
    }

    /// When the markers loop should wake for a deadline at `deadline_ms`: at the deadline,
    /// or, if it has passed but the partition is not read through to it, when the
    /// read-through Tick is to be written (again); reading a marker wakes the loop anyway.
    pub fn wake_for(&self, deadline_ms: i64, now: Instant) -> Option<Instant> {
        let at = self.clock.instant_of(deadline_ms)?;
        let now_ms = self.clock.now_ms(now)?;
        if at > now || deadline_ms <= self.read_limit_ms(now_ms) {
            return Some(at);
        }
        Some(match self.proof {
            Proof::Sent { sent_at, .. } => sent_at + PROOF_RETRY,
            Proof::NotNeeded | Proof::Wanted { .. } => now,
        })
    }

    /// Whether a read-through Tick should be written now; if it has been wanted for longer
    /// than [`HELD_REPORT_AFTER`], also for how long.
    pub fn proof_tick_due(&self, now: Instant) -> Option<Option<Duration>> {
        let (since, due) = match self.proof {
            Proof::NotNeeded => return None,
            Proof::Wanted { since } => (since, true),
            Proof::Sent { since, sent_at } => (since, now.duration_since(sent_at) >= PROOF_RETRY),
        };
        let held = now.saturating_duration_since(since);
        due.then_some((held >= HELD_REPORT_AFTER).then_some(held))
    }

    /// Notes that a read-through Tick was written at `now`.
    pub fn proof_sent(&mut self, now: Instant) {
        if let Proof::Wanted { since } | Proof::Sent { since, .. } = self.proof {
            self.proof = Proof::Sent {
                since,
                sent_at: now,
            };
        }
    }

    /// Notes that a record (marker or not) at `offset` with `timestamp_ms` was read at `at`,
    /// with the host's wall clock at `wall_ms`. Returns the timestamp to apply its marker at:
    /// its own, or partition time if it lies too far ahead (counted and logged; see `clock`).
    pub fn observe(
        &mut self,
        offset: i64,
        timestamp_ms: Option<i64>,
        at: Instant,
        wall_ms: i64,
        metrics: &Metrics,
    ) -> Option<i64> {
        self.next_offset = Some(offset + 1);
        let ts = timestamp_ms?;
        self.last_read = Some((ts, at));
        let applied = self.applied_at(offset, ts, at, wall_ms, metrics);
        self.read_through_ms = Some(self.read_through_ms.map_or(applied, |r| r.max(applied)));
        Some(applied)
    }

    /// The timestamp to apply a marker stamped `ts` at (see [`Self::observe`]).
    fn applied_at(
        &mut self,
        offset: i64,
        ts: i64,
        at: Instant,
        wall_ms: i64,
        metrics: &Metrics,
    ) -> i64 {
        match self.clock.observe(ts, at, wall_ms, !self.is_ready()) {
            Reading::Believed => ts,
            Reading::Outlier {
                ahead_ms,
                apply_at_ms,
            } => {
                metrics.emit(ClockOutlier {
                    partition: self.id,
                    offset,
                    ahead_ms,
                });
                apply_at_ms
            }
            Reading::Moved { from_ms } => {
                metrics.emit(ClockMoved {
                    partition: self.id,
                    offset,
                    from_ms,
                    to_ms: ts,
                });
                ts
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_snapshot_waits_until_the_latest_is_committed() {
        let mut p = OwnedPartition::new("m", 0, 1);
        assert!(p.snapshot_committed(), "no snapshot yet");
        let pointer = |epoch| Pointer {
            epoch,
            first: 0,
            last: 0,
            covers: 10,
        };
        p.restore(pointer(3), PartitionState::at("m", 0));
        assert!(p.snapshot_committed(), "a restored pointer was committed");
        p.snapshots.latest = Some(pointer(4)); // durable, its commit not yet made (or failing)
        assert!(
            !p.snapshot_committed(),
            "epoch 5 would reuse epoch 3's keys"
        );
        p.snapshots.committed_epoch = Some(4);
        assert!(p.snapshot_committed());
    }

    #[test]
    fn ready_only_after_its_own_tick() {
        let metrics = Metrics::new();
        let mut p = OwnedPartition::new("m", 0, 42);
        let t0 = Instant::now();
        assert_eq!(p.tick_due(t0), Some(42));
        p.tick_sent(t0);
        assert_eq!(p.tick_due(t0), None);
        assert_eq!(p.tick_due(t0 + TICK_RETRY), Some(42));
        p.apply(0, 0, &Marker::Tick { nonce: 7 }, &metrics);
        assert!(!p.is_ready(), "another tracker's tick does not end replay");
        p.apply(1, 0, &Marker::Tick { nonce: 42 }, &metrics);
        assert!(p.is_ready());
        assert_eq!(p.tick_due(t0 + TICK_RETRY * 2), None);
    }

    #[test]
    fn a_replay_is_silent_only_when_nothing_came_since_its_tick_was_written() {
        let metrics = Metrics::new();
        let mut p = OwnedPartition::new("m", 0, 42);
        let t0 = Instant::now();
        assert_eq!(p.silent_since_tick(t0), None, "no Tick written yet");
        p.tick_sent(t0);
        let later = t0 + TICK_RETRY;
        assert_eq!(p.silent_since_tick(later), Some(TICK_RETRY));
        p.restore = Restore::Asked;
        assert_eq!(p.silent_since_tick(later), None, "paused for its snapshot");
        p.restore = Restore::Done;
        p.observe(
            0,
            Some(1_000),
            t0 + Duration::from_millis(1),
            1_000,
            &metrics,
        );
        assert_eq!(
            p.silent_since_tick(later),
            None,
            "a long replay still reads"
        );
        p.tick_sent(later);
        assert_eq!(
            p.silent_since_tick(later + TICK_RETRY),
            Some(TICK_RETRY),
            "nothing since the Tick was written again"
        );
        p.apply(1, 1_000, &Marker::Tick { nonce: 42 }, &metrics);
        assert_eq!(p.silent_since_tick(later + TICK_RETRY), None, "ready");
    }
}
