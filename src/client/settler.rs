//! Writes markers for the client: shared by the poll thread (Starts) and every delivery handle
//! (KeepAlive, End, Nack, Reject). In format version 2 the settlements go through the
//! [`Coalescer`], which gathers them into one Settle marker per source partition and window.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use crate::kafka::producer::{DeliveryFuture, QuietProducer};
use rdkafka::error::KafkaError;
use rdkafka::producer::FutureRecord;

use crate::events::{Event, EventBus, EventKind};
use crate::marker::{encode, markers_partition, Marker, SourceRef};

use super::answer::Durable;
use super::coalesce::{Coalescer, Op};
use super::error::ClientError;

/// Writes markers to the markers partition of their source partition.
#[derive(Clone)]
pub(crate) struct MarkerWriter {
    producer: QuietProducer,
    markers_topic: String,
    markers_partitions: i32,
}

impl MarkerWriter {
    pub(crate) fn new(producer: QuietProducer, markers_topic: String, partitions: i32) -> Self {
        MarkerWriter {
            producer,
            markers_topic,
            markers_partitions: partitions,
        }
    }

    /// Queues a marker without waiting; the future resolves when it is durable.
    pub(crate) fn send(&self, marker: &Marker) -> Result<DeliveryFuture, KafkaError> {
        let payload = encode(marker);
        let partition = marker.source_partition().map_or(0, |(topic, partition)| {
            markers_partition(topic, partition, self.markers_partitions)
        });
        loop {
            let record = FutureRecord::<(), _>::to(&self.markers_topic)
                .partition(partition)
                .payload(&payload);
            match self.producer.send_result(record) {
                Ok(f) => return Ok(f),
                Err((e, _)) if is_queue_full(&e) => {
                    // librdkafka's queue is full: let the report thread drain it, as a poll
                    // here used to. Bounded by the delivery timeout.
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }
}

/// The markers writers and the count of unsettled deliveries.
pub(crate) struct Settler {
    /// Writes Starts, without linger: the handout waits for them.
    starts: MarkerWriter,
    /// Writes settlements. Each is queued only after its delivery's Start is durable, so two
    /// producers cannot put a settlement before its Start in the markers partition.
    writer: MarkerWriter,
    /// Gathers settlements into version 2 markers; `None` writes one version 1 marker each.
    coalescer: Option<Coalescer>,
    unsettled: AtomicUsize,
    /// Signalled when a delivery settles, for a poll thread waiting for room.
    room: (Mutex<()>, Condvar),
    /// The poll thread waits on `room`: only then is a settlement worth a notification.
    room_waiting: AtomicBool,
    /// Where deliveries and settlements are announced.
    pub(crate) events: EventBus,
    /// Records polled with a `kr-*` header out of its range (clamped or ignored).
    odd_headers: AtomicU64,
    /// Records started, not handed out for a rebalance's sake, and kept alive until the group
    /// settled (`lease.rs`).
    pub(crate) held_through_rebalances: AtomicU64,
    /// Deliveries whose deadline passed before the application took them: not handed out.
    pub(crate) expired_before_handout: AtomicU64,
    log_limit: crate::log_limit::LogLimit,
}

impl Settler {
    pub(crate) fn new(
        starts: MarkerWriter,
        writer: MarkerWriter,
        coalescer: Option<Coalescer>,
    ) -> Self {
        Settler {
            starts,
            writer,
            coalescer,
            unsettled: AtomicUsize::new(0),
            room: (Mutex::new(()), Condvar::new()),
            room_waiting: AtomicBool::new(false),
            events: EventBus::default(),
            odd_headers: AtomicU64::new(0),
            held_through_rebalances: AtomicU64::new(0),
            expired_before_handout: AtomicU64::new(0),
            log_limit: Default::default(),
        }
    }

    /// Counts a record of `topic` whose `kr-*` headers were out of range, and says so at most
    /// once per 10 s.
    pub(crate) fn odd_headers(&self, topic: &str, odd: &[(&'static str, String)]) {
        self.odd_headers.fetch_add(1, Ordering::Relaxed);
        if let Some(held_back) = self
            .log_limit
            .allow("odd_headers", std::time::Instant::now())
        {
            tracing::warn!(
                topic,
                headers = ?odd,
                held_back,
                "kr-* header out of its documented range: clamped or ignored (see the headers module)"
            );
        }
    }

    /// Counts a delivery of `source` whose deadline passed while it waited for the application,
    /// announces it, and says so at most once per 10 s.
    pub(crate) fn expired(&self, source: &SourceRef, attempt: u32) {
        self.expired_before_handout.fetch_add(1, Ordering::Relaxed);
        self.events
            .emit(|| Event::new(EventKind::Expired, source.clone(), attempt));
        if let Some(held_back) = self
            .log_limit
            .allow("expired_before_handout", std::time::Instant::now())
        {
            tracing::warn!(
                %source,
                held_back,
                "a delivery's timeout passed before the application took it: not handed out, \
                 the tracker redelivers it (the application takes deliveries more slowly than \
                 they time out: lower max_unsettled or max_batch, or raise the timeout)"
            );
        }
    }

    /// The source consumer returned an error; logged at most once per 10 s.
    pub(crate) fn consumer_error(&self, error: &rdkafka::error::KafkaError) {
        if let Some(held_back) = self
            .log_limit
            .allow("consumer_error", std::time::Instant::now())
        {
            tracing::warn!(%error, held_back, "consumer error");
        }
    }

    /// Records polled so far with a `kr-*` header out of range.
    pub(crate) fn odd_header_count(&self) -> u64 {
        self.odd_headers.load(Ordering::Relaxed)
    }

    /// Queues a marker without waiting (a Start: never coalesced); the future resolves when
    /// it is durable.
    pub(crate) fn send(&self, marker: &Marker) -> Result<DeliveryFuture, KafkaError> {
        self.starts.send(marker)
    }

    /// Queues the settlement `op` of `source` now (in version 2, gathered into the next
    /// Settle marker of its partition); the future resolves when it is durable. Not boxed: in
    /// version 2 an ack allocates nothing of its own (it shares its marker's answer).
    pub(crate) fn queue(&self, source: &SourceRef, op: Op) -> Queued {
        match &self.coalescer {
            Some(coalescer) => Queued::Gathered(coalescer.add(source, op)),
            None => {
                let marker = op.marker(source.clone());
                let sent = self.writer.send(&marker);
                if matches!(marker, Marker::End { .. }) {
                    crate::failpoint::hit("after-end-sent");
                }
                match sent {
                    Ok(sent) => Queued::Sent(sent),
                    Err(e) => Queued::Failed(Some(e)),
                }
            }
        }
    }

    /// Writes the settlement `op` of `source` and waits until it is durable.
    pub(crate) async fn settle(
        &self,
        source: &SourceRef,
        op: Op,
        name: &'static str,
    ) -> Result<(), ClientError> {
        self.queue(source, op)
            .await
            .map_err(|error| ClientError::Marker {
                marker: name,
                record: source.clone(),
                error,
            })
    }

    /// Writes the Ends of `sources` and waits until all are durable; returns how many went
    /// into markers that failed, and the first error. In version 2 they go to the coalescer
    /// under one lock, with one answer per Settle marker they land in; in version 1 each is a
    /// marker of its own, all on their way at once.
    pub(crate) async fn settle_ends(&self, sources: &[SourceRef]) -> (usize, Option<KafkaError>) {
        let answers: Vec<(Result<(), KafkaError>, usize)> = match &self.coalescer {
            Some(coalescer) => {
                let waiting = coalescer
                    .add_ends(sources)
                    .into_iter()
                    .map(|(answer, n)| async move { (answer.await, n) });
                futures::future::join_all(waiting).await
            }
            None => {
                let waiting = sources
                    .iter()
                    .map(|s| async move { (self.queue(s, Op::End).await, 1) });
                futures::future::join_all(waiting).await
            }
        };
        let mut failed = 0;
        let mut first = None;
        for (result, n) in answers {
            if let Err(e) = result {
                failed += n;
                first.get_or_insert(e);
            }
        }
        (failed, first)
    }

    /// Writes a settlement without waiting, logging a failure. Used where nobody can wait (a
    /// handle dropped unsettled); if it fails, the delivery still times out and is redelivered.
    pub(crate) fn settle_detached(&self, source: &SourceRef, op: Op) {
        let written = self.queue(source, op);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let source = source.clone();
            rt.spawn(async move {
                if let Err(e) = written.await {
                    tracing::warn!(error = %e, %source, "release marker failed; the delivery will time out instead");
                }
            });
        }
    }

    pub(crate) fn unsettled(&self) -> usize {
        self.unsettled.load(Ordering::Acquire)
    }

    pub(crate) fn handed_out(&self, deliveries: usize) {
        self.unsettled.fetch_add(deliveries, Ordering::AcqRel);
    }

    pub(crate) fn settled(&self) {
        self.unsettled.fetch_sub(1, Ordering::AcqRel);
        // A notification is a system call, every time: only when the poll thread waits.
        if self.room_waiting.load(Ordering::Acquire) {
            self.room.1.notify_one();
        }
    }

    /// Waits until a delivery settles or `limit` passes. The notification is not taken under
    /// the lock, so one can be missed; the short limit bounds what that costs.
    pub(crate) fn wait_for_room(&self, limit: Duration) {
        let Ok(guard) = self.room.0.lock() else {
            return;
        };
        self.room_waiting.store(true, Ordering::Release);
        let _ = self.room.1.wait_timeout(guard, limit);
        self.room_waiting.store(false, Ordering::Release);
    }
}

/// A settlement on its way: resolves once its marker is durable, or with why not. Named (not
/// an `async` block) so that [`Settlement`](super::settlement::Settlement) can hold it.
pub(crate) enum Queued {
    /// In the coalescer, waiting for the Settle marker it went into (format version 2).
    Gathered(Durable),
    /// A version 1 marker of its own, handed to the producer.
    Sent(DeliveryFuture),
    /// The producer refused it at once; the error until polled.
    Failed(Option<KafkaError>),
}

impl Future for Queued {
    type Output = Result<(), KafkaError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        // The waiters inside are `Unpin`.
        Poll::Ready(match self.get_mut() {
            Queued::Gathered(answer) => std::task::ready!(Pin::new(answer).poll(cx)),
            Queued::Sent(report) => durable_or_why(std::task::ready!(Pin::new(report).poll(cx))),
            Queued::Failed(error) => Err(error.take().unwrap_or(KafkaError::Canceled)),
        })
    }
}

/// A delivery report as "durable or why not".
pub(crate) async fn durable(sent: DeliveryFuture) -> Result<(), KafkaError> {
    durable_or_why(sent.await)
}

fn durable_or_why(
    report: Result<
        rdkafka::producer::future_producer::OwnedDeliveryResult,
        futures::channel::oneshot::Canceled,
    >,
) -> Result<(), KafkaError> {
    match report {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(e),
        Err(_) => Err(KafkaError::Canceled),
    }
}

fn is_queue_full(e: &rdkafka::error::KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
}
