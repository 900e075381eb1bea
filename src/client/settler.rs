//! Writes markers for the client: shared by the poll thread (Starts) and every delivery handle
//! (KeepAlive, End, Nack, Reject).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::util::Timeout;

use crate::events::EventBus;
use crate::marker::{encode, markers_partition, Marker, SourceRef};

use super::error::ClientError;

/// The markers producer and the count of unsettled deliveries.
pub(crate) struct Settler {
    producer: FutureProducer,
    markers_topic: String,
    markers_partitions: i32,
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
    pub(crate) fn new(
        producer: FutureProducer,
        markers_topic: String,
        markers_partitions: i32,
    ) -> Self {
        Settler {
            producer,
            markers_topic,
            markers_partitions,
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

    /// Queues a marker without waiting; the future resolves when it is durable.
    pub(crate) fn send(
        &self,
        marker: &Marker,
    ) -> Result<DeliveryFuture, rdkafka::error::KafkaError> {
        let payload = encode(marker);
        let partition = marker.source().map_or(0, |s| {
            markers_partition(&s.topic, s.partition, self.markers_partitions)
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

    /// Writes a marker and waits until it is durable.
    pub(crate) async fn write(
        &self,
        marker: &Marker,
        name: &'static str,
    ) -> Result<(), ClientError> {
        let error = |error| ClientError::Marker {
            marker: name,
            record: marker
                .source()
                .cloned()
                .unwrap_or_else(|| SourceRef::new("", 0, 0)),
            error,
        };
        let future = self.send(marker).map_err(error)?;
        if name == "end" {
            crate::failpoint::hit("after-end-sent");
        }
        match future.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(error(e)),
            Err(_) => Err(error(rdkafka::error::KafkaError::Canceled)),
        }
    }

    /// Writes a marker without waiting, logging a failure. Used where nobody can wait (a
    /// handle dropped unsettled); if it fails, the delivery still times out and is redelivered.
    pub(crate) fn write_detached(&self, marker: Marker) {
        match self.send(&marker) {
            Ok(future) => {
                if let Ok(rt) = tokio::runtime::Handle::try_current() {
                    rt.spawn(async move {
                        if let Ok(Err((e, _))) = future.await {
                            tracing::warn!(error = %e, ?marker, "release marker failed; the delivery will time out instead");
                        }
                    });
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, ?marker, "release marker failed; the delivery will time out instead")
            }
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

fn is_queue_full(e: &rdkafka::error::KafkaError) -> bool {
    e.rdkafka_error_code() == Some(rdkafka::types::RDKafkaErrorCode::QueueFull)
}
