//! A record handed to the application, to be settled exactly once.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::events::{Event, EventKind};
use crate::headers::HeaderList;
use crate::marker::{duration_to_ms_u32, SourceRef};

use super::body::Body;
use super::coalesce::Op;
use super::error::ClientError;
use super::retry::{unit_random, RetryPolicy};
use super::settlement::Settlement;
use super::settler::Settler;

/// One delivery of one record. Settle it with [`ack`](Self::ack), [`nack`](Self::nack),
/// [`nack_after`](Self::nack_after) or
/// [`reject`](Self::reject); keep it with [`keep_alive`](Self::keep_alive) while working.
///
/// Dropping a delivery without settling it releases it: the client writes a Nack with no delay,
/// and the tracker redelivers the record at once. Even if that Nack is lost, the record is
/// redelivered when its timeout passes. Nothing handed out is ever silently lost.
///
/// ```no_run
/// use std::time::Duration;
/// use kafka_redelivery::client::Delivery;
///
/// async fn handle(delivery: Delivery) -> Result<(), kafka_redelivery::client::ClientError> {
///     if delivery.attempt() > 1 {
///         // A redelivered copy: `original()` names the first delivery, for deduplication.
///         println!("retry of {:?}", delivery.original());
///     }
///     match delivery.payload() {
///         Some(body) if body.starts_with(b"{") => {
///             delivery.keep_alive().await?; // long work ahead: push the deadline out
///             delivery.ack().await
///         }
///         Some(_) => delivery.reject("not JSON").await,
///         None => delivery.nack_after(Duration::from_secs(10)).await,
///     }
/// }
/// ```
pub struct Delivery {
    pub(crate) source: SourceRef,
    /// Key and payload, in one allocation (`body.rs`).
    pub(crate) body: Body,
    pub(crate) headers: HeaderList,
    pub(crate) timestamp_ms: Option<i64>,
    pub(crate) attempt: u32,
    /// Boxed: only copies have one, and a delivery is moved several times on its way to the
    /// application, each move copying its whole size.
    pub(crate) original: Option<Box<SourceRef>>,
    pub(crate) timeout: Duration,
    /// When the tracker may redeliver it, by this process's clock: when its Start was sent,
    /// plus its timeout (`None` past what an `Instant` holds). The tracker counts from the
    /// Start's broker timestamp, a little later, so a delivery found expired here is due there
    /// too (a skew between the hosts' clocks only delays the copy): `recv` does not hand it
    /// out (see `RedeliveryConsumer::recv`).
    pub(crate) expires: Option<Instant>,
    pub(crate) settler: Arc<Settler>,
    pub(crate) retry: Arc<RetryPolicy>,
    pub(crate) settled: bool,
    pub(crate) keep_alive: Option<tokio::task::AbortHandle>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("source", &self.source)
            .field("attempt", &self.attempt)
            .field("original", &self.original)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Delivery {
    /// Topic the record was read from.
    pub fn topic(&self) -> &str {
        &self.source.topic
    }

    /// Partition the record was read from.
    pub fn partition(&self) -> i32 {
        self.source.partition
    }

    /// Offset of the record.
    pub fn offset(&self) -> i64 {
        self.source.offset
    }

    /// Where this record was read from.
    pub fn source(&self) -> &SourceRef {
        &self.source
    }

    /// The record key.
    pub fn key(&self) -> Option<&[u8]> {
        self.body.key()
    }

    /// The record value.
    pub fn payload(&self) -> Option<&[u8]> {
        self.body.payload()
    }

    /// The record headers, including the `kr-*` headers of a redelivered copy.
    pub fn headers(&self) -> &HeaderList {
        &self.headers
    }

    /// The record timestamp in milliseconds since the epoch, if it has one.
    pub fn timestamp_ms(&self) -> Option<i64> {
        self.timestamp_ms
    }

    /// Which delivery of the record this is: 1 the first time, then 2, 3, ...
    pub fn attempt(&self) -> u32 {
        self.attempt
    }

    /// For a redelivered copy, where the first delivery of this record was read from; `None`
    /// for an original record. Stable across redeliveries, so it can key deduplication.
    pub fn original(&self) -> Option<&SourceRef> {
        self.original.as_deref()
    }

    /// The time this delivery has before it is redelivered, from its Start or last keep-alive.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Acknowledges the record: it will not be redelivered. Returns once the End marker is
    /// durable. On error the record may be redelivered after its timeout.
    pub fn ack(self) -> Settlement {
        Settlement::new(self, Op::End, "end")
    }

    /// Acknowledges many records at once: none of them will be redelivered. Returns once every
    /// End is durable. The cheap way to settle a batch (from
    /// [`RedeliveryConsumer::recv_batch`](super::RedeliveryConsumer::recv_batch), say): one
    /// future and, in marker format version 2, one answer per Settle marker instead of one
    /// per record. On error ([`ClientError::Ends`]) the records whose markers failed may be
    /// redelivered after their timeout; the others are settled.
    ///
    /// Like every settlement it does nothing until awaited: dropped unawaited, its deliveries
    /// are dropped unsettled and come back at once.
    pub async fn ack_many(
        deliveries: impl IntoIterator<Item = Delivery>,
    ) -> Result<(), ClientError> {
        let mut deliveries = deliveries.into_iter().peekable();
        // Every run is settled even if one fails; the error counts all that failed.
        let (mut records, mut failed, mut first_error) = (0, 0, None);
        while let Some(first) = deliveries.peek() {
            // One consumer's deliveries share a settler; a mixed batch is settled in runs.
            let settler = first.settler.clone();
            let listening = settler.events.has_listeners();
            let mut sources = Vec::new();
            let mut attempts = Vec::new();
            while let Some(mut d) = deliveries.next_if(|d| Arc::ptr_eq(&d.settler, &settler)) {
                d.finish();
                if listening {
                    attempts.push(d.attempt);
                }
                sources.push(d.source.clone());
            }
            records += sources.len();
            let (run_failed, error) = settler.settle_ends(&sources).await;
            failed += run_failed;
            if let Some(e) = error {
                first_error.get_or_insert(e);
            } else if listening {
                for (source, attempt) in sources.into_iter().zip(attempts) {
                    settler
                        .events
                        .emit(|| Event::new(EventKind::Acked, source, attempt));
                }
            }
        }
        match first_error {
            None => Ok(()),
            Some(error) => Err(ClientError::Ends {
                records,
                failed,
                error,
            }),
        }
    }

    /// Gives the record back under the consumer's retry policy: redelivered after the
    /// policy's delay for this attempt, or, if this was the last delivery the policy (or the
    /// record's `kr-max-deliveries` header) allows, sent to the dead-letter topic.
    pub async fn nack(self) -> Result<(), ClientError> {
        let policy = self.retry.clone();
        self.nack_with(&policy).await
    }

    /// Like [`nack`](Self::nack), with another policy for this delivery only.
    pub async fn nack_with(self, policy: &RetryPolicy) -> Result<(), ClientError> {
        let per_message = crate::headers::checked::max_deliveries(&self.headers).value();
        if let Some(limit) = policy.limit(per_message) {
            if self.attempt >= limit {
                let reason = format!(
                    "delivered {} times; the retry policy allows {limit}",
                    self.attempt
                );
                return self.reject(reason).await;
            }
        }
        let delay = policy.delay_after(self.attempt, unit_random((&self.source, self.attempt)));
        self.nack_after(delay).await
    }

    /// Gives the record back, to be redelivered after `delay` (zero: as soon as possible),
    /// whatever the retry policy says. The redelivery counts as an attempt.
    pub fn nack_after(self, delay: Duration) -> Settlement {
        let delay_ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        Settlement::new(self, Op::Nack(delay_ms), "nack")
    }

    /// Refuses the record: the tracker sends it to the dead-letter topic now, with `reason` in
    /// its `kr-dlq-detail` header.
    pub fn reject(self, reason: impl Into<String>) -> Settlement {
        Settlement::new(self, Op::Reject(reason.into()), "reject")
    }

    /// Pushes the deadline out by this delivery's timeout, counted from now.
    pub async fn keep_alive(&self) -> Result<(), ClientError> {
        self.keep_alive_for(self.timeout).await
    }

    /// Pushes the deadline out to `timeout` from now. Later keep-alives use this timeout too
    /// only if given it again; [`keep_alive`](Self::keep_alive) uses the delivery's timeout.
    pub async fn keep_alive_for(&self, timeout: Duration) -> Result<(), ClientError> {
        let op = Op::KeepAlive(duration_to_ms_u32(timeout));
        self.settler.settle(&self.source, op, "keep_alive").await
    }

    /// Keeps this delivery alive in the background (a KeepAlive every third of its timeout)
    /// until it is settled or dropped. Needs a Tokio runtime; without one it does nothing.
    pub fn auto_keep_alive(&mut self) {
        if self.keep_alive.is_some() {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(source = %self.source, "auto keep-alive needs a Tokio runtime; not started");
            return;
        };
        let settler = self.settler.clone();
        let source = self.source.clone();
        let timeout_ms = duration_to_ms_u32(self.timeout);
        let every = (self.timeout / 3).max(Duration::from_millis(10));
        let left = self
            .expires
            .map(|at| at.saturating_duration_since(Instant::now()));
        let first = first_keep_alive(every, left);
        let task = rt.spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + first, every);
            loop {
                tick.tick().await;
                let op = Op::KeepAlive(timeout_ms);
                if let Err(e) = settler.settle(&source, op, "keep_alive").await {
                    tracing::warn!(error = %e, "automatic keep-alive failed; will try again");
                }
            }
        });
        self.keep_alive = Some(task.abort_handle());
    }

    /// Gives up on this delivery without telling the tracker: no marker is written, and the
    /// record is redelivered when its timeout passes, exactly as if this process had hung. It
    /// frees the delivery's place under the unsettled bound. Prefer [`nack`](Self::nack); this
    /// exists for workers that must not block on Kafka (and for fault tests).
    pub fn abandon(mut self) {
        self.finish();
    }

    /// Whether its deadline passed by `now`: the tracker redelivers it, or is about to.
    /// Checked by reference: a delivery is moved often enough on its way out.
    pub(crate) fn expired(&self, now: Instant) -> bool {
        self.expires.is_some_and(|at| now >= at)
    }

    /// Lets go of a delivery that [`expired`](Self::expired) before it was handed out: no
    /// marker is written, since the tracker's copy is its next delivery; it is counted, and
    /// its place under the bound freed.
    pub(crate) fn pass_over(&mut self) {
        self.settler.expired(&self.source, self.attempt);
        self.finish();
    }

    /// Marks the delivery settled: stops keep-alives and frees its place under the bound.
    pub(crate) fn finish(&mut self) {
        if let Some(task) = self.keep_alive.take() {
            task.abort();
        }
        if !self.settled {
            self.settled = true;
            self.settler.settled();
        }
    }
}

impl Drop for Delivery {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        tracing::debug!(source = %self.source, "delivery dropped unsettled; releasing it for redelivery");
        self.settler.settle_detached(&self.source, Op::Nack(0));
        self.finish();
    }
}

/// When the first automatic keep-alive goes out, `every` being the time between two and
/// `left` what is left before the deadline. A delivery that waited in the client before the
/// application took it has less than its timeout left, maybe less than `every`: then the first
/// goes out once half of what is left has passed.
fn first_keep_alive(every: Duration, left: Option<Duration>) -> Duration {
    left.map_or(every, |left| every.min(left / 2))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;
    use crate::client::body::Body;
    use crate::client::coalesce::Coalescer;
    use crate::client::settler::MarkerWriter;
    use rdkafka::mocking::MockCluster;
    use rdkafka::producer::DefaultProducerContext;
    use tokio::runtime::Handle;

    /// Two consumers' deliveries acked together, the first consumer's markers failing: the
    /// second's are still settled, and the error counts every record and every failure.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn ack_many_settles_every_consumers_run_and_counts_all_that_failed() {
        let (_mock, brokers) = mock();
        let failing = settler(&brokers, true);
        let working = settler(&brokers, false);
        // The failing run first: a run that fails must not keep the next from settling.
        let batch = vec![
            delivery(&failing, 0),
            delivery(&failing, 1),
            delivery(&working, 0),
            delivery(&working, 1),
            delivery(&working, 2),
        ];
        match Delivery::ack_many(batch).await {
            Err(ClientError::Ends {
                records, failed, ..
            }) => assert_eq!((records, failed), (5, 2)),
            other => panic!("expected the Ends of 2 of 5 records to fail: {other:?}"),
        }
        assert_eq!(failing.unsettled(), 0, "a failed ack still frees its place");
        assert_eq!(working.unsettled(), 0);
        let again = vec![delivery(&working, 3), delivery(&working, 4)];
        Delivery::ack_many(again).await.expect("all durable");
    }

    /// The hand-written settlement future: durable, failed with the record named, and an
    /// error (not a panic) when polled again after it resolved.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_settlement_resolves_once_with_its_marker_and_says_so_when_polled_again() {
        let (_mock, brokers) = mock();
        let working = settler(&brokers, false);
        let failing = settler(&brokers, true);
        let mut ack = delivery(&working, 7).ack();
        (&mut ack).await.expect("durable");
        assert!(matches!(
            (&mut ack).await,
            Err(ClientError::PolledAfterDone)
        ));
        match delivery(&failing, 8).reject("bad").await {
            Err(ClientError::Marker { marker, record, .. }) => {
                assert_eq!((marker, record.offset), ("reject", 8));
            }
            other => panic!("expected the Reject marker to fail: {other:?}"),
        }
        assert_eq!((working.unsettled(), failing.unsettled()), (0, 0));
    }

    fn mock() -> (MockCluster<'static, DefaultProducerContext>, String) {
        let mock = MockCluster::new(1).unwrap();
        mock.create_topic("m", 1, 1).unwrap();
        let brokers = mock.bootstrap_servers();
        (mock, brokers)
    }

    /// A settler writing to topic `m`; `closed`: its coalescer is closed, so every
    /// settlement fails as a marker the broker refused would.
    fn settler(brokers: &str, closed: bool) -> Arc<Settler> {
        let producer = crate::kafka::client_config(brokers, &[], &[])
            .create()
            .unwrap();
        let writer = MarkerWriter::new(producer, "m".into(), 1);
        let coalescer = Coalescer::start(
            Duration::from_millis(5),
            100,
            writer.clone(),
            Handle::current(),
        )
        .unwrap();
        if closed {
            coalescer.close();
        }
        Arc::new(Settler::new(writer.clone(), writer, Some(coalescer)))
    }

    /// A delivery taken with less than a third of its timeout left is kept alive before its
    /// deadline; one taken fresh, a third of its timeout on, as before.
    #[test]
    fn the_first_keep_alive_comes_before_the_deadline() {
        let every = Duration::from_secs(10);
        let ms = Duration::from_millis;
        assert_eq!(first_keep_alive(every, None), every);
        assert_eq!(first_keep_alive(every, Some(ms(30_000))), every);
        assert_eq!(first_keep_alive(every, Some(ms(20_000))), every);
        assert_eq!(first_keep_alive(every, Some(ms(6_000))), ms(3_000));
        assert_eq!(
            first_keep_alive(every, Some(Duration::ZERO)),
            Duration::ZERO
        );
    }

    /// A delivery of `t`/0 at `offset`, handed out by `settler`.
    fn delivery(settler: &Arc<Settler>, offset: i64) -> Delivery {
        settler.handed_out(1);
        Delivery {
            source: SourceRef::new("t", 0, offset),
            body: Body::new(None, Some(b"v")),
            headers: Vec::new(),
            timestamp_ms: None,
            attempt: 1,
            original: None,
            timeout: Duration::from_secs(30),
            expires: None,
            settler: settler.clone(),
            retry: Arc::new(RetryPolicy::default()),
            settled: false,
            keep_alive: None,
        }
    }
}
