//! Bounded replay: a restarted tracker starts from its last snapshot, not from the oldest item
//! still pending, on the real broker.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use kafka_redelivery::client::{ScheduledRecord, Scheduler, SchedulerConfig};
use kafka_redelivery::tracker::inspect::TrackerView;
use rdkafka::message::Message;

/// A tracker process; `snapshot_after` 0 turns its own snapshots off.
fn tracker(t: &Topics, group: &str, snapshot_after: u64) -> (ChildGuard, AdminAddr) {
    let (mut c, admin) = Cluster::shared().tracker_command(t, group, 5);
    c.args([
        "--snapshot-after-markers",
        &snapshot_after.to_string(),
        "--snapshot-interval",
        "1s",
    ])
    .args(["-X", "session.timeout.ms=6000"]);
    let child = restartable(&mut c, group)
        .stderr(Stdio::from(log_file(group)))
        .spawn()
        .unwrap();
    (ChildGuard(child), admin)
}

fn metrics(admin: &str) -> String {
    http_get(admin, "/metrics").unwrap().1
}

fn view(admin: &str) -> TrackerView {
    serde_json::from_str(&http_get(admin, "/inspect").unwrap().1).unwrap()
}

/// Also: a tracker restarted with snapshots off still restores what the committed snapshot
/// holds, and its commits keep naming it, so a third run with snapshots on holds it too (a
/// tracker without snapshots used to replay from the committed offset and forget both items).
///
/// On Tansu, which drops offset-commit metadata, snapshots are off
/// (`snapshot/metadata_check.rs`): the test then shows that commits stay at the oldest item in
/// flight and every restart replays from there, forgetting nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_replays_only_what_came_after_the_last_snapshot() {
    let tansu = on_tansu();
    let t = topics(1, 1).await;
    create_topic(
        &format!("{}.snapshots", t.markers),
        1,
        &[("cleanup.policy", "compact")],
    )
    .await;
    let group = unique("tracker");
    let (mut first, admin) = tracker(&t, &group, 100);
    wait_ready_http(&admin).await;

    // A long-pending item at the very start of the markers log...
    let s = Scheduler::new(SchedulerConfig::new(brokers(), &t.markers))
        .await
        .unwrap();
    // Tansu writes the 300 acks below far slower: the items must still be pending after them.
    let due_in = Duration::from_secs(if tansu { 150 } else { 45 });
    let scheduled_at = Instant::now();
    let id = s
        .send_after(
            ScheduledRecord::to(&t.source).key("long").payload("later"),
            due_in,
        )
        .await
        .unwrap();
    // ... and a delivery nacked for as long...
    produce(&t.source, Some(0), "nacked", b"later", &[]).await;
    // Version 1 markers: the test needs many markers to snapshot past.
    let mut c = consumer_v1_of(&t.source, &t.markers, &unique("g"), Duration::from_secs(30)).await;
    let d = c.recv_timeout(Duration::from_secs(30)).await.unwrap();
    d.nack_after(due_in).await.unwrap();
    // ... then 300 deliveries acked: 600 markers after them.
    produce_many(&t.source, 1, "r", 300).await;
    for _ in 0..300 {
        c.recv_timeout(Duration::from_secs(30))
            .await
            .expect("delivery")
            .ack()
            .await
            .unwrap();
    }
    c.close().await.unwrap();

    // Wait until a snapshot covering every Start and some Ends (markers 3..=302 are the
    // Starts, 303..=602 the Ends) is committed past the pending items. Snapshots are taken
    // every 100 markers at most once a second, so the last few may stay uncovered.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let committed = view(&admin).partitions[0].committed_offset.unwrap_or(0);
        let body = metrics(&admin);
        let applied = |kind: &str| {
            metric_value(
                &body,
                &format!("redelivery_markers_total{{type=\"{kind}\"}}"),
            )
        };
        if tansu && applied("start") >= 301.0 && applied("end") >= 300.0 {
            // Every End applied, and five commit intervals since: the commit stays at the
            // schedule (a commit is made only when its offset moves).
            tokio::time::sleep(Duration::from_secs(1)).await;
            let body = metrics(&admin);
            assert_eq!(metric_sum(&body, "redelivery_snapshots_total"), 0.0);
            let committed = view(&admin).partitions[0].committed_offset.unwrap_or(0);
            assert!(
                committed <= id.offset,
                "committed {committed} past the schedule"
            );
            break;
        }
        if metric_sum(&body, "redelivery_snapshots_total") >= 1.0 && committed > id.offset + 310 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no snapshot committed; committed offset {committed}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    first.0.kill().unwrap();
    first.0.wait().unwrap();

    // Snapshots off: it still restores from the committed snapshot, and its graceful stop
    // commits the pointer again.
    let (mut second, admin) = tracker(&t, &group, 0);
    wait_ready_http(&admin).await;
    let v = view(&admin);
    assert_eq!(
        (v.partitions[0].scheduled, v.partitions[0].in_flight),
        (1, 1),
        "a tracker with snapshots off forgot what the snapshot holds"
    );
    sigterm(&second.0);
    assert!(second.0.wait().unwrap().success());

    let (_third, admin) = tracker(&t, &group, 100);
    wait_ready_http(&admin).await;
    let body = metrics(&admin);
    let replayed = |kind: &str| {
        metric_value(
            &body,
            &format!("redelivery_markers_total{{type=\"{kind}\"}}"),
        )
    };
    if tansu {
        assert_eq!(replayed("schedule"), 1.0, "replayed from the schedule on");
        assert!(replayed("start") >= 300.0, "and every Start after it");
    } else {
        assert_eq!(
            replayed("schedule"),
            0.0,
            "the schedule was replayed, not restored"
        );
        assert!(
            replayed("start") < 300.0 && replayed("end") < 300.0,
            "replayed {} starts and {} ends of 300",
            replayed("start"),
            replayed("end")
        );
    }
    let v = view(&admin);
    assert_eq!(
        v.partitions[0].scheduled, 1,
        "the restored state holds the schedule"
    );
    assert_eq!(v.partitions[0].in_flight, 1, "and the nacked delivery");

    // And both still fall due, once each (the source holds the original of the nacked one).
    let due_by = scheduled_at + due_in + Duration::from_secs(30);
    loop {
        let arrived = read(&t.source, usize::MAX, Duration::from_secs(2));
        let n = |key: &[u8]| arrived.iter().filter(|m| m.key() == Some(key)).count();
        if (n(b"long") >= 1 && n(b"nacked") >= 2) || Instant::now() > due_by {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Nothing more after a little while: exactly once each.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let arrived = read(&t.source, usize::MAX, Duration::from_secs(10));
    let count = |key: &[u8]| arrived.iter().filter(|m| m.key() == Some(key)).count();
    assert_eq!(
        count(b"long"),
        1,
        "the restored schedule was not delivered exactly once"
    );
    assert_eq!(
        count(b"nacked"),
        2,
        "the nacked delivery was not redelivered exactly once (original + one copy)"
    );
}
