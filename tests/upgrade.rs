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
    produce_many(&t.source, 4, "u", n).await;

    let all: BTreeSet<String> = (0..n).map(|i| format!("u-{i}")).collect();
    let mut acked = BTreeSet::new();
    let mut acks_by_format: HashMap<&str, usize> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    let dead: BTreeSet<String> = loop {
        while let Ok((format, key, outcome)) = rx.try_recv() {
            if outcome == "ack" {
                acked.insert(key);
                *acks_by_format.entry(format).or_default() += 1;
            }
        }
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
    assert!(
        acks_by_format.get("v1").is_some_and(|&a| a > 0)
            && acks_by_format.get("v2").is_some_and(|&a| a > 0),
        "both workers must have worked: {acks_by_format:?}"
    );
    assert!(!dead.is_empty(), "rejects reach the dead-letter topic");
    // The tracker read both formats from one markers topic.
    assert!(tracker.metric("redelivery_markers_total{type=\"start\"}") > 0.0);
    assert!(tracker.metric("redelivery_markers_total{type=\"start_batch\"}") > 0.0);
    assert!(tracker.metric("redelivery_markers_total{type=\"settle\"}") > 0.0);
    assert_eq!(tracker.metric_sum("redelivery_marker_errors_total"), 0.0);
    drop(workers);
    tracker.stop().await;
}
