//! Keeping alive what was started but not handed out while a rebalance may move it.
//!
//! Two paths of the poll thread leave records whose Starts are durable in nobody's hands: a
//! commit the group refused because a rebalance is under way (the batch is polled again, here
//! or by its partition's next owner), and a partition revoked while its batch's Starts were on
//! their way. Either way the next owner reads the records again, and its Start takes over the
//! one written here. But a rebalance can last longer than the delivery timeout: the group waits
//! for every member to rejoin, and a member that stopped polling (hung, or paused by its
//! runtime) holds it up for as long as its `max.poll.interval.ms`. The tracker then redelivers
//! the records meanwhile, and their next owner reads them as well: each is delivered twice. The
//! long fault run saw this as over half of its duplicates (RELIABILITY.md).
//!
//! So the poll thread keeps them alive, a KeepAlive at half their timeout, until the group has
//! settled: an assignment arrives (whatever it holds), or the poll thread hands them out itself.
//! Their next owner's Start then comes within what is left of the allowance.
//!
//! A KeepAlive cannot lose a record: it only moves a deadline out, and the tracker ignores one
//! for a delivery already ended (counting it as `settle_without_start`), copied or given back.
//! That is why it is not an End: an End arriving after the next owner's Start would end that
//! owner's delivery, and a crash of that owner would then lose the record.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::FutureExt;

use crate::marker::{duration_to_ms_u32, SourceRef};

use super::settler::Queued;

/// The longest a record is kept alive for a rebalance: the longest a group waits for a member
/// by default (`max.poll.interval.ms`, 5 minutes). A group that has not settled by then has
/// lost its member for good, and the tracker is left to redeliver.
pub(crate) const LEASE_LIMIT: Duration = Duration::from_secs(300);

/// The shortest time between two rounds of KeepAlives, however short a record's timeout.
const MIN_RENEWAL: Duration = Duration::from_millis(50);

/// Records kept alive until the group settles; see the module docs.
#[derive(Default)]
pub(crate) struct Leases {
    /// Each record with its timeout in milliseconds.
    held: BTreeMap<SourceRef, u32>,
    /// When the oldest record now held was taken.
    since: Option<Instant>,
    /// When the next round of KeepAlives is due.
    renew_at: Option<Instant>,
    /// The KeepAlives written and not yet answered.
    written: Vec<Queued>,
    /// Failed KeepAlives not yet reported, the first one's error, and when failures were last
    /// reported: at most once per [`REPORT_EVERY`], since a broker outage fails every round.
    failed: (usize, Option<String>, Option<Instant>),
}

/// How often failed KeepAlives are reported at most.
const REPORT_EVERY: Duration = Duration::from_secs(10);

impl Leases {
    /// Whether nothing is held, no KeepAlive waits for its answer and no failure waits to be
    /// reported: the poll thread's every turn asks this, so it costs a load or two.
    pub(crate) fn is_idle(&self) -> bool {
        self.held.is_empty() && self.written.is_empty() && self.failed.0 == 0
    }

    /// Whether KeepAlives written are still unanswered: then no new round is written, so that
    /// a broker that does not answer does not pile them up.
    pub(crate) fn waiting(&self) -> bool {
        !self.written.is_empty()
    }

    /// How many records are held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.held.len()
    }

    /// Keeps `records` (each with its timeout) alive from now on. Their Starts were just
    /// written, so the first KeepAlive is due at half the shortest timeout.
    pub(crate) fn hold(
        &mut self,
        records: impl IntoIterator<Item = (SourceRef, Duration)>,
        now: Instant,
    ) {
        for (source, timeout) in records {
            self.held.insert(source, duration_to_ms_u32(timeout));
        }
        if self.held.is_empty() {
            return;
        }
        self.since.get_or_insert(now);
        let next = now + self.renewal();
        self.renew_at = Some(self.renew_at.map_or(next, |at| at.min(next)));
    }

    /// Lets go of the records handed out after all (this consumer polled them again and its
    /// commit went through): from now on their settlements are the application's.
    pub(crate) fn handed_out<'a>(&mut self, sources: impl IntoIterator<Item = &'a SourceRef>) {
        if self.held.is_empty() {
            return;
        }
        for s in sources {
            self.held.remove(s);
        }
        self.forget_if_empty();
    }

    /// The group has settled: lets go of everything held; returns how many records and for
    /// how long the oldest was held.
    pub(crate) fn settled(&mut self, now: Instant) -> (usize, Duration) {
        let n = self.held.len();
        let held_for = self
            .since
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        self.held.clear();
        self.forget_if_empty();
        (n, held_for)
    }

    /// The KeepAlives due at `now` (each record with its timeout), if a round is due; the next
    /// round is then due at half the shortest timeout. Past [`LEASE_LIMIT`] everything is let
    /// go instead (`Err` with how many records).
    pub(crate) fn due(&mut self, now: Instant) -> Result<Vec<(SourceRef, u32)>, usize> {
        let Some(at) = self.renew_at else {
            return Ok(Vec::new());
        };
        if self
            .since
            .is_some_and(|t| now.saturating_duration_since(t) >= LEASE_LIMIT)
        {
            let n = self.held.len();
            self.held.clear();
            self.forget_if_empty();
            return Err(n);
        }
        if now < at {
            return Ok(Vec::new());
        }
        self.renew_at = Some(now + self.renewal());
        Ok(self.held.iter().map(|(s, t)| (s.clone(), *t)).collect())
    }

    /// Keeps the answer of a KeepAlive written, to report it if it fails.
    pub(crate) fn written(&mut self, answer: Queued) {
        self.written.push(answer);
    }

    /// Takes the answers that came. Returns the failures to report now, if any: how many
    /// since the last report, and the first one's error. A failed KeepAlive is not retried on
    /// its own: the next round writes another, and at worst the tracker redelivers (a
    /// duplicate, never a loss).
    pub(crate) fn answered(&mut self, now: Instant) -> Option<(usize, String)> {
        let (failed, first, reported) = &mut self.failed;
        self.written
            .retain_mut(|answer| match answer.now_or_never() {
                None => true,
                Some(Ok(())) => false,
                Some(Err(e)) => {
                    *failed += 1;
                    first.get_or_insert_with(|| e.to_string());
                    false
                }
            });
        let recently = reported.is_some_and(|t| now.saturating_duration_since(t) < REPORT_EVERY);
        if *failed == 0 || recently {
            return None;
        }
        *reported = Some(now);
        let n = std::mem::take(failed);
        first.take().map(|e| (n, e))
    }

    /// Half the shortest timeout held, at least [`MIN_RENEWAL`].
    fn renewal(&self) -> Duration {
        let shortest = self.held.values().copied().min().unwrap_or(0);
        (Duration::from_millis(u64::from(shortest)) / 2).max(MIN_RENEWAL)
    }

    fn forget_if_empty(&mut self) {
        if self.held.is_empty() {
            self.since = None;
            self.renew_at = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(offset: i64) -> SourceRef {
        SourceRef::new("t", 0, offset)
    }

    fn offsets(due: &[(SourceRef, u32)]) -> Vec<i64> {
        due.iter().map(|(s, _)| s.offset).collect()
    }

    #[test]
    fn records_held_are_kept_alive_at_half_their_shortest_timeout() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.hold(
            [
                (record(1), Duration::from_secs(4)),
                (record(2), Duration::from_secs(2)),
            ],
            t0,
        );
        assert!(
            l.due(t0).unwrap().is_empty(),
            "the Starts were just written"
        );
        assert!(l.due(t0 + Duration::from_millis(999)).unwrap().is_empty());
        let round = l.due(t0 + Duration::from_secs(1)).unwrap();
        assert_eq!(offsets(&round), [1, 2]);
        assert_eq!(round[0].1, 4_000, "each with its own timeout");
        assert!(l.due(t0 + Duration::from_millis(1_500)).unwrap().is_empty());
        assert_eq!(
            offsets(&l.due(t0 + Duration::from_secs(2)).unwrap()),
            [1, 2]
        );
    }

    #[test]
    fn records_handed_out_or_left_to_a_settled_group_are_let_go() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.hold((1..=3).map(|o| (record(o), Duration::from_secs(2))), t0);
        l.handed_out(&[record(2)]);
        assert_eq!(
            offsets(&l.due(t0 + Duration::from_secs(1)).unwrap()),
            [1, 3]
        );
        let (n, held_for) = l.settled(t0 + Duration::from_secs(3));
        assert_eq!((n, held_for), (2, Duration::from_secs(3)));
        assert!(l.is_idle());
        assert!(l.due(t0 + Duration::from_secs(10)).unwrap().is_empty());
    }

    #[test]
    fn a_record_held_twice_is_kept_alive_once() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.hold([(record(7), Duration::from_secs(2))], t0);
        l.hold(
            [(record(7), Duration::from_secs(2))],
            t0 + Duration::from_millis(500),
        );
        assert_eq!(l.len(), 1);
        assert_eq!(offsets(&l.due(t0 + Duration::from_secs(1)).unwrap()), [7]);
    }

    #[test]
    fn a_group_that_never_settles_is_given_up_after_the_limit() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.hold([(record(1), Duration::from_secs(30))], t0);
        assert_eq!(l.due(t0 + LEASE_LIMIT), Err(1));
        assert!(l.is_idle());
    }

    #[test]
    fn a_tiny_timeout_is_not_kept_alive_in_a_busy_loop() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        l.hold([(record(1), Duration::from_millis(10))], t0);
        assert!(l.due(t0 + Duration::from_millis(49)).unwrap().is_empty());
        assert_eq!(l.due(t0 + MIN_RENEWAL).unwrap().len(), 1);
    }

    #[test]
    fn failed_keep_alives_are_reported_at_most_every_ten_seconds() {
        let t0 = Instant::now();
        let mut l = Leases::default();
        let fail = || Queued::Failed(Some(rdkafka::error::KafkaError::Canceled));
        l.written(fail());
        l.written(fail());
        assert_eq!(l.answered(t0).map(|(n, _)| n), Some(2));
        assert!(l.is_idle());
        assert_eq!(l.answered(t0), None, "nothing new");
        l.written(fail());
        assert_eq!(l.answered(t0 + Duration::from_secs(1)), None, "held back");
        l.written(fail());
        assert_eq!(
            l.answered(t0 + REPORT_EVERY).map(|(n, _)| n),
            Some(2),
            "both held back since the last report"
        );
    }

    /// On librdkafka's mock cluster: a commit refused with `IllegalGeneration` while another
    /// member, which stopped polling, holds the rebalance up for seconds. The record is kept
    /// alive the whole time (no gap between its markers as long as its timeout), and no longer
    /// once the group has settled and the record was started again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_refused_batch_is_kept_alive_until_the_group_settles() {
        use crate::client::{ConsumerConfig, RedeliveryConsumer};
        use crate::marker::{decode, Marker};
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::message::Message;
        use rdkafka::mocking::{MockCluster, MockCoordinator};
        use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
        use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

        let timeout = Duration::from_secs(1);
        let mock = MockCluster::new(1).expect("mock cluster");
        for topic in ["src", "src.markers", "other"] {
            mock.create_topic(topic, 1, 1).expect("topic");
        }
        mock.coordinator(MockCoordinator::Group("g".into()), 1)
            .expect("coordinator");
        let brokers = mock.bootstrap_servers();
        let config = ConsumerConfig::new(&brokers, "g", ["src"], "src.markers")
            .timeout(timeout)
            .set("heartbeat.interval.ms", "200")
            // The mock coordinator waits for missing members as long as the session timeout of
            // whoever joined last: with librdkafka's default (45 s) here, a rebalance could
            // outlast the waits below, depending on which member joins last.
            .set("session.timeout.ms", "6000");
        let mut first = RedeliveryConsumer::new(config).await.expect("consumer");
        // A second member, on another topic, that stops polling once it has joined: every
        // rebalance of the group waits for it until its poll interval has passed.
        let stuck_brokers = brokers.clone();
        let stuck = tokio::task::spawn_blocking(move || {
            let c: BaseConsumer = crate::kafka::client_config(
                &stuck_brokers,
                &[
                    ("group.id", "g"),
                    ("session.timeout.ms", "6000"),
                    ("max.poll.interval.ms", "6000"),
                ],
                &[],
            )
            .create()
            .expect("consumer");
            c.subscribe(&["other"]).expect("subscribe");
            let deadline = Instant::now() + Duration::from_secs(30);
            while c.assignment().map_or(0, |a| a.count()) == 0 && Instant::now() < deadline {
                let _ = c.poll(Duration::from_millis(100));
            }
            c
        })
        .await
        .expect("stuck member");
        let producer: BaseProducer = crate::kafka::client_config(&brokers, &[], &[])
            .create()
            .expect("producer");
        let send = |key: &str| {
            producer
                .send(BaseRecord::<str, str>::to("src").key(key).payload("v"))
                .expect("queued");
            producer.flush(Duration::from_secs(10)).expect("flushed");
        };
        // The group is settled with both members: the first delivery comes and is acked.
        send("a");
        let a = first
            .recv_timeout(Duration::from_secs(30))
            .await
            .expect("a");
        a.ack().await.expect("ack");
        mock.request_errors(
            RDKafkaApiKey::OffsetCommit,
            &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_ILLEGAL_GENERATION],
        );
        send("b");
        let b = first
            .recv_timeout(Duration::from_secs(60))
            .await
            .expect("b");
        assert_eq!(b.key(), Some(&b"b"[..]));
        let offset = b.offset();
        b.ack().await.expect("ack");
        assert!(
            first.held_through_rebalances() >= 1,
            "the commit was not refused"
        );

        // b's markers, in the order the tracker reads them, with their timestamps.
        let reader: BaseConsumer =
            crate::kafka::client_config(&brokers, &[("group.id", "reader")], &[])
                .create()
                .expect("reader");
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition_offset("src.markers", 0, rdkafka::Offset::Beginning)
            .expect("offset");
        reader.assign(&tpl).expect("assign");
        let mut events: Vec<(&str, i64)> = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while events.last().map(|e| e.0) != Some("end") && Instant::now() < deadline {
            let Some(Ok(m)) = reader.poll(Duration::from_millis(100)) else {
                continue;
            };
            let at = m.timestamp().to_millis().unwrap_or(0);
            let names: Vec<&str> = match decode(m.payload().unwrap_or_default()) {
                Ok(Marker::StartBatch(s)) if s.offsets.contains(offset) => vec!["start"],
                Ok(Marker::Settle(s)) => {
                    let mut v = Vec::new();
                    if s.keep_alives.iter().any(|(o, _)| *o == offset) {
                        v.push("keep_alive");
                    }
                    if s.ends.contains(offset) {
                        v.push("end");
                    }
                    v
                }
                _ => Vec::new(),
            };
            events.extend(names.into_iter().map(|n| (n, at)));
        }
        tokio::task::spawn_blocking(move || drop(stuck))
            .await
            .expect("dropped");
        first.close().await.expect("closed");

        let kinds: Vec<&str> = events.iter().map(|e| e.0).collect();
        let starts = kinds.iter().filter(|k| **k == "start").count();
        assert!(starts >= 2, "started again after the rebalance: {kinds:?}");
        let restart = kinds.iter().rposition(|k| *k == "start").unwrap_or(0);
        assert!(
            kinds[..restart].contains(&"keep_alive"),
            "kept alive through the rebalance: {kinds:?}"
        );
        assert!(
            !kinds[restart..].contains(&"keep_alive"),
            "no longer kept alive once started again: {kinds:?}"
        );
        let span = events[restart].1 - events[0].1;
        assert!(
            span > timeout.as_millis() as i64,
            "the rebalance ({span} ms) was not longer than the timeout: the test did not test"
        );
        let widest = events[..=restart]
            .windows(2)
            .map(|w| w[1].1 - w[0].1)
            .max()
            .unwrap_or(0);
        assert!(
            widest < timeout.as_millis() as i64,
            "a gap of {widest} ms between b's markers would have let its deadline pass: {events:?}"
        );
    }
}
