//! A rolling upgrade half done: one worker writes marker format version 1, another version 2,
//! in one consumer group, against one tracker. Every record ends acked or dead-lettered.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;
use rdkafka::message::Message;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn v1_and_v2_workers_share_one_tracker_and_lose_nothing() {
    let t = topics(4, 2).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 3));
    tracker.wait_ready().await;
    let n = 400;
    let group = unique("upgrade");
    let (tx, rx) = std::sync::mpsc::channel::<(&'static str, String, String)>();
    let mut workers = Vec::new();
    for format in ["v1", "v2"] {
        let mut child = ChildGuard(
            worker_command(&t, &group)
                .args(["--timeout", "2s", "--marker-format", format])
                .args(["--unsettled-rate", "0.15", "--nack-rate", "0.1"])
                .args(["--reject-rate", "0.05"])
                .stdout(Stdio::piped())
                .stderr(log_file(&format!("upgrade-{format}")))
                .spawn()
                .unwrap(),
        );
        let out = child.0.stdout.take().unwrap();
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let v: serde_json::Value = serde_json::from_str(&line).unwrap();
                let key = v["key"].as_str().unwrap_or_default().to_string();
                let outcome = v["outcome"].as_str().unwrap_or_default().to_string();
                let _ = tx.send((format, key, outcome));
            }
        });
        workers.push(child);
    }
    let mut acked = BTreeSet::new();
    let mut acks_by_format: HashMap<&str, usize> = HashMap::new();
    let drain = |acked: &mut BTreeSet<String>, acks: &mut HashMap<&str, usize>| {
        while let Ok((format, key, outcome)) = rx.try_recv() {
            if outcome == "ack" {
                acked.insert(key);
                *acks.entry(format).or_default() += 1;
            }
        }
    };
    // The second worker may join after the first has taken every partition: produce in small
    // waves until both have acked something, so the test does not depend on how fast the group
    // rebalances (one worker once consumed all 400 records before the other was assigned).
    let mut produced = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while acks_by_format.len() < 2 {
        assert!(
            Instant::now() < deadline,
            "both workers must have worked within 60 s: {acks_by_format:?}"
        );
        produce_range(&t.source, 4, "u", produced..produced + 20).await;
        produced += 20;
        tokio::time::sleep(Duration::from_millis(500)).await;
        drain(&mut acked, &mut acks_by_format);
    }
    if produced < n {
        produce_range(&t.source, 4, "u", produced..n).await;
        produced = n;
    }
    let n = produced;

    let all: BTreeSet<String> = (0..n).map(|i| format!("u-{i}")).collect();
    let deadline = Instant::now() + Duration::from_secs(120);
    let dead: BTreeSet<String> = loop {
        drain(&mut acked, &mut acks_by_format);
        let dead_lettered = tracker.metric_sum("redelivery_dead_lettered_total") as usize;
        if acked.len() + dead_lettered >= n {
            let dead: BTreeSet<String> = read(&t.dlq, dead_lettered, Duration::from_secs(10))
                .iter()
                .filter_map(|m| m.key().map(|k| String::from_utf8_lossy(k).into_owned()))
                .collect();
            if all.iter().all(|k| acked.contains(k) || dead.contains(k)) {
                break dead;
            }
        }
        assert!(
            Instant::now() < deadline,
            "not settled within 120 s: {} acked, {dead_lettered} dead-lettered of {n}",
            acked.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert!(!dead.is_empty(), "rejects reach the dead-letter topic");
    // The tracker read both formats from one markers topic.
    assert!(tracker.metric("redelivery_markers_total{type=\"start\"}") > 0.0);
    assert!(tracker.metric("redelivery_markers_total{type=\"start_batch\"}") > 0.0);
    assert!(tracker.metric("redelivery_markers_total{type=\"settle\"}") > 0.0);
    assert_eq!(tracker.metric_sum("redelivery_marker_errors_total"), 0.0);
    drop(workers);
    tracker.stop().await;
}
