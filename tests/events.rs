//! Delivery events from the consumer, the scheduler and the tracker, on the real broker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::*;
use kafka_redelivery::client::{CancelOutcome, ScheduledRecord, Scheduler, SchedulerConfig};
use kafka_redelivery::events::{Event, EventKind};
use tokio::sync::broadcast::Receiver;

/// The next event of `kind` (others are skipped), within 30 s.
async fn next(rx: &mut Receiver<Event>, kind: EventKind) -> Event {
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let e = rx.recv().await.expect("event stream open");
            if e.kind == kind {
                return e;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no {kind:?} event"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_life_is_announced_by_each_part() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    let mut tracked = tracker.metrics.events.subscribe();
    tracker.wait_ready().await;
    let mut c = consumer(&t, Duration::from_secs(30)).await;
    let mut consumed = c.events();
    let s = Scheduler::new(SchedulerConfig::new(brokers(), &t.markers))
        .await
        .unwrap();
    let mut scheduled = s.events();

    // Scheduled, ready, delivered, nacked, retried, delivered again, dead-lettered.
    let id = s
        .send_after(
            ScheduledRecord::to(&t.source).key("life"),
            Duration::from_millis(300),
        )
        .await
        .unwrap();
    let e = next(&mut scheduled, EventKind::Scheduled).await;
    assert_eq!(e.record.to_string(), format!("{}/{id}", t.markers));
    assert_eq!(e.detail, t.source);
    let e = next(&mut tracked, EventKind::Scheduled).await;
    assert_eq!(e.record.offset, id.offset);
    let e = next(&mut tracked, EventKind::Ready).await;
    assert_eq!(
        (e.record.offset, e.detail.as_str()),
        (id.offset, t.source.as_str())
    );

    let d = c.recv_timeout(Duration::from_secs(30)).await.unwrap();
    let source = d.source().clone();
    let e = next(&mut consumed, EventKind::Delivered).await;
    assert_eq!((e.record.clone(), e.attempt), (source.clone(), 1));
    d.nack_after(Duration::ZERO).await.unwrap();
    let e = next(&mut consumed, EventKind::Nacked).await;
    assert_eq!(e.record, source);
    let e = next(&mut tracked, EventKind::Retried).await;
    assert_eq!(
        (e.record.clone(), e.attempt, e.detail.as_str()),
        (source.clone(), 2, "nacked")
    );

    let again = c.recv_timeout(Duration::from_secs(30)).await.unwrap();
    let e = next(&mut consumed, EventKind::Delivered).await;
    assert_eq!(e.attempt, 2);
    let copy = again.source().clone();
    again.reject("no thanks").await.unwrap();
    let e = next(&mut consumed, EventKind::DeadLettered).await;
    assert_eq!(
        (e.record.clone(), e.detail.as_str()),
        (copy.clone(), "no thanks")
    );
    let e = next(&mut tracked, EventKind::DeadLettered).await;
    assert_eq!(e.record, copy);
    assert_eq!(e.detail, "rejected: no thanks");

    // Acked.
    produce(&t.source, Some(0), "plain", b"v", &[]).await;
    let d = c.recv_timeout(Duration::from_secs(30)).await.unwrap();
    let source = d.source().clone();
    d.ack().await.unwrap();
    assert_eq!(next(&mut consumed, EventKind::Acked).await.record, source);

    // Cancelled, seen by the scheduler and by the tracker.
    let doomed = s
        .send_after(ScheduledRecord::to(&t.source), Duration::from_secs(60))
        .await
        .unwrap();
    assert_eq!(s.cancel(doomed).await.unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        next(&mut scheduled, EventKind::Cancelled)
            .await
            .record
            .offset,
        doomed.offset
    );
    assert_eq!(
        next(&mut tracked, EventKind::Cancelled).await.record.offset,
        doomed.offset
    );
    c.close().await.unwrap();
    tracker.stop().await;
}
