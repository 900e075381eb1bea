//! The retry policy on the real broker: back-off delays grow as configured, and the delivery
//! limit (per consumer or per message) ends in the dead-letter topic.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use kafka_redelivery::client::{ConsumerConfig, RedeliveryConsumer, RetryPolicy};
use kafka_redelivery::headers;

async fn consumer_with(t: &Topics, policy: RetryPolicy) -> RedeliveryConsumer {
    RedeliveryConsumer::new(
        ConsumerConfig::new(brokers(), unique("group"), [&t.source], &t.markers)
            .timeout(Duration::from_secs(60))
            .retry(policy),
    )
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backoff_grows_as_configured_and_the_limit_dead_letters() {
    let t = topics(1, 1).await;
    // The tracker allows more than the policy: the policy's limit is what stops it.
    let tracker = TrackerGuard::start(tracker_config(&t, 10));
    tracker.wait_ready().await;
    let initial = Duration::from_millis(300);
    let policy = RetryPolicy::exponential(initial, Duration::from_secs(10))
        .jitter(0.0)
        .max_deliveries(4);
    let mut c = consumer_with(&t, policy.clone()).await;
    produce(&t.source, None, "k", b"v", &[]).await;

    let mut gaps = Vec::new();
    let mut nacked_at: Option<Instant> = None;
    for attempt in 1..=4u32 {
        let d = next_delivery(&mut c, "delivery").await;
        if let Some(at) = nacked_at {
            gaps.push(at.elapsed());
        }
        assert_eq!(d.attempt(), attempt);
        nacked_at = Some(Instant::now());
        d.nack().await.unwrap();
    }
    // Correctness, not speed: each copy comes no earlier than the policy's delay for it
    // (300 ms, 600 ms, 1.2 s), so the delays grow as configured.
    for (i, gap) in gaps.iter().enumerate() {
        let want = policy.delay_after(i as u32 + 1, 0.0);
        assert!(
            *gap + Duration::from_millis(20) >= want,
            "copy {} came after {gap:?}, the policy says {want:?}",
            i + 2
        );
    }
    // The fourth nack was the last delivery the policy allows: dead-lettered, not redelivered.
    let dlq = read(&t.dlq, 1, Duration::from_secs(60));
    assert_eq!(dlq.len(), 1);
    assert_eq!(
        header(&dlq[0], headers::DLQ_REASON).as_deref(),
        Some("rejected")
    );
    let detail = header(&dlq[0], headers::DLQ_DETAIL).unwrap();
    assert!(detail.contains("delivered 4 times"), "{detail}");
    assert!(
        c.recv_timeout(Duration::from_secs(2)).await.is_none(),
        "redelivered past the limit"
    );
    c.close().await.unwrap();
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_per_message_limit_lowers_the_policy() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 10));
    tracker.wait_ready().await;
    let mut c = consumer_with(&t, RetryPolicy::fixed(Duration::ZERO).max_deliveries(5)).await;
    produce(
        &t.source,
        None,
        "once-more",
        b"v",
        &[(headers::MAX_DELIVERIES, "2")],
    )
    .await;
    next_delivery(&mut c, "delivery")
        .await
        .nack()
        .await
        .unwrap();
    let second = next_delivery(&mut c, "redelivery").await;
    assert_eq!(second.attempt(), 2);
    second.nack().await.unwrap();
    let dlq = read(&t.dlq, 1, Duration::from_secs(60));
    assert_eq!(dlq.len(), 1, "the header's limit of 2 applies");
    assert!(header(&dlq[0], headers::DLQ_DETAIL)
        .unwrap()
        .contains("allows 2"));
    c.close().await.unwrap();
    tracker.stop().await;
}
