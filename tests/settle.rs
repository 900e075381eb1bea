//! Settling deliveries on a real broker: ack, timeout, keep-alive, nack, reject, max deliveries.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use kafka_redelivery::client::{ConsumerConfig, Delivery, RedeliveryConsumer};
use kafka_redelivery::events::{Event, EventKind};
use kafka_redelivery::headers;
use kafka_redelivery::marker::SourceRef;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_records_are_never_redelivered() {
    // The timeout leaves room for the acks: a record acked after its deadline may come back
    // (at least once), and twenty acks on a loaded three-broker cluster have taken over a
    // second when awaited one after another.
    let timeout = Duration::from_secs(3);
    let t = topics(2, 2).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = consumer(&t, timeout).await;
    produce_many(&t.source, 2, "ack", 20).await;
    let mut deliveries = Vec::new();
    let mut first = None;
    // Taken a batch at a time (`recv_batch`), as a batch worker would.
    while deliveries.len() < 20 {
        let batch = tokio::time::timeout(Duration::from_secs(60), c.recv_batch())
            .await
            .expect("a batch within a minute")
            .expect("the consumer runs");
        assert!(!batch.is_empty());
        first.get_or_insert_with(Instant::now);
        deliveries.extend(batch);
    }
    assert_eq!(deliveries.len(), 20, "no more than was produced");
    assert!(deliveries.iter().all(|d| d.attempt() == 1));
    let mut keys: Vec<_> = deliveries
        .iter()
        .map(|d| d.key().map(<[u8]>::to_vec))
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), 20);
    // Half acked each on its own and together, as a handler pool would; half in one
    // `ack_many`, as a batch worker would.
    let each = deliveries.split_off(10);
    let (one_by_one, all) = futures::future::join(
        futures::future::join_all(each.into_iter().map(|d| d.ack())),
        Delivery::ack_many(deliveries),
    )
    .await;
    for acked in one_by_one {
        acked.unwrap();
    }
    all.unwrap();
    assert_eq!(
        c.unsettled(),
        0,
        "every ack freed its place under the bound"
    );
    let settled_in = first.map_or(Duration::ZERO, |f| f.elapsed());
    tracker.wait_ready().await;
    // Past every deadline nothing has come back, and the tracker holds nothing.
    if let Some(back) = c.recv_timeout(timeout + Duration::from_secs(2)).await {
        panic!(
            "an acked record came back: {} attempt {} (copy of {:?}); the acks took {:?} \
             from the first handout, against a timeout of {:?}",
            back.source(),
            back.attempt(),
            back.original(),
            settled_in,
            timeout,
        );
    }
    assert_eq!(tracker.metric_sum("redelivery_redelivered_total"), 0.0);
    // Version 2: the 20 Starts came in batch Starts, the 20 Ends in Settles.
    assert_eq!(
        tracker.metric("redelivery_batched_records_total{type=\"start_batch\"}"),
        20.0
    );
    assert_eq!(
        tracker.metric("redelivery_batched_records_total{type=\"settle\"}"),
        20.0
    );
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsettled_record_is_redelivered_intact_with_the_next_attempt() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = consumer(&t, Duration::from_secs(30)).await;
    let (p, o) = produce(
        &t.source,
        None,
        "k1",
        b"payload-1",
        &[("trace", "abc"), (headers::TIMEOUT_MS, "1500")],
    )
    .await;

    let first = next_delivery(&mut c, "first delivery").await;
    assert_eq!(first.attempt(), 1);
    assert_eq!(first.original(), None);
    assert_eq!(
        first.timeout(),
        Duration::from_millis(1500),
        "kr-timeout-ms overrides the default"
    );
    first.abandon();

    let second = next_delivery(&mut c, "redelivery").await;
    assert_eq!(second.attempt(), 2);
    assert_eq!(second.key(), Some(&b"k1"[..]));
    assert_eq!(second.payload(), Some(&b"payload-1"[..]));
    assert_eq!(headers::text(second.headers(), "trace"), Some("abc"));
    assert_eq!(headers::text(second.headers(), headers::ATTEMPT), Some("2"));
    assert_eq!(
        second.original(),
        Some(&SourceRef::new(t.source.clone(), p, o))
    );
    assert_eq!(
        second.partition(),
        p,
        "copies go back to the same partition"
    );
    assert!(second.offset() > o);
    second.ack().await.unwrap();
    assert!(c.recv_timeout(Duration::from_secs(2)).await.is_none());
    tracker.stop().await;
}

/// Records in the middle of one producer batch: every abandoned one comes back as a copy with
/// its payload, and none is called gone. Apache Kafka answers a read by offset inside a batch
/// with the whole batch; Tansu answers with the next one (or nothing at the end of the log),
/// which the source reader's look-back makes up for (`source_reader.rs`, README "Tested
/// brokers"; `scripts/test-tansu` runs this against Tansu).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abandoned_records_inside_one_producer_batch_all_come_back() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = consumer(&t, Duration::from_secs(2)).await;
    produce_many(&t.source, 1, "b", 40).await;
    let mut abandoned = std::collections::BTreeSet::new();
    let mut back = std::collections::BTreeSet::new();
    let mut first = 0;
    let mut acks = tokio::task::JoinSet::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    while (first < 40 || back.len() < abandoned.len()) && Instant::now() < deadline {
        let Some(d) = c.recv_timeout(Duration::from_secs(1)).await else {
            continue;
        };
        let key = String::from_utf8(d.key().unwrap().to_vec()).unwrap();
        if d.attempt() == 1 {
            first += 1;
            if d.offset() % 2 == 1 {
                abandoned.insert(key);
                d.abandon();
                continue;
            }
        } else {
            assert_eq!(
                d.payload(),
                d.key(),
                "the copy carries the original's payload"
            );
            back.insert(key);
        }
        // Acked on the side, as a handler pool would: twenty acks awaited one after another
        // on a loaded three-broker cluster can outlast the 2 s timeout, and a record acked
        // late comes back (at least once), which this test would count as abandoned.
        acks.spawn(d.ack());
    }
    while let Some(acked) = acks.join_next().await {
        acked.unwrap().unwrap();
    }
    assert_eq!(abandoned.len(), 20);
    assert_eq!(back, abandoned, "every abandoned record came back");
    assert_eq!(
        tracker.metric_sum("redelivery_dead_lettered_total"),
        0.0,
        "none was called gone"
    );
    tracker.stop().await;
}

/// A consumer that takes over a partition whose commit lies inside the last producer batch
/// gets the rest of the batch. Apache Kafka answers its fetch there with the whole batch;
/// Tansu answers with nothing (there is no next batch), and the 35 records never started were
/// not delivered until something new was produced (`ResumeCheck::stalled`; README "Tested
/// brokers"; `scripts/test-tansu` runs this against Tansu). No tracker runs, so nothing new is
/// produced: the five the first consumer holds stay unsettled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_taking_over_inside_a_producer_batch_gets_the_rest_of_it() {
    let t = topics(1, 1).await;
    produce_many(&t.source, 1, "b", 40).await;
    let group = unique("group");
    // Room for five: it polls one batch of five, commits past it, and polls no more.
    let config = ConsumerConfig::new(brokers(), &group, [&t.source], &t.markers)
        .max_unsettled(5)
        .max_batch(5);
    let mut first = RedeliveryConsumer::new(config).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(next_delivery(&mut first, "delivery").await);
    }
    assert_eq!(
        held.iter().map(|d| d.offset()).collect::<Vec<_>>(),
        [0, 1, 2, 3, 4]
    );
    first.close().await.unwrap();
    let mut second = consumer_of(&t.source, &t.markers, &group, Duration::from_secs(30)).await;
    let mut offsets = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while offsets.len() < 35 && Instant::now() < deadline {
        if let Some(d) = second.recv_timeout(Duration::from_secs(1)).await {
            assert_eq!(d.attempt(), 1);
            offsets.push(d.offset());
            d.ack().await.unwrap();
        }
    }
    assert_eq!(
        offsets,
        (5..40).collect::<Vec<i64>>(),
        "the rest of the batch, in order"
    );
    drop(held);
}

/// A partition paused by back-pressure, taken away by a rebalance and given back later, is
/// fetched again. librdkafka keeps an application's pause on a partition it no longer owns,
/// and resuming "the assignment" never reaches it: before the fix the partition stayed paused
/// for good once it came back, and its records were never delivered (the cluster fault suite's
/// stall of 2026-12-04: one source partition unread for four minutes by three live workers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_paused_when_taken_away_is_fetched_when_it_comes_back() {
    let t = topics(2, 1).await;
    produce_many(&t.source, 2, "p", 20).await;
    let group = unique("group");
    let config = ConsumerConfig::new(brokers(), &group, [&t.source], &t.markers)
        .max_unsettled(2)
        .max_batch(2);
    let mut first = RedeliveryConsumer::new(config).await.unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        let d = next_delivery(&mut first, "delivery").await;
        held.push(d);
    }
    // Held past the back-pressure's grace, so fetching pauses on both partitions.
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A second member takes one partition away, settles one record and leaves; the partition
    // comes back to the first, which must then get what is produced to either.
    let mut second = consumer_of(&t.source, &t.markers, &group, Duration::from_secs(30)).await;
    let d = next_delivery(&mut second, "the second member got a partition").await;
    d.ack().await.unwrap();
    // The partition the rebalance gave back to the first is paused as it is assigned: the
    // first stays within its bound of two.
    assert!(
        first.recv_timeout(Duration::from_secs(1)).await.is_none(),
        "a delivery past max_unsettled"
    );
    second.close().await.unwrap();
    for d in held.drain(..) {
        d.ack().await.unwrap();
    }
    produce_many(&t.source, 2, "later", 20).await;
    let mut later = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while later.len() < 20 && Instant::now() < deadline {
        if let Some(d) = first.recv_timeout(Duration::from_secs(1)).await {
            let key = String::from_utf8_lossy(d.key().unwrap_or_default()).into_owned();
            if key.starts_with("later-") {
                later.insert((d.partition(), key));
            }
            d.ack().await.unwrap();
        }
    }
    let partitions: std::collections::BTreeSet<i32> = later.iter().map(|(p, _)| *p).collect();
    assert_eq!(
        later.len(),
        20,
        "records produced after the partition came back were not all delivered (got them \
         from partitions {partitions:?})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keep_alive_holds_a_delivery_past_its_timeout() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = consumer(&t, Duration::from_secs(1)).await;
    produce(&t.source, None, "k", b"v", &[]).await;
    let d = next_delivery(&mut c, "delivery").await;
    tracker.wait_ready().await;
    let held = Instant::now();
    while held.elapsed() < Duration::from_secs(4) {
        d.keep_alive().await.unwrap();
        assert!(
            c.recv_timeout(Duration::from_millis(300)).await.is_none(),
            "redelivered while kept alive"
        );
    }
    d.ack().await.unwrap();
    assert!(c.recv_timeout(Duration::from_secs(2)).await.is_none());
    assert_eq!(tracker.metric_sum("redelivery_redelivered_total"), 0.0);
    // Each keep-alive is its own Settle (they are 300 ms apart), then the ack's.
    assert!(tracker.metric("redelivery_markers_total{type=\"settle\"}") >= 5.0);
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_keep_alive_holds_a_delivery_while_the_handle_lives() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = RedeliveryConsumer::new(
        ConsumerConfig::new(
            brokers(),
            unique("group"),
            [t.source.as_str()],
            t.markers.as_str(),
        )
        .timeout(Duration::from_secs(1))
        .auto_keep_alive(true),
    )
    .await
    .unwrap();
    produce(&t.source, None, "k", b"v", &[]).await;
    let d = next_delivery(&mut c, "delivery").await;
    tracker.wait_ready().await;
    assert!(
        c.recv_timeout(Duration::from_secs(4)).await.is_none(),
        "redelivered while kept alive"
    );
    d.ack().await.unwrap();
    assert_eq!(tracker.metric_sum("redelivery_redelivered_total"), 0.0);
    tracker.stop().await;
}

/// Waits for `n` events of `kind` from `events`, a minute at most.
async fn events_of(
    events: &mut tokio::sync::broadcast::Receiver<Event>,
    kind: EventKind,
    n: usize,
) -> Vec<Event> {
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while seen.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, events.recv()).await {
            Ok(Ok(e)) if e.kind == kind => seen.push(e),
            Ok(Ok(_)) => {}
            other => panic!("{} {kind:?} events of {n}, then {other:?}", seen.len()),
        }
    }
    seen
}

/// Deliveries whose timeout passes while they wait in the client for the application are not
/// handed out: the tracker redelivers them, so the application gets each record once, as its
/// copy, instead of twice. They are counted and announced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_that_time_out_before_the_application_takes_them_are_not_handed_out() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = consumer(&t, Duration::from_secs(1)).await;
    let mut events = c.events();
    produce_many(&t.source, 1, "e", 5).await;
    tracker.wait_ready().await;
    // In the client, waiting for the application; then past their timeout.
    events_of(&mut events, EventKind::Delivered, 5).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let mut copies = std::collections::BTreeSet::new();
    while copies.len() < 5 {
        let d = next_delivery(&mut c, "copy").await;
        assert_eq!(d.attempt(), 2, "an expired original was handed out: {d:?}");
        copies.insert(d.original().unwrap().offset);
        d.ack().await.unwrap();
    }
    assert_eq!(
        copies.into_iter().collect::<Vec<i64>>(),
        (0..5).collect::<Vec<i64>>(),
        "each original came back once, as a copy"
    );
    assert_eq!(c.expired_before_handout(), 5);
    let expired = events_of(&mut events, EventKind::Expired, 5).await;
    assert!(expired.iter().all(|e| e.attempt == 1));
    assert!(c.recv_timeout(Duration::from_secs(2)).await.is_none());
    assert_eq!(tracker.metric_sum("redelivery_redelivered_total"), 5.0);
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_redelivers_after_the_delay() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = consumer(&t, Duration::from_secs(60)).await;
    produce(&t.source, None, "k", b"v", &[]).await;
    let d = next_delivery(&mut c, "delivery").await;
    tracker.wait_ready().await;
    let delay = Duration::from_secs(2);
    let nacked_at = Instant::now();
    d.nack_after(delay).await.unwrap();
    let again = next_delivery(&mut c, "redelivery after nack").await;
    // Correctness, not speed: the copy must not come before the delay the application asked
    // for (the deadline is counted from the Nack marker, appended after `nacked_at`).
    assert!(
        nacked_at.elapsed() >= delay - Duration::from_millis(20),
        "redelivered early: {:?}",
        nacked_at.elapsed()
    );
    assert_eq!(again.attempt(), 2);
    again.ack().await.unwrap();
    let series = format!(
        "redelivery_redelivered_total{{cause=\"nacked\",topic=\"{}\"}}",
        t.source
    );
    tracker.wait_metric(&series, 1.0).await;
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_delivery_or_unawaited_ack_is_released_at_once() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = consumer(&t, Duration::from_secs(600)).await;
    produce(&t.source, None, "k", b"v", &[]).await;
    let d = next_delivery(&mut c, "delivery").await;
    tracker.wait_ready().await;
    drop(d);
    // With a ten-minute timeout, only the release marker can bring it back this soon.
    let again = next_delivery(&mut c, "released delivery comes back").await;
    assert_eq!(again.attempt(), 2);
    // A settlement does nothing until awaited: an `ack()` dropped unawaited drops its
    // delivery unsettled, which releases it the same way.
    drop(again.ack());
    let third = next_delivery(&mut c, "a delivery whose ack was never awaited comes back").await;
    assert_eq!(third.attempt(), 3);
    third.ack().await.unwrap();
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_sends_the_record_to_the_dead_letter_topic_with_its_reason() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut c = consumer(&t, Duration::from_secs(60)).await;
    let (p, o) = produce(&t.source, None, "bad", b"{not json", &[("trace", "t1")]).await;
    let d = next_delivery(&mut c, "delivery").await;
    d.reject("cannot parse JSON").await.unwrap();
    let dlq = read(&t.dlq, 1, Duration::from_secs(60));
    assert_eq!(dlq.len(), 1, "one record dead-lettered");
    let m = &dlq[0];
    use rdkafka::message::Message;
    assert_eq!(m.key(), Some(&b"bad"[..]));
    assert_eq!(m.payload(), Some(&b"{not json"[..]));
    assert_eq!(header(m, "trace").as_deref(), Some("t1"));
    assert_eq!(header(m, headers::DLQ_REASON).as_deref(), Some("rejected"));
    assert_eq!(
        header(m, headers::DLQ_DETAIL).as_deref(),
        Some("cannot parse JSON")
    );
    assert_eq!(header(m, headers::ORIGINAL_OFFSET), Some(o.to_string()));
    assert_eq!(header(m, headers::ORIGINAL_PARTITION), Some(p.to_string()));
    assert!(
        c.recv_timeout(Duration::from_secs(2)).await.is_none(),
        "a rejected record is not redelivered"
    );
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_deliveries_ends_in_the_dead_letter_topic() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 3));
    let mut c = consumer(&t, Duration::from_millis(500)).await;
    produce(&t.source, None, "doomed", b"v", &[]).await;
    let mut attempts = Vec::new();
    while attempts.len() < 3 {
        let d = next_delivery(&mut c, "delivery").await;
        attempts.push(d.attempt());
        d.abandon();
    }
    assert_eq!(attempts, vec![1, 2, 3]);
    let dlq = read(&t.dlq, 1, Duration::from_secs(60));
    assert_eq!(dlq.len(), 1);
    assert_eq!(
        header(&dlq[0], headers::DLQ_REASON).as_deref(),
        Some("max-deliveries")
    );
    assert_eq!(header(&dlq[0], headers::ATTEMPT).as_deref(), Some("3"));
    assert!(
        c.recv_timeout(Duration::from_secs(2)).await.is_none(),
        "no fourth delivery"
    );
    let series = format!(
        "redelivery_dead_lettered_total{{reason=\"max-deliveries\",topic=\"{}\"}}",
        t.source
    );
    tracker.wait_metric(&series, 1.0).await;
    tracker.stop().await;
}

/// KIP-848's consumer-group protocol: used where the broker serves it (4.x), refused at once
/// with a message where it does not (3.9, the second pass of `scripts/test`), never a consumer
/// that silently waits for an assignment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_new_group_protocol_works_where_served_and_is_refused_where_not() {
    let t = topics(1, 1).await;
    let config = ConsumerConfig::new(brokers(), unique("kip848"), [&t.source], &t.markers)
        .set("group.protocol", "consumer");
    // Apache Kafka 3.x, and Tansu (`scripts/test-tansu` sets KAFKA_FLAVOR), do not serve it.
    let old_broker =
        std::env::var("KAFKA_VERSION").is_ok_and(|v| v.starts_with("3.")) || on_tansu();
    let result = RedeliveryConsumer::new(config).await;
    if old_broker {
        match result {
            Err(kafka_redelivery::client::ClientError::Unsupported(why)) => {
                assert!(why.contains("group.protocol=consumer"), "{why}")
            }
            Err(other) => panic!("refused for the wrong reason: {other}"),
            Ok(_) => panic!("accepted a protocol the broker does not serve"),
        }
        return;
    }
    let mut c = result.expect("the broker serves KIP-848 consumer groups");
    produce(&t.source, None, "k", b"v", &[]).await;
    let d = next_delivery(&mut c, "a delivery through the new protocol").await;
    d.ack().await.unwrap();
}
