//! Gathers settlements into version 2 Settle markers: one marker per source partition per
//! window instead of one per record.
//!
//! `ack()` still returns only once its End is durable: each caller gets a handle on the write
//! of the very marker its settlement went into. A window opens with the first settlement after
//! a flush and closes after [`ConsumerConfig::settle_window`](super::ConsumerConfig) or as soon
//! as one partition has gathered `max_records`, whichever comes first. One thread does the
//! flushing, so no application task waits for the window on its own.

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use futures::channel::oneshot;
use futures::future::{BoxFuture, Shared};
use rdkafka::error::KafkaError;

use crate::failpoint;
use crate::marker::{Marker, Offsets, Settle, SourceRef, MAX_BATCH_RECORDS};

use super::settler::MarkerWriter;

/// The durable write of one Settle marker, awaited by every settlement in it.
pub(crate) type Written = Shared<BoxFuture<'static, Result<(), KafkaError>>>;

/// One settlement, as a version 1 marker would carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    End,
    Nack(u64),
    Reject(String),
    KeepAlive(u32),
}

impl Op {
    /// The settlement a version 1 settlement marker stands for; `None` for Start, Schedule,
    /// Tick and the version 2 markers.
    pub(crate) fn of(marker: &Marker) -> Option<(&SourceRef, Op)> {
        Some(match marker {
            Marker::End { source } => (source, Op::End),
            Marker::Nack { source, delay_ms } => (source, Op::Nack(*delay_ms)),
            Marker::Reject { source, reason } => (source, Op::Reject(reason.clone())),
            Marker::KeepAlive { source, timeout_ms } => (source, Op::KeepAlive(*timeout_ms)),
            _ => return None,
        })
    }
}

/// Settlements of one source partition waiting for the window to close.
struct Gathered {
    topic: String,
    partition: i32,
    ends: Vec<i64>,
    settle: Settle,
    count: usize,
    waiters: Vec<oneshot::Sender<Written>>,
}

impl Gathered {
    fn into_marker(self) -> (Marker, bool, Vec<oneshot::Sender<Written>>) {
        let mut settle = self.settle;
        let has_end = !self.ends.is_empty();
        settle.ends = Offsets::collect(self.ends);
        (Marker::Settle(Box::new(settle)), has_end, self.waiters)
    }
}

#[derive(Default)]
struct Pending {
    /// Few partitions settle within one window, so a list beats a map here.
    gathered: Vec<Gathered>,
    opened: Option<Instant>,
    /// Some partition reached the record limit: flush without waiting for the window.
    full: bool,
    closed: bool,
}

struct Inner {
    pending: Mutex<Pending>,
    wake: Condvar,
}

impl Inner {
    fn lock(&self) -> MutexGuard<'_, Pending> {
        // Nothing here can panic while holding the lock; if it ever did, the data is still a
        // list of settlements, so carry on with it.
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The gathering side, shared by every delivery of a consumer; its thread does the writing.
pub(crate) struct Coalescer {
    inner: Arc<Inner>,
    max_records: usize,
    thread: Mutex<Option<JoinHandle<()>>>,
}

impl Coalescer {
    /// Starts the flushing thread, which writes through `writer`.
    pub(crate) fn start(
        window: Duration,
        max_records: usize,
        writer: MarkerWriter,
    ) -> std::io::Result<Self> {
        let inner = Arc::new(Inner {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
        });
        let flusher = inner.clone();
        let thread = std::thread::Builder::new()
            .name("redelivery-settle".into())
            .spawn(move || flush_loop(&flusher, window, &writer))?;
        Ok(Coalescer {
            inner,
            max_records: max_records.clamp(1, MAX_BATCH_RECORDS),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Adds a settlement to the next Settle marker of its source partition. The receiver
    /// yields that marker's write; it is cancelled if the consumer closes first.
    pub(crate) fn add(&self, source: &SourceRef, op: Op) -> oneshot::Receiver<Written> {
        let (tx, rx) = oneshot::channel();
        let mut p = self.inner.lock();
        if p.closed {
            return rx;
        }
        let max = self.max_records;
        let at = p.gathered.iter().position(|g| {
            g.partition == source.partition && g.count < max && g.topic == source.topic
        });
        let i = at.unwrap_or_else(|| {
            p.gathered.push(Gathered {
                topic: source.topic.clone(),
                partition: source.partition,
                ends: Vec::new(),
                settle: Settle::new(source.topic.clone(), source.partition),
                count: 0,
                waiters: Vec::new(),
            });
            p.gathered.len() - 1
        });
        let g = &mut p.gathered[i];
        let offset = source.offset;
        match op {
            Op::End => g.ends.push(offset),
            Op::Nack(delay) => g.settle.nacks.push((offset, delay)),
            Op::Reject(reason) => g.settle.rejects.push((offset, reason)),
            Op::KeepAlive(timeout) => g.settle.keep_alives.push((offset, timeout)),
        }
        g.count += 1;
        g.waiters.push(tx);
        let full = g.count >= max;
        let opening = p.opened.is_none();
        if opening {
            p.opened = Some(Instant::now());
        }
        p.full |= full;
        if opening || full {
            self.inner.wake.notify_one();
        }
        rx
    }

    /// Writes what is gathered and stops the thread. Settlements added later are cancelled.
    pub(crate) fn close(&self) {
        self.inner.lock().closed = true;
        self.inner.wake.notify_one();
        let thread = self.thread.lock().ok().and_then(|mut t| t.take());
        if let Some(thread) = thread {
            if thread.join().is_err() {
                tracing::error!("the settle thread panicked; unsettled deliveries time out");
            }
        }
    }
}

impl Drop for Coalescer {
    fn drop(&mut self) {
        self.close();
    }
}

/// Waits for a window to open and close, then writes one marker per gathered partition.
fn flush_loop(inner: &Inner, window: Duration, writer: &MarkerWriter) {
    loop {
        let gathered = {
            let mut p = inner.lock();
            loop {
                if p.gathered.is_empty() {
                    if p.closed {
                        return;
                    }
                    p.opened = None;
                    p = inner.wake.wait(p).unwrap_or_else(|e| e.into_inner());
                    continue;
                }
                let left = window.saturating_sub(p.opened.map_or(window, |t| t.elapsed()));
                if p.full || p.closed || left.is_zero() {
                    break;
                }
                p = inner
                    .wake
                    .wait_timeout(p, left)
                    .map(|(p, _)| p)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            p.opened = None;
            p.full = false;
            std::mem::take(&mut p.gathered)
        };
        for g in gathered {
            let (marker, has_end, waiters) = g.into_marker();
            let written = writer.write(&marker);
            if has_end {
                failpoint::hit("after-end-sent");
            }
            for w in waiters {
                // A waiter that gave up (its task was dropped) no longer cares.
                let _ = w.send(written.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_of_covers_the_settlements_and_nothing_else() {
        let s = SourceRef::new("t", 1, 2);
        let end = Marker::End { source: s.clone() };
        assert_eq!(Op::of(&end).map(|o| o.1), Some(Op::End));
        let tick = Marker::Tick { nonce: 1 };
        assert!(Op::of(&tick).is_none());
    }
}
