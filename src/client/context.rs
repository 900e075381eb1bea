//! The source consumer's librdkafka context: it hears of the partitions the group assigns to
//! this consumer, so that the poll thread can check where each one resumes
//! ([`crate::resume`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use rdkafka::consumer::{BaseConsumer, ConsumerContext, Rebalance};
use rdkafka::ClientContext;

/// Partitions assigned or revoked since the poll thread last looked.
#[derive(Default)]
pub(crate) struct PollContext {
    changes: Mutex<Changes>,
    /// Set with every change: the poll thread looks at `changes` only then.
    changed: AtomicBool,
}

/// What a rebalance changed.
#[derive(Default)]
pub(crate) struct Changes {
    pub(crate) assigned: Vec<(String, i32)>,
    pub(crate) revoked: Vec<(String, i32)>,
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

    fn record(&self, tpl: &rdkafka::TopicPartitionList, assigned: bool) {
        let mut changes = self.changes.lock().unwrap_or_else(|e| e.into_inner());
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

    fn post_rebalance(&self, _: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            self.record(tpl, true);
        }
    }
}
