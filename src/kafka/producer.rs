//! A producer whose delivery reports are served by a thread that sleeps while there are none.
//!
//! Why not rust-rdkafka's `FutureProducer`: its "producer polling thread" loops on a 100 ms
//! poll, and rust-rdkafka passes librdkafka the time left in whole milliseconds, truncated.
//! After librdkafka's 99 ms wait, the fraction of a millisecond that is left is polled with a
//! timeout of 0, again and again, until it has passed. Every idle producer so spins about 1 %
//! of a core: measured from `/proc` per thread, an idle worker of `examples/worker` spent 30 of
//! its 33 ticks per 20 s in its two producer threads, and each producer added to an idle
//! tracker's ticks (BENCHMARKS.md, "Copies over more than one connection"; with this
//! producer, 1–2 ticks for either: "Producers that sleep while idle").
//!
//! Here librdkafka itself says when there is something to serve: its main queue writes a byte
//! to a socket when it gets an event after the last poll (`rd_kafka_queue_io_event_enable`).
//! The thread blocks on that socket, serves what the queue holds with polls that do not wait,
//! and blocks again. The reports, and so every `ack()`, resolve as soon as before.
//!
//! One of the three places this crate uses `unsafe` (with `headers/raw.rs` and
//! `tracker/memory.rs`): four librdkafka queue calls rust-rdkafka does not wrap.
#![allow(unsafe_code)]

use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use futures::channel::oneshot;
use rdkafka::bindings as rd;
use rdkafka::client::{Client, ClientContext};
use rdkafka::config::FromClientConfig;
use rdkafka::error::{KafkaError, KafkaResult, RDKafkaErrorCode};
use rdkafka::message::{Message, ToBytes};
use rdkafka::producer::future_producer::{Delivery, OwnedDeliveryResult};
use rdkafka::producer::{BaseProducer, BaseRecord, DeliveryResult, FutureRecord, Producer};
use rdkafka::producer::{NoCustomPartitioner, ProducerContext};
use rdkafka::ClientConfig;

/// Resolves with the record's delivery report, or `Canceled` if the producer went away first.
/// The same output as rust-rdkafka's `DeliveryFuture`, so callers read it the same way.
pub(crate) type DeliveryFuture = oneshot::Receiver<OwnedDeliveryResult>;

/// How long the serving thread sleeps when librdkafka has said nothing. Only a safety net (and
/// the longest a stop waits if its wake-up byte were lost): every event wakes it at once.
const IDLE_WAIT: Duration = Duration::from_secs(1);

/// A producer that returns a future per record, like rust-rdkafka's `FutureProducer`, without
/// its idle spin. Cheap to clone: the clones share one librdkafka producer and one thread.
#[derive(Clone)]
pub(crate) struct QuietProducer {
    inner: Arc<Inner>,
}

impl FromClientConfig for QuietProducer {
    fn from_config(config: &ClientConfig) -> KafkaResult<Self> {
        QuietProducer::new(config, IDLE_WAIT)
    }
}

impl QuietProducer {
    /// `idle_wait` is [`IDLE_WAIT`] but in tests, which set it to hours to show that nothing
    /// waits on it.
    fn new(config: &ClientConfig, idle_wait: Duration) -> KafkaResult<Self> {
        let base: BaseProducer<Reports> = config.create_with_context(Reports)?;
        let base = Arc::new(base);
        let queue = MainQueue::of(base.client())
            .map(Arc::new)
            .ok_or_else(|| creation("librdkafka gave no main queue"))?;
        let (ours, theirs) = UnixStream::pair().map_err(|e| creation(&e.to_string()))?;
        ours.set_read_timeout(Some(idle_wait))
            .map_err(|e| creation(&e.to_string()))?;
        let stop = Arc::new(AtomicBool::new(false));
        queue.wake_on(&theirs);
        let spawned = {
            let (base, queue, stop) = (base.clone(), queue.clone(), stop.clone());
            std::thread::Builder::new()
                .name("producer reports".into())
                .spawn(move || serve(&base, &queue, ours, &stop, idle_wait))
        };
        let serving = spawned.map_err(|e| {
            // The socket closes on return; librdkafka must not write to its number after.
            queue.quiet();
            creation(&e.to_string())
        })?;
        Ok(QuietProducer {
            inner: Arc::new(Inner {
                serving: Mutex::new(Some(serving)),
                stop,
                wake: theirs,
                queue,
                base,
            }),
        })
    }

    /// Hands the record to librdkafka. The future resolves with its delivery report; if
    /// librdkafka refuses the record at once (its queue full, say), the record comes back.
    #[allow(clippy::result_large_err)] // the record, returned as rust-rdkafka does
    pub(crate) fn send_result<'a, K, P>(
        &self,
        record: FutureRecord<'a, K, P>,
    ) -> Result<DeliveryFuture, (KafkaError, FutureRecord<'a, K, P>)>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let (tx, rx) = oneshot::channel();
        let record = BaseRecord {
            topic: record.topic,
            partition: record.partition,
            payload: record.payload,
            key: record.key,
            timestamp: record.timestamp,
            headers: record.headers,
            delivery_opaque: Box::new(tx),
        };
        match self.inner.base.send(record) {
            Ok(()) => Ok(rx),
            Err((e, back)) => Err((
                e,
                FutureRecord {
                    topic: back.topic,
                    partition: back.partition,
                    payload: back.payload,
                    key: back.key,
                    timestamp: back.timestamp,
                    headers: back.headers,
                },
            )),
        }
    }

    /// Sends the record and waits for its delivery. While librdkafka's queue is full, tries
    /// again for up to `queue_timeout`.
    pub(crate) async fn send<K, P>(
        &self,
        mut record: FutureRecord<'_, K, P>,
        queue_timeout: Duration,
    ) -> Result<Delivery, KafkaError>
    where
        K: ToBytes + ?Sized,
        P: ToBytes + ?Sized,
    {
        let give_up = tokio::time::Instant::now() + queue_timeout;
        loop {
            match self.send_result(record) {
                Ok(report) => {
                    return match report.await {
                        Ok(Ok(delivery)) => Ok(delivery),
                        Ok(Err((e, _))) => Err(e),
                        Err(_) => Err(KafkaError::Canceled),
                    }
                }
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), back))
                    if tokio::time::Instant::now() < give_up =>
                {
                    record = back;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                Err((e, _)) => return Err(e),
            }
        }
    }

    /// The librdkafka client, for metadata.
    pub(crate) fn client(&self) -> &Client<Reports> {
        self.inner.base.client()
    }
}

fn creation(why: &str) -> KafkaError {
    KafkaError::ClientCreation(format!("starting the producer's report thread: {why}"))
}

/// What the clones share. Dropped with the last clone: the thread stops first, then the
/// queue handle, then the producer (which purges and reports what it still held).
struct Inner {
    serving: Mutex<Option<JoinHandle<()>>>,
    stop: Arc<AtomicBool>,
    /// The end librdkafka writes its wake-up byte to; a stop writes one too.
    wake: UnixStream,
    queue: Arc<MainQueue>,
    base: Arc<BaseProducer<Reports>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // librdkafka stops writing first: a byte to a socket whose reader has gone would raise
        // SIGPIPE in a process that does not ignore it. The stop's own byte wakes the thread.
        self.queue.quiet();
        let _ = (&self.wake).write(&[1]);
        let serving = match self.serving.get_mut() {
            Ok(serving) => serving.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(serving) = serving {
            if serving.join().is_err() {
                tracing::error!("the producer's report thread panicked");
            }
        }
    }
}

/// The thread: serve events until the queue is empty, then sleep until librdkafka writes that
/// it has another. librdkafka writes only when the queue goes from empty to not empty (and
/// once per stretch without a poll; every poll re-arms it), so the thread must not sleep while
/// the queue holds anything: an event that arrived during the serving would wait for the idle
/// timeout. Serving a count taken beforehand did exactly that (a 990 ms p99 in the latency
/// benchmark; `reports_that_arrive_while_serving_are_served`).
fn serve(
    base: &BaseProducer<Reports>,
    queue: &MainQueue,
    mut wake: UnixStream,
    stop: &AtomicBool,
    idle_wait: Duration,
) {
    let mut bytes = [0u8; 64];
    loop {
        // Each poll that does not wait takes one event off the queue (a report covers many
        // records), so this ends as soon as librdkafka stops adding.
        while queue.len() > 0 {
            base.poll(Duration::ZERO);
        }
        if stop.load(Ordering::Acquire) {
            return;
        }
        match wake.read(&mut bytes) {
            Ok(n) if n > 0 => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            failed => {
                // Neither an error nor the end of the stream (`Ok(0)`, which would otherwise
                // return at once, again and again) can happen while `Inner` holds the other
                // end; if one does, the thread still serves reports, a safety-net sleep apart.
                tracing::warn!(read = ?failed, "the producer's wake-up socket failed");
                std::thread::sleep(idle_wait);
            }
        }
    }
}

/// The producer's context: completes each record's future with its delivery report.
pub(crate) struct Reports;

impl ClientContext for Reports {}

impl ProducerContext<NoCustomPartitioner> for Reports {
    type DeliveryOpaque = Box<oneshot::Sender<OwnedDeliveryResult>>;

    fn delivery(&self, result: &DeliveryResult<'_>, tx: Self::DeliveryOpaque) {
        let report = match result {
            Ok(message) => Ok(Delivery {
                partition: message.partition(),
                offset: message.offset(),
                timestamp: message.timestamp(),
            }),
            Err((error, message)) => Err((error.clone(), message.detach())),
        };
        // The caller may have stopped waiting; then nobody needs the report.
        let _ = tx.send(report);
    }
}

/// A handle on the producer's main queue, where librdkafka puts delivery reports and errors.
struct MainQueue(NonNull<rd::rd_kafka_queue_t>);

// SAFETY: librdkafka's queues lock internally; the calls below are documented as safe from
// any thread.
unsafe impl Send for MainQueue {}
unsafe impl Sync for MainQueue {}

impl MainQueue {
    fn of(client: &Client<Reports>) -> Option<Self> {
        // SAFETY: the client's handle is valid while the client lives, and `Inner` drops this
        // handle before the producer.
        NonNull::new(unsafe { rd::rd_kafka_queue_get_main(client.native_ptr()) }).map(MainQueue)
    }

    /// Events waiting to be served.
    fn len(&self) -> usize {
        // SAFETY: a live queue handle.
        unsafe { rd::rd_kafka_queue_length(self.0.as_ptr()) }
    }

    /// From now on librdkafka writes a byte to `socket` when an event arrives after a poll.
    fn wake_on(&self, socket: &UnixStream) {
        let byte = [1u8];
        // SAFETY: librdkafka copies the payload; the socket outlives the registration
        // (`Inner::drop` calls `quiet` before the socket closes).
        unsafe {
            rd::rd_kafka_queue_io_event_enable(
                self.0.as_ptr(),
                socket.as_raw_fd(),
                byte.as_ptr().cast(),
                byte.len(),
            )
        }
    }

    fn quiet(&self) {
        // SAFETY: a live queue handle; a descriptor of -1 turns the wake-ups off.
        unsafe { rd::rd_kafka_queue_io_event_enable(self.0.as_ptr(), -1, std::ptr::null(), 0) }
    }
}

impl Drop for MainQueue {
    fn drop(&mut self) {
        self.quiet();
        // SAFETY: the handle came from `rd_kafka_queue_get_main` and is destroyed once.
        unsafe { rd::rd_kafka_queue_destroy(self.0.as_ptr()) }
    }
}

#[cfg(test)]
mod tests;
