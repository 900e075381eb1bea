//! Gathers settlements into version 2 Settle markers: one marker per source partition per
//! window instead of one per record.
//!
//! `ack()` still returns only once its End is durable: each settlement waits for the answer of
//! the very marker it went into (`answer.rs`), given when the broker acknowledges that marker
//! (one task per marker waits for that and answers every settlement in it). A window opens
//! with the first settlement after a flush and closes after
//! [`ConsumerConfig::settle_window`](super::ConsumerConfig) or as soon as one partition has
//! gathered `max_records`, whichever comes first. One thread does the flushing, so no
//! application task waits for the window on its own.
//!
//! Per settlement this costs a lock, a push, and a reference to its marker's answer with a
//! place in its list of wakers. The profile of the client (BENCHMARKS.md, "Client cost per
//! record") showed a general-purpose shared future per marker costing more than the marker
//! itself, and later a one-shot channel per settlement costing an allocation each ("One
//! answer per Settle marker").

use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::runtime::Handle;

use crate::failpoint;
use crate::marker::{Marker, Offsets, Settle, SourceRef, MAX_BATCH_RECORDS};

use super::answer::{Answering, Durable};
use super::settler::{durable, MarkerWriter};

/// Most bytes of reject reasons one Settle carries before it is written without waiting for
/// the window: far below the 1 MB a markers topic accepts by default, however many records
/// are rejected at once with long reasons.
const MAX_REASON_BYTES_PER_MARKER: usize = 256 * 1024;

/// Settlements one partition's gathering makes room for up front.
const GATHER_CAPACITY: usize = 512;

/// One settlement, as a version 1 marker would carry it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Op {
    End,
    Nack(u64),
    Reject(String),
    KeepAlive(u32),
}

impl Op {
    /// The version 1 marker of this settlement of `source`.
    pub(crate) fn marker(self, source: SourceRef) -> Marker {
        match self {
            Op::End => Marker::End { source },
            Op::Nack(delay_ms) => Marker::Nack { source, delay_ms },
            Op::Reject(reason) => Marker::Reject { source, reason },
            Op::KeepAlive(timeout_ms) => Marker::KeepAlive { source, timeout_ms },
        }
    }
}

/// Settlements of one source partition waiting for the window to close.
struct Gathered {
    /// The poll thread's own name for the topic, so the usual match is a pointer compare.
    topic: Arc<str>,
    partition: i32,
    ends: Vec<i64>,
    settle: Settle,
    count: usize,
    reason_bytes: usize,
    answer: Answering,
}

impl Gathered {
    fn new(source: &SourceRef, max_records: usize) -> Self {
        // Sized for a full marker at once: growing these vectors one push at a time showed in
        // the profile.
        let room = max_records.min(GATHER_CAPACITY);
        Gathered {
            topic: source.topic.clone(),
            partition: source.partition,
            ends: Vec::with_capacity(room),
            settle: Settle::new(source.topic.to_string(), source.partition),
            count: 0,
            reason_bytes: 0,
            answer: Answering::new(room),
        }
    }

    fn is_full(&self, max_records: usize) -> bool {
        self.count >= max_records || self.reason_bytes >= MAX_REASON_BYTES_PER_MARKER
    }

    /// Whether a settlement of `source` may go into this gathering.
    fn holds(&self, source: &SourceRef, max_records: usize) -> bool {
        self.partition == source.partition
            && !self.is_full(max_records)
            && (Arc::ptr_eq(&self.topic, &source.topic) || self.topic == source.topic)
    }

    /// Adds the settlement `op` of `offset`; whether the gathering is now full.
    fn push(&mut self, offset: i64, op: Op, max_records: usize) -> bool {
        match op {
            Op::End => self.ends.push(offset),
            Op::Nack(delay) => self.settle.nacks.push((offset, delay)),
            Op::Reject(reason) => {
                self.reason_bytes += reason.len().min(crate::marker::MAX_REASON_BYTES);
                self.settle.rejects.push((offset, reason));
            }
            Op::KeepAlive(timeout) => self.settle.keep_alives.push((offset, timeout)),
        }
        self.count += 1;
        self.is_full(max_records)
    }

    fn into_marker(self) -> (Marker, bool, Answering) {
        let mut settle = self.settle;
        let has_end = !self.ends.is_empty();
        settle.ends = Offsets::collect(self.ends);
        (Marker::Settle(Box::new(settle)), has_end, self.answer)
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
    /// Starts the flushing thread, which writes through `writer`; the tasks that wait for
    /// each marker's delivery report run on `runtime`.
    pub(crate) fn start(
        window: Duration,
        max_records: usize,
        writer: MarkerWriter,
        runtime: Handle,
    ) -> std::io::Result<Self> {
        let inner = Arc::new(Inner {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
        });
        let flusher = inner.clone();
        let thread = std::thread::Builder::new()
            .name("redelivery-settle".into())
            .spawn(move || flush_loop(&flusher, window, &writer, &runtime))?;
        Ok(Coalescer {
            inner,
            max_records: max_records.clamp(1, MAX_BATCH_RECORDS),
            thread: Mutex::new(Some(thread)),
        })
    }

    /// Adds a settlement to the next Settle marker of its source partition. The waiter
    /// answers once that marker is durable (or failed); it is cancelled if the consumer
    /// closes first.
    pub(crate) fn add(&self, source: &SourceRef, op: Op) -> Durable {
        let mut p = self.inner.lock();
        if p.closed {
            return Durable::cancelled();
        }
        let i = gathering(&mut p.gathered, source, self.max_records);
        let full = p.gathered[i].push(source.offset, op, self.max_records);
        let waiter = p.gathered[i].answer.waiter();
        self.opened(&mut p, full);
        waiter
    }

    /// Adds the Ends of `sources` under one lock, with one answer per marker they go into
    /// (not one per record), each with how many of the Ends it answers for: what
    /// [`Delivery::ack_many`](super::Delivery::ack_many) waits for.
    pub(crate) fn add_ends(&self, sources: &[SourceRef]) -> Vec<(Durable, usize)> {
        let mut answers: Vec<(Durable, usize)> = Vec::new();
        let mut p = self.inner.lock();
        if p.closed {
            return vec![(Durable::cancelled(), sources.len())];
        }
        // The gatherings this batch has an answer in; they are only appended to while the
        // lock is held, so their positions stay put.
        let mut answered: Vec<usize> = Vec::new();
        let mut full = false;
        let mut last: Option<usize> = None;
        for source in sources {
            // A batch comes partition by partition: the last gathering usually fits.
            let i = match last {
                Some(i) if p.gathered[i].holds(source, self.max_records) => i,
                _ => gathering(&mut p.gathered, source, self.max_records),
            };
            last = Some(i);
            full |= p.gathered[i].push(source.offset, Op::End, self.max_records);
            match answered.iter().position(|&a| a == i) {
                Some(k) => answers[k].1 += 1,
                None => {
                    answered.push(i);
                    answers.push((p.gathered[i].answer.waiter(), 1));
                }
            }
        }
        if !sources.is_empty() {
            self.opened(&mut p, full);
        }
        answers
    }

    /// Opens the window if this is its first settlement, and wakes the flushing thread for
    /// that or for a gathering that is `full`.
    fn opened(&self, p: &mut Pending, full: bool) {
        let opening = p.opened.is_none();
        if opening {
            p.opened = Some(Instant::now());
        }
        p.full |= full;
        if opening || full {
            self.inner.wake.notify_one();
        }
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

/// The position of the gathering a settlement of `source` goes into, opened if there is none.
fn gathering(gathered: &mut Vec<Gathered>, source: &SourceRef, max_records: usize) -> usize {
    gathered
        .iter()
        .position(|g| g.holds(source, max_records))
        .unwrap_or_else(|| {
            gathered.push(Gathered::new(source, max_records));
            gathered.len() - 1
        })
}

/// Waits for a window to open and close, then writes one marker per gathered partition.
fn flush_loop(inner: &Inner, window: Duration, writer: &MarkerWriter, runtime: &Handle) {
    while let Some(gathered) = next_window(inner, window) {
        for g in gathered {
            let (marker, has_end, answer) = g.into_marker();
            let sent = writer.send(&marker);
            if has_end {
                failpoint::hit("after-end-sent");
            }
            match sent {
                // One task per marker waits for its delivery report and answers everyone in it.
                Ok(report) => {
                    runtime.spawn(async move { answer.send(durable(report).await) });
                }
                Err(e) => answer.send(Err(e)),
            }
        }
    }
}

/// Blocks until a window has opened and closed (or the coalescer closed with settlements
/// left) and takes what it gathered; `None` once closed with nothing left.
fn next_window(inner: &Inner, window: Duration) -> Option<Vec<Gathered>> {
    let mut p = inner.lock();
    loop {
        if p.gathered.is_empty() {
            if p.closed {
                return None;
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
    Some(std::mem::take(&mut p.gathered))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::Message;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;

    /// Settlements of two partitions, on librdkafka's mock cluster: each waiter resolves once
    /// its marker is written, and the markers name every settlement exactly once, split at the
    /// record limit and never mixing partitions.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn settlements_become_few_markers_and_every_waiter_hears_of_its_own() {
        let (_mock, brokers, c) = coalescer_on_a_mock();
        let mut waiting = Vec::new();
        for offset in 0..5 {
            waiting.push(c.add(&SourceRef::new("t", 0, offset), Op::End));
        }
        waiting.push(c.add(&SourceRef::new("t", 1, 7), Op::Nack(9)));
        waiting.push(c.add(&SourceRef::new("t", 1, 8), Op::Reject("no".into())));
        for w in waiting {
            w.await.expect("durable");
        }

        let settles = read_settles(&brokers, 3);
        let mut ends: Vec<(i32, Vec<i64>)> = settles
            .iter()
            .filter(|s| !s.ends.is_empty())
            .map(|s| (s.partition, s.ends.iter().collect()))
            .collect();
        ends.sort();
        assert_eq!(ends, vec![(0, vec![0, 1, 2]), (0, vec![3, 4])]);
        let other: Vec<_> = settles.iter().filter(|s| s.partition == 1).collect();
        assert_eq!(other.len(), 1);
        assert_eq!(other[0].nacks, vec![(7, 9)]);
        assert_eq!(other[0].rejects, vec![(8, "no".to_string())]);
        c.close();
        assert!(
            c.add(&SourceRef::new("t", 0, 9), Op::End).await.is_err(),
            "after close a settlement is cancelled, not lost in silence"
        );
    }

    /// A coalescer (20 ms window, 3 records a marker) writing to topic `m` of a mock cluster,
    /// which lives as long as the first value.
    fn coalescer_on_a_mock() -> (
        MockCluster<'static, DefaultProducerContext>,
        String,
        Coalescer,
    ) {
        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("m", 1, 1).unwrap();
        let brokers = mock.bootstrap_servers();
        let producer = crate::kafka::client_config(&brokers, &[], &[])
            .create()
            .unwrap();
        let writer = MarkerWriter::new(producer, "m".into(), 1);
        let c = Coalescer::start(Duration::from_millis(20), 3, writer, Handle::current()).unwrap();
        (mock, brokers, c)
    }

    /// The first `n` Settle markers of topic `m`.
    fn read_settles(brokers: &str, n: usize) -> Vec<Settle> {
        let consumer: BaseConsumer = crate::kafka::client_config(
            brokers,
            &[("group.id", "g"), ("auto.offset.reset", "earliest")],
            &[],
        )
        .create()
        .unwrap();
        consumer.subscribe(&["m"]).unwrap();
        let mut settles = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while settles.len() < n && Instant::now() < deadline {
            if let Some(Ok(m)) = consumer.poll(Duration::from_millis(100)) {
                match crate::marker::decode(m.payload().unwrap()).unwrap() {
                    Marker::Settle(s) => settles.push(*s),
                    other => panic!("not a Settle: {other:?}"),
                }
            }
        }
        settles
    }

    /// Ends added together (`ack_many`): one answer per marker they land in, each counting
    /// its records, and the markers name every End once, split at the record limit.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ends_added_together_get_one_answer_per_marker() {
        let (_mock, brokers, c) = coalescer_on_a_mock();
        let sources: Vec<SourceRef> = (0..5)
            .map(|o| SourceRef::new("t", 0, o))
            .chain([SourceRef::new("t", 1, 7)])
            .collect();
        let answers = c.add_ends(&sources);
        let counts: Vec<usize> = answers.iter().map(|(_, n)| *n).collect();
        assert_eq!(
            counts,
            [3, 2, 1],
            "offsets 0-2 fill a marker; 3-4 and 7 go into others"
        );
        for (rx, _) in answers {
            rx.await.expect("durable");
        }
        let mut ends: Vec<(i32, Vec<i64>)> = read_settles(&brokers, 3)
            .iter()
            .map(|s| (s.partition, s.ends.iter().collect()))
            .collect();
        ends.sort();
        assert_eq!(
            ends,
            vec![(0, vec![0, 1, 2]), (0, vec![3, 4]), (1, vec![7])]
        );
        c.close();
        let after = c.add_ends(&sources[..2]);
        assert_eq!(after.len(), 1);
        let (rx, n) = after.into_iter().next().unwrap();
        assert_eq!(n, 2);
        assert!(
            rx.await.is_err(),
            "after close the Ends are cancelled, not lost in silence"
        );
    }

    #[test]
    fn each_op_becomes_its_version_1_marker() {
        let s = SourceRef::new("t", 1, 2);
        assert_eq!(Op::End.marker(s.clone()), Marker::End { source: s.clone() });
        assert_eq!(
            Op::Nack(5).marker(s.clone()),
            Marker::Nack {
                source: s.clone(),
                delay_ms: 5
            }
        );
        assert_eq!(
            Op::Reject("r".into()).marker(s.clone()),
            Marker::Reject {
                source: s.clone(),
                reason: "r".into()
            }
        );
        assert_eq!(
            Op::KeepAlive(7).marker(s.clone()),
            Marker::KeepAlive {
                source: s,
                timeout_ms: 7
            }
        );
    }
}
