//! Rebalances seen from the poll thread: partitions assigned and revoked, records of revoked
//! partitions left out of the batches in flight, and records kept alive until the group settles.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;

use crate::client::coalesce::Op;
use crate::marker::SourceRef;
use crate::resume::committed_many;

use super::{Polled, Poller};

impl Poller {
    /// Takes the partitions a rebalance assigned (their resume is to be checked) and let go;
    /// returns those let go, which are also kept for the batches in flight.
    pub(super) fn note_rebalance(&self) -> Vec<(String, i32)> {
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

    /// Writes the KeepAlives due for the records kept alive through a rebalance, and reports
    /// those that failed.
    pub(super) fn renew_leases(&self) {
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
                limit_s = crate::client::lease::LEASE_LIMIT.as_secs(),
                "the group has not settled within the limit; no longer keeping alive the records \
                 not handed out for its sake (the tracker redelivers them when they time out)"
            ),
        }
    }

    /// Keeps `records` alive until the group settles, and counts them.
    pub(super) fn hold_through_rebalance(&self, records: Vec<(SourceRef, Duration)>) {
        self.settler
            .held_through_rebalances
            .fetch_add(records.len() as u64, Ordering::Relaxed);
        self.leases.borrow_mut().hold(records, Instant::now());
    }

    /// An assignment came: the group has settled, and the records kept alive for its sake
    /// are left to their next owner.
    pub(super) fn group_settled(&self) {
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
}

/// What [`without_revoked`] took out of a batch.
pub(super) struct Released {
    /// How many records.
    pub(super) records: usize,
    /// Those whose Starts are durable, with their timeouts: the tracker would redeliver them.
    pub(super) started: Vec<(SourceRef, Duration)>,
}

/// Takes out of `batch` (with its per-record `durable` flags) the records of partitions
/// revoked while it was in flight; returns what is left and what was taken out. Nothing
/// of those is committed or handed out: the partition's next owner reads them again, and its
/// Starts take over the ones written here (the tracker keeps one delivery per record, and a
/// second Start refreshes it). No End is written for them: an End names only the record, so
/// one arriving after the next owner's Start would end that owner's delivery, and a crash of
/// that owner would then lose the record. Those started are kept alive until the group settles
/// instead (`lease.rs`).
pub(super) fn without_revoked(
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
pub(super) fn moved_by_rebalance(e: &KafkaError) -> bool {
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

/// Whether `s` lies in one of `partitions`.
pub(super) fn in_partitions(partitions: &[(String, i32)], s: &SourceRef) -> bool {
    partitions
        .iter()
        .any(|(t, p)| *p == s.partition && **t == *s.topic)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::poller::tests::{coords, polled};

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
}
