//! Who may act for a markers partition: the consumer thread grants and revokes ownership, the
//! redelivery worker checks it.
//!
//! Without a fence the worker went on draining queued jobs and retrying parked deliveries of
//! a partition its tracker had given up (during a graceful stop, for up to the grace period),
//! while the new owner did the same work: a schedule published twice in a rolling restart.
//! Each grant of a partition gets a new *generation*; jobs and parked deliveries carry the
//! generation they were taken under and are dropped once it is no longer current. A
//! revocation also waits for a pass already under way on that partition, and for the Ends such
//! a pass handed to the Ends thread, so that by the time the partition is given up, nothing of
//! this tracker acts for it any more.

use std::collections::HashMap;
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Ownership of markers partitions, shared by the consumer thread and the redelivery worker.
#[derive(Debug, Default)]
pub(crate) struct Fence {
    inner: Mutex<Inner>,
    idle: Condvar,
}

#[derive(Debug, Default)]
struct Inner {
    /// Owned partitions and the generation of their current grant.
    owned: HashMap<i32, u64>,
    last_generation: u64,
    /// Partitions that passes under way act for, and how many passes each: the worker
    /// starts a pass while the copies of the one before are still on their way
    /// (`redeliver/worker/landing.rs`).
    busy: HashMap<i32, usize>,
    /// Partitions with Ends handed to the Ends thread and not yet durable, and how many
    /// passes' worth each.
    ending: HashMap<i32, usize>,
}

impl Fence {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means a panic elsewhere; the map is still whole.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `partition` is now owned; returns the generation its work is to carry.
    pub(crate) fn grant(&self, partition: i32) -> u64 {
        let mut inner = self.lock();
        inner.last_generation += 1;
        let generation = inner.last_generation;
        inner.owned.insert(partition, generation);
        generation
    }

    /// `partitions` are no longer owned: their queued and parked work will be dropped. Waits up
    /// to `wait` for a pass already acting for one of them to finish; false if it did not.
    pub(crate) fn revoke(&self, partitions: &[i32], wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        let mut inner = self.lock();
        for p in partitions {
            inner.owned.remove(p);
        }
        while partitions.iter().any(|p| inner.busy.contains_key(p))
            || partitions.iter().any(|p| inner.ending.contains_key(p))
        {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            inner = match self.idle.wait_timeout(inner, left) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
        }
        true
    }

    /// Whether work taken for `partition` under `generation` may still be done.
    pub(crate) fn holds(&self, partition: i32, generation: u64) -> bool {
        self.lock().owned.get(&partition) == Some(&generation)
    }

    /// Starts a pass acting for the partitions of `work` (partition, generation) that are still
    /// held; returns which of `work` may go ahead. Every call is matched by one
    /// [`Self::end_pass`] with the partitions allowed here.
    pub(crate) fn begin_pass(&self, work: &[(i32, u64)]) -> Vec<bool> {
        let mut inner = self.lock();
        let allowed: Vec<bool> = work
            .iter()
            .map(|(p, g)| inner.owned.get(p) == Some(g))
            .collect();
        for ((p, _), _) in work.iter().zip(&allowed).filter(|(_, ok)| **ok) {
            *inner.busy.entry(*p).or_default() += 1;
        }
        allowed
    }

    /// The pass acting for `partitions` is over: a waiting revocation may go on.
    pub(crate) fn end_pass(&self, partitions: &[i32]) {
        let mut inner = self.lock();
        for p in partitions {
            if let Some(n) = inner.busy.get_mut(p) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    inner.busy.remove(p);
                }
            }
        }
        drop(inner);
        self.idle.notify_all();
    }

    /// A pass handed Ends of `partitions` to the Ends thread: revocations of them wait for
    /// [`Self::ends_done`] too.
    pub(crate) fn ends_pending(&self, partitions: &[i32]) {
        let mut inner = self.lock();
        for p in partitions {
            *inner.ending.entry(*p).or_default() += 1;
        }
    }

    /// Those Ends are durable (or given up at a stop).
    pub(crate) fn ends_done(&self, partitions: &[i32]) {
        let mut inner = self.lock();
        for p in partitions {
            if let Some(n) = inner.ending.get_mut(p) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    inner.ending.remove(p);
                }
            }
        }
        drop(inner);
        self.idle.notify_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn work_of_a_revoked_or_regranted_partition_is_refused() {
        let f = Fence::default();
        let g1 = f.grant(3);
        assert!(f.holds(3, g1));
        assert!(f.revoke(&[3], Duration::ZERO));
        assert!(!f.holds(3, g1), "revoked");
        let g2 = f.grant(3);
        assert!(!f.holds(3, g1), "work from the earlier grant stays refused");
        assert!(f.holds(3, g2));
        let g5 = f.grant(5);
        assert_eq!(
            f.begin_pass(&[(3, g1), (3, g2), (5, g5), (7, 1)]),
            [false, true, true, false]
        );
        f.end_pass(&[3, 5]);
    }

    #[test]
    fn a_revocation_waits_for_the_pass_under_way() {
        let f = Arc::new(Fence::default());
        let g = f.grant(1);
        assert_eq!(f.begin_pass(&[(1, g)]), [true]);
        assert!(
            !f.revoke(&[1], Duration::from_millis(20)),
            "the pass still runs"
        );
        assert!(!f.holds(1, g), "but no new work is taken for it");
        let worker = {
            let f = f.clone();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(50));
                f.end_pass(&[1]);
            })
        };
        assert!(f.revoke(&[1], Duration::from_secs(10)));
        worker.join().unwrap();
        assert!(
            f.revoke(&[2], Duration::ZERO),
            "nothing runs for partition 2"
        );
    }

    #[test]
    fn a_revocation_waits_for_the_ends_of_a_finished_pass() {
        let f = Arc::new(Fence::default());
        let g = f.grant(4);
        assert_eq!(f.begin_pass(&[(4, g)]), [true]);
        f.ends_pending(&[4]);
        f.ends_pending(&[4]);
        f.end_pass(&[4]);
        assert!(
            !f.revoke(&[4], Duration::from_millis(20)),
            "two passes' Ends are still being written"
        );
        f.ends_done(&[4]);
        assert!(!f.revoke(&[4], Duration::ZERO), "one still is");
        f.ends_done(&[4]);
        assert!(f.revoke(&[4], Duration::ZERO));
    }

    #[test]
    fn a_revocation_waits_for_every_pass_of_the_partition_under_way() {
        let f = Fence::default();
        let g = f.grant(6);
        let h = f.grant(7);
        // Two passes overlap: the second starts while the first's copies are on their way.
        assert_eq!(f.begin_pass(&[(6, g), (6, g)]), [true, true]);
        assert_eq!(f.begin_pass(&[(6, g), (7, h)]), [true, true]);
        f.end_pass(&[6, 6]);
        assert!(
            !f.revoke(&[6], Duration::from_millis(20)),
            "the second pass still acts for 6"
        );
        f.end_pass(&[6, 7]);
        assert!(f.revoke(&[6], Duration::ZERO));
        assert!(f.revoke(&[7], Duration::ZERO));
    }
}
