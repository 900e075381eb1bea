//! The broker away: unreachable when the tracker starts, and gone for a minute mid-run.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::io::Read;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

/// Forwards every connection on `listen` to `target`, from the moment it is called.
async fn proxy(listen: u16, target: String) {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", listen))
        .await
        .unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            let target = target.clone();
            tokio::spawn(async move {
                if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
}

fn log_text(path: &std::path::Path) -> String {
    let mut s = String::new();
    std::fs::File::open(path)
        .unwrap()
        .read_to_string(&mut s)
        .unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracker_started_before_its_broker_waits_unready_then_works() {
    let t = topics(1, 1).await;
    // Nothing listens on this port until the proxy opens it.
    let port = free_port();
    let log = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique("late.log"));
    let admin = admin_addr();
    let mut tracker = ChildGuard(
        std::process::Command::new(tracker_bin())
            .args(["run", "--brokers", &format!("127.0.0.1:{port}")])
            .args(["--markers-topic", &t.markers])
            .args(admin.args())
            .args([
                "--group-id",
                &unique("tracker"),
                "--commit-interval",
                "200ms",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while !log_text(&log).contains("cannot reach Kafka yet") {
        assert!(
            Instant::now() < deadline,
            "no retry logged: {}",
            log_text(&log)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(tracker.try_wait().unwrap().is_none(), "the tracker gave up");
    assert_eq!(http_get(&admin, "/healthz").map(|r| r.0), Some(200));
    assert_eq!(http_get(&admin, "/readyz").map(|r| r.0), Some(503));
    assert!(
        log_text(&log).contains(&format!("127.0.0.1:{port}")),
        "the log names the address tried"
    );

    proxy(port, brokers()).await;
    wait_ready_http(&admin).await;
    assert!(log_text(&log).contains("Kafka reached"));
    let mut c = consumer(&t, Duration::from_secs(2)).await;
    produce(&t.source, Some(0), "late", b"v", &[]).await;
    c.recv().await.unwrap().abandon();
    let again = c.recv().await.unwrap();
    assert_eq!(again.attempt(), 2, "redelivered by the late tracker");
    again.ack().await.unwrap();
    c.close().await.unwrap();
}

/// Keys the worker logged as acked so far.
fn acked(path: &std::path::Path) -> BTreeSet<String> {
    log_text(path)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["outcome"] == "ack")
        .filter_map(|v| v["key"].as_str().map(str::to_string))
        .collect()
}

async fn wait_acked(path: &std::path::Path, want: &BTreeSet<String>, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let got = acked(path);
        let missing: Vec<&String> = want.difference(&got).collect();
        if missing.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never acked, e.g. {:?}",
            missing.len(),
            &missing[..missing.len().min(5)]
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_gone_for_a_minute_loses_nothing() {
    let outage = Duration::from_secs(
        std::env::var("OUTAGE_SECS")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(60),
    );
    let cluster = Cluster::private("outage");
    let t = cluster.topics(2, 2).await;
    let (mut tracker, admin) = cluster.spawn_tracker(&t, &unique("tracker"), 10);
    wait_ready_http(&admin).await;
    let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique("outage.jsonl"));
    let mut worker = ChildGuard(
        cluster
            .worker_command(&t, &unique("workers"))
            .args([
                "--timeout",
                "3s",
                "--unsettled-rate",
                "0.1",
                "--log-received",
            ])
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(Stdio::from(log_file("outage-worker")))
            .spawn()
            .unwrap(),
    );
    cluster.produce_many(&t.source, 2, "before", 200).await;
    let before: BTreeSet<String> = (0..200).map(|i| format!("before-{i}")).collect();
    // Some are still unsettled and due when the broker goes.
    tokio::time::sleep(Duration::from_secs(2)).await;

    cluster.stop();
    tokio::time::sleep(outage).await;
    assert!(tracker.try_wait().unwrap().is_none(), "tracker exited");
    assert!(worker.try_wait().unwrap().is_none(), "worker exited");
    cluster.resume();

    cluster.produce_many(&t.source, 2, "after", 200).await;
    let mut all = before;
    all.extend((0..200).map(|i| format!("after-{i}")));
    wait_acked(&out, &all, Duration::from_secs(180)).await;
    wait_ready_http(&admin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracker_whose_broker_is_gone_still_stops_on_sigterm() {
    let cluster = Cluster::private("gone");
    let t = cluster.topics(2, 2).await;
    let (mut tracker, admin) = cluster.spawn_tracker(&t, &unique("tracker"), 10);
    wait_ready_http(&admin).await;
    // Something in flight, so the final commit has work to do.
    cluster.produce_many(&t.source, 2, "gone", 20).await;
    let mut c = cluster
        .consumer_of(&t.source, &t.markers, &unique("g"), Duration::from_secs(60))
        .await;
    for _ in 0..20 {
        next_delivery(&mut c, "delivery").await.abandon();
    }
    cluster.kill();
    // Long enough for every client to see the broker as down.
    tokio::time::sleep(Duration::from_secs(15)).await;
    sigterm(&tracker);
    // Generous: the point is that it ends at all, not how fast.
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(status) = tracker.try_wait().unwrap() {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "the tracker did not exit 90 s after SIGTERM with its broker gone"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(status.success(), "exit status {status}");
    drop(c);
}
