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

/// Waits until `/readyz` says ready; returns when.
async fn ready_at(admin: &str) -> std::time::Instant {
    wait_ready_http(admin).await;
    std::time::Instant::now()
}

/// A tracker process in `group` with a 6 s session, so a killed replica's partitions move on
/// quickly.
/// A tracker process of `group`; `killed` when the test SIGKILLs it and starts it again
/// ([`restartable`]: one stable member id on Tansu).
fn tracker_process(t: &Topics, group: &str, killed: bool) -> (ChildGuard, AdminAddr) {
    let (mut c, admin) = Cluster::shared().tracker_command(t, group, 5);
    c.args(["-X", "session.timeout.ms=6000"]);
    if killed {
        restartable(&mut c, group);
    }
    let child = c
        .stderr(std::process::Stdio::from(log_file(group)))
        .spawn()
        .unwrap();
    (ChildGuard(child), admin)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_pending_through_a_tracker_sigkill_each_arrive_exactly_once() {
    const N: usize = 3000;
    let t = topics(4, 4).await;
    let group = unique("tracker");
    let start_tracker = || tracker_process(&t, &group, true);
    let (mut tracker, admin) = start_tracker();
    wait_ready_http(&admin).await;
    let s = scheduler(&t).await;

    // Due at random times over 3..23 s, so some are being published when the kill comes.
    let sent_at = now_ms();
    let delays: Vec<u64> = (0..N)
        .map(|_| rand::random::<u64>() % 20_000 + 3_000)
        .collect();
    let sends = delays.iter().enumerate().map(|(i, &d)| {
        let s = s.clone();
        let record = ScheduledRecord::to(&t.source)
            .key(format!("s-{i}"))
            .payload(format!("{d}"));
        async move { s.send_after(record, Duration::from_millis(d)).await }
    });
    for r in futures::future::join_all(sends).await {
        r.unwrap();
    }

    // Killed while publishing: once a fifth is out, with most still pending.
    wait_metric_http(&admin, "redelivery_schedules_published_total", |n| {
        n >= (N / 5) as f64
    })
    .await;
    tracker.0.kill().unwrap();
    let killed = std::time::Instant::now();
    tracker.0.wait().unwrap();
    // The downtime itself: schedules fall due while no tracker runs.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (_tracker, admin) = start_tracker();
    let down = ready_at(&admin).await.duration_since(killed);

    let got = read(&t.source, N, Duration::from_secs(120));
    // A schedule is published before its End is written; once none is pending, nothing more
    // can be published, so a duplicate would be in the topic now.
    wait_metric_http(&admin, "redelivery_schedules_pending", |n| n == 0.0).await;
    let all = read(&t.source, N + 1, Duration::from_secs(5));
    assert!(got.len() >= N, "only {} of {N} arrived", got.len());
    let mut seen = std::collections::HashMap::new();
    for m in &all {
        *seen
            .entry(String::from_utf8_lossy(m.key().unwrap()).into_owned())
            .or_insert(0) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
    assert_eq!(seen.len(), N, "some schedules never arrived");
    assert!(twice.is_empty(), "published more than once: {twice:?}");

    // None is late by more than the tracker's downtime plus a small bound. A record's due
    // time is at most `sent_at + delay` later than this lower bound, so lateness is overstated.
    // On Tansu a read by offset inside a producer batch takes seconds (it answers such a
    // fetch with the next batch, or nothing; `source_reader.rs` looks back), and the 3,000
    // schedules sit in large batches: README "Tested brokers" gives the lateness measured.
    let slack = Duration::from_secs(if on_tansu() { 30 } else { 5 });
    let bound = down + slack;
    let (mut latest, mut early) = (0i64, 0);
    for m in &all {
        let delay: i64 = std::str::from_utf8(m.payload().unwrap())
            .unwrap()
            .parse()
            .unwrap();
        let arrived = m.timestamp().to_millis().unwrap();
        let late = arrived - (sent_at + delay);
        latest = latest.max(late);
        if late < 0 {
            early += 1;
        }
    }
    assert_eq!(early, 0, "records arrived before their due time");
    assert!(
        latest <= bound.as_millis() as i64,
        "latest was {latest} ms late; the tracker was down {down:?}"
    );
    println!("down {down:?}, latest {latest} ms late");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracker_killed_between_publishing_and_its_end_does_not_publish_twice() {
    const N: usize = 50;
    let t = topics(2, 1).await;
    let group = unique("tracker");
    let tracker = |failpoint: Option<&str>| {
        let (mut c, admin) = Cluster::shared().tracker_command(&t, &group, 5);
        c.args(["-X", "session.timeout.ms=6000"]);
        restartable(&mut c, &group).stderr(std::process::Stdio::from(log_file(&group)));
        if let Some(point) = failpoint {
            c.env("KR_FAILPOINT", point);
        }
        (ChildGuard(c.spawn().unwrap()), admin)
    };
    let (mut doomed, admin) = tracker(Some("after-publish-durable"));
    wait_ready_http(&admin).await;
    let s = scheduler(&t).await;
    for i in 0..N {
        s.send_after(
            ScheduledRecord::to(&t.source).key(format!("k-{i}")),
            Duration::from_millis(1_000),
        )
        .await
        .unwrap();
    }
    let status = tokio::task::spawn_blocking(move || doomed.0.wait().unwrap())
        .await
        .unwrap();
    assert!(!status.success(), "the failpoint did not fire");
    let first = read(&t.source, 1, Duration::from_secs(10)).len();
    assert!(first > 0, "nothing was published before the crash");

    let (_tracker, admin) = tracker(None);
    wait_ready_http(&admin).await;
    let got = read(&t.source, N, Duration::from_secs(60));
    wait_metric_http(&admin, "redelivery_schedules_pending", |n| n == 0.0).await;
    let all = read(&t.source, N + 1, Duration::from_secs(5));
    assert_eq!(got.len(), N);
    assert_eq!(all.len(), N, "a schedule was published twice");
    let body = http_get(&admin, "/metrics").unwrap().1;
    assert!(
        metric_sum(&body, "redelivery_schedules_already_published_total") > 0.0,
        "the restarted tracker did not recognise what its predecessor published"
    );
}

/// A rolling restart: of two replicas, one is stopped gracefully and started again while
/// hundreds of schedules fall due. A revoked partition's queued and parked work is dropped
/// before the partition is given up (`fence`), so the replica taking it over is the only one
/// to publish: each schedule arrives exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_restart_of_two_replicas_publishes_each_schedule_once() {
    const N: usize = 600;
    let t = topics(4, 4).await;
    let group = unique("tracker");
    let start_tracker = || tracker_process(&t, &group, false);
    let (mut a, admin_a) = start_tracker();
    let (_b, admin_b) = start_tracker();
    wait_ready_http(&admin_a).await;
    wait_ready_http(&admin_b).await;
    let s = scheduler(&t).await;
    let sends = (0..N).map(|i| {
        let s = s.clone();
        let delay = Duration::from_millis(rand::random::<u64>() % 10_000 + 3_000);
        let record = ScheduledRecord::to(&t.source).key(format!("r-{i}"));
        async move { s.send_after(record, delay).await }
    });
    for r in futures::future::join_all(sends).await {
        r.unwrap();
    }
    // Stopped while schedules fall due: once a quarter is out.
    let published = |admin: &str| {
        http_get(admin, "/metrics").map_or(0.0, |(_, b)| {
            metric_sum(&b, "redelivery_schedules_published_total")
        })
    };
    while published(&admin_a) + published(&admin_b) < (N / 4) as f64 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    sigterm(&a.0);
    assert!(a.0.wait().unwrap().success(), "graceful stop");
    let (_a, admin_a) = start_tracker();
    wait_ready_http(&admin_a).await;

    let got = read(&t.source, N, Duration::from_secs(60));
    for admin in [&admin_a, &admin_b] {
        wait_metric_http(admin, "redelivery_schedules_pending", |n| n == 0.0).await;
    }
    let all = read(&t.source, N + 1, Duration::from_secs(5));
    assert!(got.len() >= N, "only {} of {N} arrived", got.len());
    let mut seen = std::collections::HashMap::new();
    for m in &all {
        let id = header(m, kafka_redelivery::headers::SCHEDULE_ID).unwrap();
        *seen.entry(id).or_insert(0) += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, &n)| n > 1).collect();
    assert_eq!(seen.len(), N, "some schedules never arrived");
    assert!(twice.is_empty(), "published more than once: {twice:?}");
}
