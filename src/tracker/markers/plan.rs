//! The markers loop's decisions, apart from its I/O.
//!
//! Given the owned partitions and the local time, these say what to hand to the redelivery
//! worker, when to wake, and what to commit; `consumer.rs` only polls, sends and commits what
//! they return. So the rules (nothing redelivered before the partition's own Tick returns,
//! nothing dispatched before its deadline, the safe commit point, a failed commit retried)
//! are unit-tested here with an injected clock, without Kafka.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::marker::SourceRef;
use crate::tracker::core::group_hold::{
    AfterHold, Committed, CopiedAfterHold, HoldPolicy, Verdict,
};
use crate::tracker::core::state::Cause;
use crate::tracker::inspect::PartitionView;
use crate::tracker::markers::partition::{OwnedPartition, Restore};
use crate::tracker::redeliver::worker::Job;

/// The owned partitions, by number.
pub(crate) type Partitions = BTreeMap<i32, OwnedPartition>;

/// Holding back copies for the source group (`core/group_hold.rs`): the policy, and what is
/// known of the group's committed offset of a record's partition.
pub(crate) struct GroupCheck<'a> {
    pub policy: HoldPolicy,
    pub committed: &'a dyn Fn(&SourceRef) -> Committed,
}

/// What [`due_jobs`] found.
#[derive(Default)]
pub(crate) struct Due {
    /// The work for the redelivery worker.
    pub jobs: Vec<Job>,
    /// Deliveries held back for the first time (their group has not committed past them).
    pub held: u64,
    /// Deliveries copied after being held, by why.
    pub copied_after_hold: CopiedAfterHold,
}

/// The due deliveries of ready partitions at local instant `now`, as at most `room` jobs of
/// at most `batch` deliveries each. A partition still replaying gives none: its state may be
/// incomplete until its own Tick comes back. With a `group` check, a due delivery whose
/// record the source group will read again is held instead (made due again later).
pub(crate) fn due_jobs(
    partitions: &mut Partitions,
    now: Instant,
    room: usize,
    batch: usize,
    group: Option<&GroupCheck<'_>>,
) -> Due {
    let mut due = Due::default();
    for p in partitions.values_mut().filter(|p| p.is_ready()) {
        if due.jobs.len() >= room {
            break;
        }
        let Some(now_ms) = p.clock.now_ms(now) else {
            continue;
        };
        let mut expiries = p.take_due(now_ms, now, batch);
        if let Some(check) = group {
            expiries.retain(|e| {
                // Only a timeout can be held: the others need no lookup.
                let committed = match e.cause {
                    Cause::Timeout => (check.committed)(&e.source),
                    _ => Committed::Nothing,
                };
                match p.holds.decide(e, committed, now_ms, &check.policy) {
                    Verdict::Hold { until_ms, first } => {
                        let held = p.state.hold(&e.source, until_ms);
                        due.held += u64::from(held && first);
                        !held
                    }
                    Verdict::Copy { after_hold } => {
                        if let Some(why) = after_hold {
                            due.copied_after_hold.add(why);
                        }
                        // What each timeout's copy was decided on: a copy the group then
                        // delivers as well (RELIABILITY.md, "The copies after a hold, by
                        // why") can be traced back to the offset the tracker saw.
                        if matches!(e.cause, Cause::Timeout) {
                            tracing::debug!(
                                record = %e.source,
                                attempt = e.attempt,
                                ?committed,
                                after_hold = after_hold.map(AfterHold::outcome),
                                "copying a timed-out delivery the source group has not held back"
                            );
                        }
                        true
                    }
                }
            });
        }
        if expiries.is_empty() {
            continue;
        }
        p.redeliveries += expiries.len() as u64;
        due.jobs.push(Job {
            markers_partition: p.id,
            generation: p.generation,
            expiries,
            taken_at_ms: now_ms,
            taken_at: now,
        });
    }
    due
}

/// The records of ready partitions' deliveries due within `window` of `now` that were not
/// listed before, at most about `limit` (see `redeliver/read_ahead.rs`). Replaying partitions
/// are left alone: what falls due there is not known until they catch up.
pub(crate) fn read_ahead(
    partitions: &mut Partitions,
    now: Instant,
    window: Duration,
    limit: usize,
) -> Vec<SourceRef> {
    let window_ms = i64::try_from(window.as_millis()).unwrap_or(i64::MAX);
    let mut out = Vec::new();
    for p in partitions.values_mut().filter(|p| p.is_ready()) {
        if out.len() >= limit {
            break;
        }
        let Some(now_ms) = p.clock.now_ms(now) else {
            continue;
        };
        let until = now_ms.saturating_add(window_ms);
        out.extend(p.state.read_ahead(until, limit - out.len()));
    }
    out
}

/// When the loop must wake at the latest: the earliest deadline of a ready partition (only
/// if the worker has room for more), the moment the next deliveries come within `read_ahead`
/// of theirs (if reading ahead), the next commit, or `max_wait` from `now`.
pub(crate) fn wake_at(
    partitions: &mut Partitions,
    now: Instant,
    next_commit: Instant,
    max_wait: Duration,
    worker_has_room: bool,
    read_ahead: Option<Duration>,
) -> Instant {
    let mut until = (now + max_wait).min(next_commit);
    // `next_deadline` and `next_to_read_ahead` sweep stale heap entries, hence `mut`.
    for p in partitions.values_mut().filter(|p| p.is_ready()) {
        if worker_has_room {
            if let Some(at) = p.state.next_deadline().and_then(|d| p.wake_for(d, now)) {
                until = until.min(at);
            }
        }
        if let Some(window) = read_ahead {
            let next = p.state.next_to_read_ahead();
            if let Some(at) = next.and_then(|d| p.clock.instant_of(d)) {
                until = until.min(at.checked_sub(window).unwrap_or(now));
            }
        }
    }
    until
}

/// One partition's commit: the offset, the snapshot pointer as metadata, and the epoch the
/// pointer names (see `OwnedPartition::committed_epoch`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Commit {
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) metadata: Option<String>,
    pub(crate) epoch: Option<u64>,
}

/// What one commit interval found: the view of each partition, the commits to make, and
/// whether the tracker is ready.
pub(crate) struct Interval {
    pub(crate) views: Vec<PartitionView>,
    pub(crate) commits: Vec<Commit>,
    pub(crate) all_ready: bool,
}

/// Whether the tracker is ready: it has been assigned its partitions at least once, and every
/// partition it owns has read its own Tick back.
pub(crate) fn all_ready(partitions: &Partitions, assigned_once: bool) -> bool {
    assigned_once && partitions.values().all(OwnedPartition::is_ready)
}

/// The commit interval at local instant `now`: one summary per partition serves its view,
/// `snapshot` (called with the partition and its oldest item's offset, to begin a snapshot if
/// one is due) and its commit. A commit is planned only when it would change something: the
/// offset, or the snapshot it names.
pub(crate) fn interval(
    partitions: &mut Partitions,
    assigned_once: bool,
    now: Instant,
    mut snapshot: impl FnMut(&mut OwnedPartition, i64),
) -> Interval {
    let all_ready = all_ready(partitions, assigned_once);
    let mut views = Vec::with_capacity(partitions.len());
    let mut commits = Vec::new();
    for p in partitions.values_mut() {
        let now_ms = p.clock.now_ms(now).unwrap_or(0);
        let ready = p.is_ready();
        // A walk over every entry: done once for the view, the snapshot and the commit.
        let s = p.next_offset.map(|next| p.state.summary(next, now_ms));
        views.push(PartitionView {
            partition: p.id,
            ready,
            waiting_for_snapshot: p.restore != Restore::Done,
            in_flight: s.as_ref().map_or(0, |s| s.in_flight),
            scheduled: s.as_ref().map_or(0, |s| s.scheduled),
            oldest: s
                .as_ref()
                .and_then(|s| s.oldest.as_ref())
                .map(ToString::to_string),
            oldest_age_ms: s.as_ref().map_or(0, |s| s.oldest_age_ms),
            next_deadlines_in_ms: p
                .state
                .next_deadlines(5)
                .iter()
                .map(|d| d - now_ms)
                .collect(),
            redeliveries: p.redeliveries,
            committed_offset: p.committed,
        });
        let Some(oldest) = s.as_ref().map(|s| s.commit_offset) else {
            continue;
        };
        snapshot(p, oldest);
        let (offset, metadata) = p.commit_point_from(oldest);
        let epoch = p.snapshots.latest.map(|s| s.epoch);
        if p.committed != Some(offset) || p.snapshots.committed_epoch != epoch {
            p.committed = Some(offset);
            commits.push(Commit {
                partition: p.id,
                offset,
                metadata,
                epoch,
            });
        }
    }
    Interval {
        views,
        commits,
        all_ready,
    }
}

/// The safe commits of partitions `ids` at local instant `now`, whatever was committed
/// before: for a revocation and the final commit.
pub(crate) fn final_commits(partitions: &mut Partitions, ids: &[i32], now: Instant) -> Vec<Commit> {
    let mut out = Vec::new();
    for id in ids {
        let Some(p) = partitions.get_mut(id) else {
            continue;
        };
        let now_ms = p.clock.now_ms(now).unwrap_or(0);
        if let Some((offset, metadata)) = p.commit_point(now_ms) {
            p.committed = Some(offset);
            out.push(Commit {
                partition: *id,
                offset,
                metadata,
                epoch: p.snapshots.latest.map(|s| s.epoch),
            });
        }
    }
    out
}

/// Records how the commits of an interval went: after a failure every partition is planned
/// again next time; after a success each committed snapshot epoch is known to be named.
pub(crate) fn committed(partitions: &mut Partitions, commits: &[Commit], ok: bool) {
    if !ok {
        for p in partitions.values_mut() {
            p.committed = None;
        }
        return;
    }
    for c in commits {
        if let Some(p) = partitions.get_mut(&c.partition) {
            p.snapshots.committed_epoch = c.epoch;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::{Marker, SourceRef};
    use crate::tracker::markers::partition::{
        Proof, HELD_REPORT_AFTER, PROOF_RETRY, READ_THROUGH_SLACK_MS,
    };
    use crate::tracker::metrics::Metrics;

    const T0_MS: i64 = 1_000_000;

    struct Fixture {
        partitions: Partitions,
        metrics: Metrics,
        t0: Instant,
        next_offset: i64,
    }

    impl Fixture {
        /// Partition 0, assigned and waiting for the Tick with nonce 7.
        fn new() -> Self {
            let mut partitions = Partitions::new();
            partitions.insert(0, OwnedPartition::new("m", 0, 7));
            Fixture {
                partitions,
                metrics: Metrics::new(),
                t0: Instant::now(),
                next_offset: 0,
            }
        }

        /// Reads `marker` stamped `ts_ms`, `after` into the test.
        fn read(&mut self, marker: Marker, ts_ms: i64, after: Duration) -> i64 {
            let offset = self.next_offset;
            self.next_offset += 1;
            let p = self.partitions.get_mut(&0).unwrap();
            let at = self.t0 + after;
            let ts = p
                .observe(offset, Some(ts_ms), at, ts_ms, &self.metrics)
                .unwrap();
            p.apply(offset, ts, &marker, &self.metrics);
            offset
        }

        fn start(&mut self, record: i64, timeout_ms: u32, ts_ms: i64, after: Duration) -> i64 {
            let m = Marker::Start {
                source: SourceRef::new("orders", 0, record),
                timeout_ms,
                attempt: 1,
            };
            self.read(m, ts_ms, after)
        }

        /// Reads a Tick some other tracker, or this one's read-through, wrote at `ts_ms`.
        fn tick(&mut self, ts_ms: i64, after: Duration) {
            self.read(Marker::Tick { nonce: 99 }, ts_ms, after);
        }

        fn due(&mut self, after: Duration) -> Vec<i64> {
            due_jobs(&mut self.partitions, self.t0 + after, 16, 100, None)
                .jobs
                .iter()
                .flat_map(|j| j.expiries.iter().map(|e| e.source.offset))
                .collect()
        }
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn nothing_is_dispatched_before_the_partitions_own_tick_returns() {
        let mut f = Fixture::new();
        f.start(10, 1_000, T0_MS, Duration::ZERO);
        assert!(f.due(5_000 * MS).is_empty(), "still replaying");
        f.read(Marker::Tick { nonce: 99 }, T0_MS + 5_000, 5_000 * MS);
        assert!(f.due(5_000 * MS).is_empty(), "another tracker's Tick");
        f.read(Marker::Tick { nonce: 7 }, T0_MS + 5_000, 5_000 * MS);
        assert_eq!(
            f.due(5_000 * MS),
            [10],
            "overdue, now that the state is whole"
        );
    }

    #[test]
    fn ready_once_assigned_and_every_partition_has_its_tick_back() {
        let mut f = Fixture::new();
        assert!(!all_ready(&f.partitions, false), "never assigned");
        assert!(!all_ready(&f.partitions, true), "still replaying");
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        assert!(all_ready(&f.partitions, true));
        assert!(!all_ready(&f.partitions, false));
    }

    #[test]
    fn a_delivery_is_dispatched_at_its_deadline_and_not_before() {
        let mut f = Fixture::new();
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        f.start(10, 2_000, T0_MS, Duration::ZERO);
        let p = &mut f.partitions;
        let wake = wake_at(
            p,
            f.t0,
            f.t0 + Duration::from_secs(60),
            Duration::from_secs(60),
            true,
            None,
        );
        assert_eq!(
            wake,
            f.t0 + 2_000 * MS,
            "the loop sleeps exactly until the deadline"
        );
        let idle = wake_at(
            p,
            f.t0,
            f.t0 + Duration::from_secs(60),
            Duration::from_secs(60),
            false,
            None,
        );
        assert_eq!(
            idle,
            f.t0 + Duration::from_secs(60),
            "no room in the worker: no wake-up"
        );
        f.tick(T0_MS + 1_950, 1_950 * MS);
        assert!(f.due(1_999 * MS).is_empty());
        assert_eq!(f.due(2_000 * MS), [10]);
        assert!(f.due(3_000 * MS).is_empty(), "taken once");
        assert_eq!(f.partitions[&0].redeliveries, 1);
    }

    #[test]
    fn a_delivery_its_group_has_not_committed_past_is_held_until_the_wait_runs_out() {
        let mut f = Fixture::new();
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        f.start(10, 2_000, T0_MS, Duration::ZERO);
        let next = std::cell::Cell::new(10);
        let lookup = |s: &SourceRef| {
            assert_eq!((s.topic.as_ref(), s.partition, s.offset), ("orders", 0, 10));
            Committed::At(next.get())
        };
        let check = GroupCheck {
            policy: HoldPolicy::waiting(3_000),
            committed: &lookup,
        };
        let due_at = |f: &mut Fixture, ms: u32| {
            f.tick(T0_MS + ms as i64 - 50, MS * (ms - 50));
            due_jobs(&mut f.partitions, f.t0 + MS * ms, 16, 100, Some(&check))
        };
        // The group's next offset is the record itself: nobody was handed it. Held.
        let due = due_at(&mut f, 2_000);
        assert!(due.jobs.is_empty());
        assert_eq!((due.held, due.copied_after_hold.total()), (1, 0));
        let p = &mut f.partitions;
        let wake = wake_at(p, f.t0, f.t0 + 60_000 * MS, 60_000 * MS, true, None);
        assert_eq!(wake, f.t0 + 3_000 * MS, "looked at again a second later");
        let due = due_at(&mut f, 3_000);
        assert!(due.jobs.is_empty());
        assert_eq!(due.held, 0, "counted once");
        // Committed past it: the group took it over, its Start is on the way. Still held.
        next.set(11);
        let due = due_at(&mut f, 4_000);
        assert!(due.jobs.is_empty());
        // Three seconds after the first hold, and no Start came: copied.
        let due = due_at(&mut f, 5_000);
        let offsets: Vec<i64> = due
            .jobs
            .iter()
            .flat_map(|j| j.expiries.iter().map(|e| e.source.offset))
            .collect();
        assert_eq!(offsets, [10]);
        assert_eq!(due.copied_after_hold.get(AfterHold::Waited), 1);
        assert_eq!(due.copied_after_hold.total(), 1);
        assert_eq!(f.partitions[&0].redeliveries, 1);
    }

    /// The markers partition's leader stops at 500 ms: nothing more is read from it while
    /// the clock runs on. The worker's End, written at 1,500 ms, is appended when the leader
    /// comes back at 4,000 ms, just before the tracker's read-through Tick.
    #[test]
    fn nothing_falls_due_until_the_partition_is_read_through_to_its_deadline() {
        let mut f = Fixture::new();
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        f.start(10, 2_000, T0_MS, Duration::ZERO);
        f.start(11, 2_000, T0_MS, Duration::ZERO);
        f.tick(T0_MS + 500, 500 * MS);
        assert!(
            f.due(2_000 * MS).is_empty(),
            "due by the clock, not read through"
        );
        let p = f.partitions.get_mut(&0).unwrap();
        assert!(
            matches!(p.proof, Proof::Wanted { .. }),
            "a Tick is asked for"
        );
        let now = f.t0 + 2_000 * MS;
        assert_eq!(
            p.wake_for(T0_MS + 2_000, now),
            Some(now),
            "woken to write it"
        );
        assert_eq!(p.proof_tick_due(now), Some(None));
        p.proof_sent(now);
        assert_eq!(
            p.wake_for(T0_MS + 2_000, now),
            Some(now + PROOF_RETRY),
            "then sleeps until a marker comes or the Tick is due again"
        );
        assert_eq!(p.proof_tick_due(now + 100 * MS), None);
        let later = now + HELD_REPORT_AFTER;
        assert_eq!(
            p.proof_tick_due(later),
            Some(Some(later - now)),
            "written again, and reported once held long"
        );
        let end = Marker::End {
            source: SourceRef::new("orders", 0, 10),
        };
        f.read(end, T0_MS + 4_000, 4_000 * MS);
        f.tick(T0_MS + 4_001, 4_001 * MS);
        assert_eq!(
            f.due(4_001 * MS),
            [11],
            "the End written in time was applied first"
        );
        assert_eq!(f.partitions[&0].proof, Proof::NotNeeded);
    }

    #[test]
    fn a_marker_just_before_the_deadline_is_read_through_enough() {
        let mut f = Fixture::new();
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        f.start(10, 2_000, T0_MS, Duration::ZERO);
        f.tick(T0_MS + 2_000 - READ_THROUGH_SLACK_MS - 1, 1_899 * MS);
        assert!(f.due(2_000 * MS).is_empty());
        f.tick(T0_MS + 2_000 - READ_THROUGH_SLACK_MS, 1_900 * MS);
        assert_eq!(f.due(2_000 * MS), [10], "within the slack: no Tick needed");
    }

    #[test]
    fn records_are_listed_for_reading_ahead_once_and_still_fall_due_at_their_deadline() {
        let mut f = Fixture::new();
        let window = Duration::from_millis(100);
        f.start(10, 2_000, T0_MS, Duration::ZERO);
        assert!(
            read_ahead(&mut f.partitions, f.t0 + 1_950 * MS, window, 100).is_empty(),
            "nothing is read ahead while replaying"
        );
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        f.start(11, 3_000, T0_MS, Duration::ZERO);
        let wake = wake_at(
            &mut f.partitions,
            f.t0,
            f.t0 + Duration::from_secs(60),
            Duration::from_secs(60),
            false,
            Some(window),
        );
        assert_eq!(wake, f.t0 + 1_900 * MS, "woken to read 10 ahead");
        assert!(read_ahead(&mut f.partitions, f.t0 + 1_899 * MS, window, 100).is_empty());
        let listed = read_ahead(&mut f.partitions, f.t0 + 1_900 * MS, window, 100);
        assert_eq!(listed, [SourceRef::new("orders", 0, 10)]);
        assert!(
            read_ahead(&mut f.partitions, f.t0 + 1_950 * MS, window, 100).is_empty(),
            "listed once"
        );
        f.tick(T0_MS + 1_950, 1_950 * MS);
        assert!(f.due(1_999 * MS).is_empty(), "listed, not dispatched");
        assert_eq!(f.due(2_000 * MS), [10]);
        let listed = read_ahead(&mut f.partitions, f.t0 + 2_900 * MS, window, 100);
        assert_eq!(listed, [SourceRef::new("orders", 0, 11)]);
        f.tick(T0_MS + 2_950, 2_950 * MS);
        assert_eq!(f.due(3_000 * MS), [11]);
    }

    #[test]
    fn a_delivery_settled_after_it_was_listed_does_not_fall_due() {
        let mut f = Fixture::new();
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        f.start(10, 2_000, T0_MS, Duration::ZERO);
        let window = Duration::from_millis(100);
        assert_eq!(
            read_ahead(&mut f.partitions, f.t0 + 1_950 * MS, window, 100).len(),
            1
        );
        let end = Marker::End {
            source: SourceRef::new("orders", 0, 10),
        };
        f.read(end, T0_MS + 1_960, 1_960 * MS);
        assert!(f.due(5_000 * MS).is_empty());
    }

    #[test]
    fn no_more_jobs_than_the_worker_has_room_for() {
        let mut f = Fixture::new();
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        f.start(10, 1_000, T0_MS, Duration::ZERO);
        f.tick(T0_MS + 5_000, 5_000 * MS);
        assert!(due_jobs(&mut f.partitions, f.t0 + 5_000 * MS, 0, 100, None)
            .jobs
            .is_empty());
        assert_eq!(f.due(5_000 * MS), [10], "still there once room is made");
    }

    #[test]
    fn commits_follow_the_oldest_start_and_are_made_once() {
        let mut f = Fixture::new();
        f.read(Marker::Tick { nonce: 7 }, T0_MS, Duration::ZERO);
        let first = f.start(10, 60_000, T0_MS, Duration::ZERO);
        f.start(11, 60_000, T0_MS, Duration::ZERO);
        let plan = interval(&mut f.partitions, true, f.t0, |_, _| {});
        assert!(plan.all_ready);
        assert_eq!(plan.views[0].in_flight, 2);
        let offsets: Vec<i64> = plan.commits.iter().map(|c| c.offset).collect();
        assert_eq!(offsets, [first], "not past the oldest Start in flight");
        committed(&mut f.partitions, &plan.commits, true);
        let again = interval(&mut f.partitions, true, f.t0, |_, _| {});
        assert!(
            again.commits.is_empty(),
            "nothing changed: nothing to commit"
        );

        let end = |r| Marker::End {
            source: SourceRef::new("orders", 0, r),
        };
        f.read(end(10), T0_MS, Duration::ZERO);
        f.read(end(11), T0_MS, Duration::ZERO);
        let plan = interval(&mut f.partitions, true, f.t0, |_, _| {});
        assert_eq!(
            plan.commits[0].offset, f.next_offset,
            "nothing in flight: the position"
        );
        committed(&mut f.partitions, &plan.commits, false);
        let retried = interval(&mut f.partitions, true, f.t0, |_, _| {});
        assert_eq!(
            retried.commits.len(),
            1,
            "a failed commit is made again next interval"
        );
    }

    #[test]
    fn a_revoked_partition_gets_its_safe_commit_even_if_unchanged() {
        let mut f = Fixture::new();
        let first = f.start(10, 60_000, T0_MS, Duration::ZERO);
        let plan = interval(&mut f.partitions, true, f.t0, |_, _| {});
        assert!(!plan.all_ready, "replaying");
        committed(&mut f.partitions, &plan.commits, true);
        let last = final_commits(&mut f.partitions, &[0, 5], f.t0);
        assert_eq!(last.len(), 1, "owned partitions only");
        assert_eq!(last[0].offset, first);
    }
}
