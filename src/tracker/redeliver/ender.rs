//! Writes the redelivery worker's End markers on a thread of its own.
//!
//! A pass used to wait for its Ends to be durable before the next pass could start, so every
//! due delivery that arrived meanwhile waited for a produce round trip it did not need: the
//! invariant is only that an End is *written after* its copy is durable, and the worker hands
//! the Ends over only then. Timing the passes (BENCHMARKS.md, "Redelivery lag") showed the
//! Ends' wait as a third of what a due delivery spent queued behind the pass before it.
//!
//! The fence still sees a partition as busy until its Ends are durable (or given up when the
//! tracker stops), so a revocation waits for them as it waits for a pass, and the next owner
//! reads them rather than redelivering those deliveries again.

use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use crate::tracker::core::fence::Fence;
use crate::tracker::metrics::Metrics;
use crate::tracker::redeliver::outgoing::{Outgoing, Sender};
use crate::tracker::redeliver::producers::Producers;

/// Passes whose Ends may wait for the thread before the worker itself waits: enough to keep
/// it busy, few enough that a stuck broker holds the worker back soon.
const QUEUED_PASSES: usize = 4;

/// The Ends of one pass, and the markers partitions they belong to.
struct Ends {
    partitions: Vec<i32>,
    records: Vec<Outgoing>,
}

/// The handle the worker writes its Ends through; dropping it waits for those queued.
pub(crate) struct Ender {
    queue: Option<SyncSender<Ends>>,
    thread: Option<JoinHandle<()>>,
    fence: Arc<Fence>,
}

impl Ender {
    /// Starts the thread; it writes with `producers`, retrying as [`Sender`] does until a stop.
    pub(crate) fn start(
        producers: Producers,
        metrics: Metrics,
        stop: Arc<AtomicBool>,
        fence: Arc<Fence>,
    ) -> std::io::Result<Self> {
        let (queue, passes) = sync_channel(QUEUED_PASSES);
        let done = fence.clone();
        let thread = std::thread::Builder::new()
            .name("tracker-ends".into())
            .spawn(move || write_loop(&passes, &producers, &metrics, &stop, &done))?;
        Ok(Ender {
            queue: Some(queue),
            thread: Some(thread),
            fence,
        })
    }

    /// Queues the Ends of copies already durable; `partitions` stay busy in the fence until
    /// they are written. Blocks while [`QUEUED_PASSES`] passes wait already.
    pub(crate) fn write(&self, partitions: Vec<i32>, records: Vec<Outgoing>) {
        if records.is_empty() {
            return;
        }
        self.fence.ends_pending(&partitions);
        let Some(queue) = &self.queue else { return };
        if let Err(lost) = queue.send(Ends {
            partitions,
            records,
        }) {
            // The thread is gone (it panicked): nobody will write these. Their deliveries
            // stay in flight and are redelivered again after their timeout.
            let Ends { partitions, .. } = lost.0;
            tracing::error!("the Ends thread is gone; these deliveries will be redelivered again");
            self.fence.ends_done(&partitions);
        }
    }
}

impl Drop for Ender {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(
                    "the Ends thread panicked; its deliveries will be redelivered again"
                );
            }
        }
    }
}

/// Writes each pass's Ends (merging the passes that queued up meanwhile into one round of
/// produces) until the worker drops its handle.
fn write_loop(
    passes: &Receiver<Ends>,
    producers: &Producers,
    metrics: &Metrics,
    stop: &AtomicBool,
    fence: &Fence,
) {
    let sender = Sender {
        producers,
        metrics,
        stop,
    };
    while let Ok(first) = passes.recv() {
        let mut partitions = vec![first.partitions];
        let mut records = first.records;
        for more in passes.try_iter().take(QUEUED_PASSES) {
            partitions.push(more.partitions);
            records.extend(more.records);
        }
        // `None`: stopping with some unwritten; those deliveries stay in flight for the next
        // owner, a duplicate at worst. Refused for good cannot happen to an End in practice;
        // it is counted by the sender like any refusal.
        let _ = sender.send_all(&records);
        for p in partitions {
            fence.ends_done(&p);
        }
    }
}
