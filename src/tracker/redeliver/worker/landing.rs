//! The second half of a redelivery pass, on a thread of its own (`tracker-landing`): waiting
//! for a pass's copies to be durable, sending a copy its source refused for good to the
//! dead-letter topic, parking what every target refused, counting, and handing the Ends to
//! the Ends thread (`ender.rs`).
//!
//! The worker used to wait for each pass's copies before it took its next job. A delivery
//! that fell due during a pass then waited for that pass's broker round trip before its own
//! began: at 10,000 records/s offered, with the reads already done ahead of time, that queue
//! was the largest part of the deadline-to-redelivery p99 left (BENCHMARKS.md, "Reading ahead").
//! Now the worker sends a pass's copies, hands the pass here and takes its next job at once,
//! with up to [`PASSES_LANDING`] passes on their way before it waits.
//!
//! The protocol does not change: an End is still handed over only once its copy is durable,
//! a delivery is in one pass at a time (the markers consumer hands each due delivery over
//! once), and the fence counts a pass as under way until it has landed here, so a revocation
//! still waits for it.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{
    build_copy, copies_of, end_markers, home_topic, lock, Origin, Origins, Parked, PassGuard,
    PassTiming, Pending, MAX_PARK,
};
use crate::marker::SourceRef;
use crate::tracker::config::TrackerConfig;
use crate::tracker::core::action::{after_refusal, park_wait, Action};
use crate::tracker::core::fence::Fence;
use crate::tracker::core::state::{Cause, Expiry};
use crate::tracker::metrics::progress::{AlreadyPublished, Published};
use crate::tracker::metrics::work::{DeadLettered, DeadlineLag, DeliveryParked, Redelivered};
use crate::tracker::metrics::Metrics;
use crate::tracker::redeliver::ender::Ender;
use crate::tracker::redeliver::outgoing::{Outgoing, Sender, Started};
use crate::tracker::redeliver::producers::Producers;

/// Passes whose copies may be on their way before the worker waits for the oldest: enough to
/// overlap a slow round trip with the next few passes, few enough that a stuck broker holds
/// the worker back soon (each pass holds at most `MAX_BATCH` records).
pub(super) const PASSES_LANDING: usize = 4;

/// A pass whose copies the worker has handed to the producer.
pub(super) struct SentPass {
    pub(super) pending: Vec<Pending>,
    /// Schedules a previous owner had published already: only their Ends are written.
    pub(super) published: Vec<Pending>,
    pub(super) origins: Origins,
    /// Which of `pending` have a copy on its way (in that order in `copies` and `started`).
    pub(super) round: Vec<usize>,
    pub(super) copies: Vec<Outgoing>,
    pub(super) started: Vec<Started>,
    pub(super) timing: PassTiming,
    /// How long reading the sources took, for the pass log.
    pub(super) read: Duration,
    /// Ends the fence's pass once this one has landed.
    pub(super) guard: PassGuard,
}

/// The worker's handle on the landing thread; dropping it waits for the passes on their way.
pub(super) struct Landing {
    queue: Option<SyncSender<SentPass>>,
    thread: Option<JoinHandle<()>>,
}

impl Landing {
    /// Starts the thread. `parked` is shared with the worker, which retries what is parked.
    pub(super) fn start(
        config: Arc<TrackerConfig>,
        producers: Producers,
        metrics: Metrics,
        stop: Arc<AtomicBool>,
        fence: Arc<Fence>,
        parked: Arc<Mutex<Vec<Parked>>>,
    ) -> std::io::Result<Self> {
        let ender = Ender::start(producers.clone(), metrics.clone(), stop.clone(), fence)?;
        let lander = Lander {
            config,
            producers,
            metrics,
            stop,
            parked,
            refusals: HashMap::new(),
            ender,
        };
        let (queue, passes) = sync_channel(PASSES_LANDING);
        let thread = std::thread::Builder::new()
            .name("tracker-landing".into())
            .spawn(move || lander.run(&passes))?;
        Ok(Landing {
            queue: Some(queue),
            thread: Some(thread),
        })
    }

    /// Hands a sent pass over; blocks while [`PASSES_LANDING`] passes are on their way.
    pub(super) fn land(&self, pass: SentPass) {
        let Some(queue) = &self.queue else { return };
        if queue.send(pass).is_err() {
            // The thread is gone (it panicked). The pass's guard is dropped with the error, so
            // a revocation does not wait for it; its deliveries get no End and stay in flight,
            // to be redelivered again after their timeout: a duplicate, not a loss.
            tracing::error!(
                "the landing thread is gone; these deliveries will be redelivered again"
            );
        }
    }
}

impl Drop for Landing {
    fn drop(&mut self) {
        drop(self.queue.take());
        if let Some(thread) = self.thread.take() {
            if thread.join().is_err() {
                tracing::error!(
                    "the landing thread panicked; its deliveries will be redelivered again"
                );
            }
        }
    }
}

/// What the landing thread owns.
struct Lander {
    config: Arc<TrackerConfig>,
    producers: Producers,
    metrics: Metrics,
    stop: Arc<AtomicBool>,
    parked: Arc<Mutex<Vec<Parked>>>,
    /// How often each parked delivery has been refused, for its back-off.
    refusals: HashMap<SourceRef, u32>,
    /// Writes the Ends. Declared last: dropped after the rest, it waits for the Ends queued.
    ender: Ender,
}

impl Lander {
    fn run(mut self, passes: &Receiver<SentPass>) {
        while let Ok(pass) = passes.recv() {
            self.land(pass);
        }
    }

    fn sender(&self) -> Sender<'_> {
        Sender {
            producers: &self.producers,
            metrics: &self.metrics,
            stop: &self.stop,
        }
    }

    fn land(&mut self, pass: SentPass) {
        let SentPass {
            mut pending,
            published,
            origins,
            round,
            copies,
            started,
            timing,
            read,
            guard,
        } = pass;
        let Some(refused) = self.send_copies(&mut pending, round, &copies, started) else {
            return; // stopping: what is not durable stays in flight
        };
        let copied = timing.started.elapsed();
        self.finish(pending, refused, published, &origins);
        timing.log(read, copied);
        drop(guard);
    }

    /// Waits for the copies the worker sent; a copy to the source refused for good goes to
    /// the dead-letter topic instead. Returns, per pending delivery, why its copy could not
    /// be placed anywhere (`None` when it was); `None` overall if stopping.
    fn send_copies(
        &self,
        pending: &mut [Pending],
        mut round: Vec<usize>,
        copies: &[Outgoing],
        started: Vec<Started>,
    ) -> Option<Vec<Option<String>>> {
        let mut refused = vec![None; pending.len()];
        let mut results = self.sender().settle(copies, started)?;
        loop {
            let mut next = Vec::new();
            for (i, result) in round.into_iter().zip(results) {
                let Err(why) = result else { continue };
                let p = &mut pending[i];
                match after_refusal(&p.action, home_topic(p), &why) {
                    Some(action) => {
                        // Try the dead-letter topic, once, in the next round.
                        p.action = action;
                        p.copy = Some(build_copy(
                            &self.config,
                            &p.expiry,
                            &p.action,
                            p.record.as_ref(),
                        ));
                        next.push(i);
                    }
                    None => refused[i] = Some(why),
                }
            }
            if next.is_empty() {
                return Some(refused);
            }
            results = self.sender().send_all(&copies_of(pending, &next))?;
            round = next;
        }
    }

    /// After the copies: parks what every target refused, and writes the Ends of what was
    /// copied (or found published by a previous owner). Only a delivery whose copy is durable
    /// gets its End; one without a copy (never read, which happens only when stopping) stays
    /// in flight untouched.
    fn finish(
        &mut self,
        pending: Vec<Pending>,
        refused: Vec<Option<String>>,
        published: Vec<Pending>,
        origins: &Origins,
    ) {
        let (done, refused): (Vec<(Pending, Option<String>)>, Vec<_>) = pending
            .into_iter()
            .zip(refused)
            .filter(|(p, _)| p.copy.is_some())
            .partition(|(_, r)| r.is_none());
        for (p, why) in refused {
            if let Some(&o) = origins.get(&p.expiry.source) {
                self.park(p.expiry, o, why.unwrap_or_default());
            }
        }
        self.metrics.parked(lock(&self.parked).len());
        if done.iter().any(|(p, _)| p.action == Action::Publish) {
            crate::failpoint::hit("after-publish-durable");
        }
        for p in &published {
            self.metrics.emit(AlreadyPublished {
                id: &p.expiry.source,
                target: home_topic(p),
            });
        }
        let done: Vec<Pending> = done.into_iter().map(|(p, _)| p).collect();
        for p in &done {
            self.copied(p, origins.get(&p.expiry.source));
        }
        let ended = published.iter().chain(&done).filter_map(|p| {
            let o = origins.get(&p.expiry.source)?;
            Some((o.markers_partition, &p.expiry.source))
        });
        let (partitions, ends) = end_markers(&self.config.markers_topic, ended);
        // Every copy here is durable: its End may go. The next pass does not wait for it.
        self.ender.write(partitions, ends);
    }

    /// A copy of `p` is durable: how late it was, and its count.
    fn copied(&mut self, p: &Pending, origin: Option<&Origin>) {
        // A parked delivery's lag is not measured: its first try was when it was due.
        if let Some(o) = origin.filter(|o| o.taken_at_ms > 0) {
            let now = o.taken_at_ms as f64 / 1000.0 + o.taken_at.elapsed().as_secs_f64();
            self.metrics.emit(DeadlineLag {
                seconds: now - p.expiry.deadline_ms as f64 / 1000.0,
            });
        }
        self.refusals.remove(&p.expiry.source);
        self.count(p);
    }

    /// Keeps a delivery whose copy nobody accepted in flight, to try again later.
    fn park(&mut self, expiry: Expiry, origin: Origin, why: String) {
        let refusals = self.refusals.entry(expiry.source.clone()).or_insert(0);
        *refusals += 1;
        let wait = park_wait(*refusals, MAX_PARK);
        self.metrics.emit(DeliveryParked {
            source: &expiry.source,
            why: &why,
            retry_in: wait,
        });
        lock(&self.parked).push(Parked {
            expiry,
            markers_partition: origin.markers_partition,
            generation: origin.generation,
            retry_at: Instant::now() + wait,
        });
    }

    fn count(&self, p: &Pending) {
        match &p.action {
            Action::Redeliver { attempt } => {
                let cause = if p.expiry.cause == Cause::Nacked {
                    "nacked"
                } else {
                    "timeout"
                };
                self.metrics.emit(Redelivered {
                    source: &p.expiry.source,
                    cause,
                    attempt: *attempt,
                });
            }
            Action::Publish => self.metrics.emit(Published {
                id: &p.expiry.source,
                target: home_topic(p),
            }),
            Action::DeadLetter { reason, detail } => {
                let dlq = self.config.dlq_topic_for(home_topic(p));
                self.metrics.emit(DeadLettered {
                    source: &p.expiry.source,
                    attempt: p.expiry.attempt,
                    dlq: &dlq,
                    reason: *reason,
                    detail,
                });
            }
        }
    }
}
