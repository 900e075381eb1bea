//! Writes markers for the client: shared by the poll thread (Starts) and every delivery handle
//! (KeepAlive, End, Nack, Reject). In format version 2 the settlements go through the
//! [`Coalescer`], which gathers them into one Settle marker per source partition and window.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::FutureExt;
use rdkafka::error::KafkaError;
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::events::EventBus;
use crate::marker::{encode, markers_partition, Marker, SourceRef};

use super::coalesce::{Coalescer, Op, Written};
use super::error::ClientError;

/// Writes markers to the markers partition of their source partition.
#[derive(Clone)]
pub(crate) struct MarkerWriter {
    producer: FutureProducer,
    markers_topic: String,
    markers_partitions: i32,
}

impl MarkerWriter {
    pub(crate) fn new(producer: FutureProducer, markers_topic: String, partitions: i32) -> Self {
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
                    // librdkafka's queue is full: let it drain. Bounded by the delivery timeout.
                    self.producer
                        .poll(Timeout::After(Duration::from_millis(10)));
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// Queues a marker; the result, shareable among waiters, resolves when it is durable.
    pub(crate) fn write(&self, marker: &Marker) -> Written {
        match self.send(marker) {
            Ok(future) => durable(future).boxed().shared(),
            Err(e) => futures::future::ready(Err(e)).boxed().shared(),
        }
    }
}

/// The markers writer and the count of unsettled deliveries.
pub(crate) struct Settler {
    writer: MarkerWriter,
    /// Gathers settlements into version 2 markers; `None` writes one version 1 marker each.
    coalescer: Option<Coalescer>,
    unsettled: AtomicUsize,
    /// Signalled when a delivery settles, for a poll thread waiting for room.
    room: (Mutex<()>, Condvar),
    /// Where deliveries and settlements are announced.
    pub(crate) events: EventBus,
    /// Records polled with a `kr-*` header out of its range (clamped or ignored).
    odd_headers: AtomicU64,
    log_limit: crate::log_limit::LogLimit,
}

impl Settler {
    pub(crate) fn new(writer: MarkerWriter, coalescer: Option<Coalescer>) -> Self {
        Settler {
            writer,
            coalescer,
            unsettled: AtomicUsize::new(0),
            room: (Mutex::new(()), Condvar::new()),
            events: EventBus::default(),
            odd_headers: AtomicU64::new(0),
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
        self.writer.send(marker)
    }

    /// Queues a marker, or in version 2 gathers the settlement it stands for, and returns
    /// the write to wait for.
    fn queue(&self, marker: &Marker) -> BoxFuture<'static, Result<(), KafkaError>> {
        match (&self.coalescer, Op::of(marker)) {
            (Some(coalescer), Some((source, op))) => {
                let gathered = coalescer.add(source, op);
                async move {
                    match gathered.await {
                        Ok(written) => written.await,
                        Err(_) => Err(KafkaError::Canceled),
                    }
                }
                .boxed()
            }
            _ => {
                // One waiter: the plain delivery future, without the shared wrapper.
                let sent = self.writer.send(marker);
                if matches!(marker, Marker::End { .. }) {
                    crate::failpoint::hit("after-end-sent");
                }
                async move { durable(sent?).await }.boxed()
            }
        }
    }

    /// Writes a marker (in version 2, the settlement it stands for) and waits until it is
    /// durable.
    pub(crate) async fn write(
        &self,
        marker: &Marker,
        name: &'static str,
    ) -> Result<(), ClientError> {
        self.queue(marker)
            .await
            .map_err(|error| ClientError::Marker {
                marker: name,
                record: marker
                    .source()
                    .cloned()
                    .unwrap_or_else(|| SourceRef::new("", 0, 0)),
                error,
            })
    }

    /// Writes a marker without waiting, logging a failure. Used where nobody can wait (a
    /// handle dropped unsettled); if it fails, the delivery still times out and is redelivered.
    pub(crate) fn write_detached(&self, marker: Marker) {
        let written = self.queue(&marker);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(async move {
                if let Err(e) = written.await {
                    tracing::warn!(error = %e, ?marker, "release marker failed; the delivery will time out instead");
                }
            });
        }
    }

    pub(crate) fn unsettled(&self) -> usize {
        self.unsettled.load(Ordering::Acquire)
    }

    pub(crate) fn handed_out(&self) {
        self.unsettled.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn settled(&self) {
        self.unsettled.fetch_sub(1, Ordering::AcqRel);
        self.room.1.notify_one();
    }

    /// Waits until a delivery settles or `limit` passes. The notification is not taken under
    /// the lock, so one can be missed; the short limit bounds what that costs.
    pub(crate) fn wait_for_room(&self, limit: Duration) {
        let Ok(guard) = self.room.0.lock() else {
            return;
        };
        let _ = self.room.1.wait_timeout(guard, limit);
    }
}

/// A delivery report as "durable or why not".
async fn durable(sent: DeliveryFuture) -> Result<(), KafkaError> {
    match sent.await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err((e, _))) => Err(e),
        Err(_) => Err(KafkaError::Canceled),
    }
}

fn is_queue_full(e: &rdkafka::error::KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
}
