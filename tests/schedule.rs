//! Delayed and scheduled delivery, and cancel, on the real broker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::*;
use kafka_redelivery::client::{
    CancelOutcome, ClientError, ScheduleId, ScheduledRecord, Scheduler, SchedulerConfig,
};
use kafka_redelivery::headers;
use rdkafka::message::{Headers, Message};

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

async fn scheduler(t: &Topics) -> Scheduler {
    let config = SchedulerConfig::new(brokers(), &t.markers);
    Scheduler::new(config).await.expect("scheduler")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_record_arrives_after_its_delay_whole() {
    let t = topics(2, 2).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    let s = scheduler(&t).await;

    let before = now_ms();
    let record = ScheduledRecord::to(&t.source)
        .key("k-1")
        .payload(b"\x00binary\xffpayload".to_vec())
        .partition(1)
        .header("trace", "abc")
        .header("empty", "");
    let id = s
        .send_after(record, Duration::from_millis(1500))
        .await
        .unwrap();
    let got = read(&t.source, 1, Duration::from_secs(30));
    assert_eq!(got.len(), 1, "the record never arrived");
    let m = &got[0];
    let arrived = m.timestamp().to_millis().unwrap();
    assert!(
        arrived >= before + 1500,
        "arrived {} ms after sending, before its 1500 ms delay",
        arrived - before
    );
    assert_eq!(m.key(), Some(&b"k-1"[..]));
    assert_eq!(m.payload(), Some(&b"\x00binary\xffpayload"[..]));
    assert_eq!(m.partition(), 1);
    assert_eq!(header(m, "trace").as_deref(), Some("abc"));
    assert_eq!(header(m, "empty").as_deref(), Some(""));
    assert_eq!(
        header(m, headers::SCHEDULE_ID),
        Some(format!("{}/{id}", t.markers)),
        "the delivered record names its schedule"
    );
    let names: Vec<String> = m
        .headers()
        .unwrap()
        .iter()
        .map(|h| h.key.to_string())
        .collect();
    assert_eq!(names, ["trace", "empty", headers::SCHEDULE_ID]);
    tracker
        .wait_metric(
            &format!(
                "redelivery_schedules_published_total{{topic=\"{}\"}}",
                t.source
            ),
            1.0,
        )
        .await;
    assert_eq!(s.cancel(id).await.unwrap(), CancelOutcome::AlreadyDelivered);
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_scheduled_at_a_time_arrives_then() {
    let t = topics(1, 2).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    let s = scheduler(&t).await;
    let at = SystemTime::now() + Duration::from_secs(3);
    let at_ms = at.duration_since(UNIX_EPOCH).unwrap().as_millis() as i64;
    s.send_at(ScheduledRecord::to(&t.source).key("at").payload("x"), at)
        .await
        .unwrap();
    // One in the past goes out at once.
    s.send_at(
        ScheduledRecord::to(&t.source).key("past").payload("y"),
        SystemTime::now() - Duration::from_secs(60),
    )
    .await
    .unwrap();
    let got = read(&t.source, 2, Duration::from_secs(30));
    assert_eq!(got.len(), 2);
    let by_key = |k: &[u8]| got.iter().find(|m| m.key() == Some(k)).unwrap();
    let at_arrival = by_key(b"at").timestamp().to_millis().unwrap();
    assert!(
        at_arrival >= at_ms,
        "arrived {} ms early",
        at_ms - at_arrival
    );
    let past_arrival = by_key(b"past").timestamp().to_millis().unwrap();
    assert!(past_arrival < at_arrival, "the past one waited");
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_record_never_arrives_and_every_cancel_gets_an_answer() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    tracker.wait_ready().await;
    let s = scheduler(&t).await;
    let doomed = s
        .send_after(
            ScheduledRecord::to(&t.source).key("doomed"),
            Duration::from_secs(3),
        )
        .await
        .unwrap();
    let kept = s
        .send_after(
            ScheduledRecord::to(&t.source).key("kept"),
            Duration::from_secs(4),
        )
        .await
        .unwrap();
    assert_eq!(s.cancel(doomed).await.unwrap(), CancelOutcome::Cancelled);
    assert_eq!(
        s.cancel(doomed).await.unwrap(),
        CancelOutcome::AlreadyCancelled
    );
    // Past both due times: only the kept one arrives.
    let got = read(&t.source, 2, Duration::from_secs(12));
    let keys: Vec<&[u8]> = got.iter().filter_map(|m| m.key()).collect();
    assert_eq!(keys, [&b"kept"[..]]);
    tracker
        .wait_metric("redelivery_schedules_cancelled_total", 1.0)
        .await;
    assert_eq!(
        s.cancel(kept).await.unwrap(),
        CancelOutcome::AlreadyDelivered
    );
    assert_eq!(
        s.cancel(doomed).await.unwrap(),
        CancelOutcome::AlreadyCancelled
    );

    // Ids that name no schedule: past the end, and a marker that is not a Schedule (the
    // tracker's Tick at offset 0).
    let beyond = ScheduleId {
        partition: 0,
        offset: 1_000_000,
    };
    assert_eq!(s.cancel(beyond).await.unwrap(), CancelOutcome::NotFound);
    let tick = ScheduleId {
        partition: 0,
        offset: 0,
    };
    assert_eq!(s.cancel(tick).await.unwrap(), CancelOutcome::NotFound);
    tracker.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delay_beyond_the_markers_retention_is_refused_clearly() {
    let markers = unique("short.markers");
    create_topic(
        &markers,
        1,
        &[
            ("message.timestamp.type", "LogAppendTime"),
            ("retention.ms", "600000"),
        ],
    )
    .await;
    let s = Scheduler::new(SchedulerConfig::new(brokers(), &markers))
        .await
        .unwrap();
    assert_eq!(s.horizon(), Some(Duration::from_secs(540)));
    let err = s
        .send_after(ScheduledRecord::to("anywhere"), Duration::from_secs(3600))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ClientError::BeyondRetention { .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains(&markers) && text.contains("600s"),
        "the error names the topic and its retention: {text}"
    );
    let err = s
        .send_at(
            ScheduledRecord::to("anywhere"),
            SystemTime::now() + Duration::from_secs(3600),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::BeyondRetention { .. }));
    // Within the horizon is fine.
    s.send_after(ScheduledRecord::to("anywhere"), Duration::from_secs(500))
        .await
        .unwrap();

    let missing = Scheduler::new(SchedulerConfig::new(brokers(), unique("nope")))
        .await
        .err()
        .expect("a missing markers topic is refused");
    assert!(
        matches!(missing, ClientError::MarkersTopic { .. }),
        "{missing:?}"
    );
}
