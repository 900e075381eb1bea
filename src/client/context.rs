//! The source consumer's librdkafka context: it hears of the partitions the group assigns to
//! this consumer, so that the poll thread can check where each one resumes
//! ([`crate::resume`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext, Rebalance};
use rdkafka::ClientContext;

/// Partitions assigned or revoked since the poll thread last looked.
#[derive(Default)]
pub(crate) struct PollContext {
    changes: Mutex<Changes>,
    /// Set with every change: the poll thread looks at `changes` only then.
    changed: AtomicBool,
    /// Whether back-pressure paused fetching (set by the poll thread): partitions assigned
    /// meanwhile are paused too.
    paused: AtomicBool,
}

/// What a rebalance changed.
#[derive(Default)]
pub(crate) struct Changes {
    pub(crate) assigned: Vec<(String, i32)>,
    pub(crate) revoked: Vec<(String, i32)>,
    /// How many assignments came, empty ones included: each means the group has settled.
    pub(crate) assignments: usize,
}

impl PollContext {
    /// The changes since the last call; empty (and no lock taken) when there were none.
    pub(crate) fn take(&self) -> Changes {
        // Called after every poll: a plain load, the swap only when something changed.
        if !self.changed.load(Ordering::Acquire) || !self.changed.swap(false, Ordering::AcqRel) {
            return Changes::default();
        }
        let mut changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *changes)
    }

    /// Back-pressure paused (or resumed) fetching on every partition assigned.
    pub(crate) fn set_paused(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    fn record(&self, tpl: &rdkafka::TopicPartitionList, assigned: bool) {
        let mut changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
        if assigned {
            changes.assignments += 1;
        }
        let list = if assigned {
            &mut changes.assigned
        } else {
            &mut changes.revoked
        };
        list.extend(
            tpl.elements()
                .iter()
                .map(|e| (e.topic().to_string(), e.partition())),
        );
        self.changed.store(true, Ordering::Release);
    }
}

impl ClientContext for PollContext {}

impl ConsumerContext for PollContext {
    fn pre_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Revoke(tpl) = rebalance {
            self.record(tpl, false);
        }
    }

    /// Keeps back-pressure's pause to the partitions assigned. librdkafka keeps an
    /// application's pause on a partition after it is taken away, and the poll thread's resume
    /// reaches only what is assigned then: a partition revoked while fetching was paused came
    /// back paused later and stayed so, its records never read (tests/settle.rs). So a revoked
    /// partition's pause is cleared, as the Java client does; and a partition assigned while
    /// fetching is paused is paused at once, so that the bound on unsettled deliveries holds.
    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let (result, what) = match rebalance {
            Rebalance::Assign(tpl) => {
                self.record(tpl, true);
                if !self.paused.load(Ordering::Relaxed) {
                    return;
                }
                (consumer.pause(tpl), "pause the partitions assigned")
            }
            Rebalance::Revoke(tpl) => (consumer.resume(tpl), "clear the pause of those revoked"),
            Rebalance::Error(_) => return,
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "could not {what}");
        }
    }
}
