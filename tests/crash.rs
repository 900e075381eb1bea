//! Real processes killed for real: a worker, a tracker, one of two tracker replicas.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use kafka_redelivery::client::RedeliveryConsumer;
use kafka_redelivery::marker::{decode, Marker};
use rdkafka::message::Message;

fn kill9(child: &mut Child) {
    child.kill().unwrap(); // SIGKILL on Unix
    child.wait().unwrap();
}

fn key_of(d: &kafka_redelivery::client::Delivery) -> String {
    String::from_utf8_lossy(d.key().unwrap()).into_owned()
}

/// Acks deliveries until every key in `want` has been acked; returns the attempts seen per key.
async fn ack_until(
    c: &mut RedeliveryConsumer,
    want: &BTreeSet<String>,
    limit: Duration,
) -> HashMap<String, Vec<u32>> {
    let mut seen: HashMap<String, Vec<u32>> = HashMap::new();
    let deadline = Instant::now() + limit;
    while want.iter().any(|k| !seen.contains_key(k)) {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(d) = c.recv_timeout(left).await else {
            let missing: Vec<_> = want
                .iter()
                .filter(|k| !seen.contains_key(*k))
                .take(10)
                .collect();
            panic!("records never came back: {missing:?} ...");
        };
        seen.entry(key_of(&d)).or_default().push(d.attempt());
        d.ack().await.unwrap();
    }
    seen
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_worker_loses_nothing() {
    let t = topics(2, 2).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 5));
    produce_many(&t.source, 2, "w", 200).await;
    let group = unique("workers");
    let max_unsettled = 40;
    let mut worker = worker_command(&t, &group)
        .args(["--timeout", "3s", "--process-time", "1h", "--log-received"])
        .args(["--max-unsettled", &max_unsettled.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(worker.stdout.take().unwrap()).lines();
    let mut held = BTreeSet::new();
    while held.len() < max_unsettled {
        let line = lines.next().expect("worker output").unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(v["outcome"], "received");
        held.insert(v["key"].as_str().unwrap().to_string());
    }
    // The worker is at its bound: it must not take more while it holds these.
    tokio::time::sleep(Duration::from_secs(1)).await;
    kill9(&mut worker);
    let extra: Vec<String> = lines.map_while(Result::ok).collect();
    assert!(
        extra.is_empty(),
        "worker took {} deliveries past its bound of {max_unsettled}",
        extra.len()
    );

    let mut c = consumer_of(&t.source, &t.markers, &group, Duration::from_secs(30)).await;
    let all: BTreeSet<String> = (0..200).map(|i| format!("w-{i}")).collect();
    let seen = ack_until(&mut c, &all, Duration::from_secs(120)).await;
    for k in &held {
        assert!(
            seen[k].iter().any(|&a| a >= 2),
            "{k} was held by the killed worker but came back as {:?}",
            seen[k]
        );
    }
    tracker.stop().await;
}

/// Reads all markers; returns (timestamp, marker) pairs.
fn markers(topic: &str, at_least: usize) -> Vec<(i64, Marker)> {
    read(topic, at_least, Duration::from_secs(30))
        .into_iter()
        .filter_map(|m| Some((m.timestamp().to_millis()?, decode(m.payload()?).ok()?)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_tracker_restarts_from_its_commit_and_redelivers_only_after_catch_up() {
    let t = topics(1, 1).await;
    // LogAppendTime on the source too, so copies and markers share the broker's clock.
    let source = unique("src-lat");
    create_topic(&source, 1, &[("message.timestamp.type", "LogAppendTime")]).await;
    let group = unique("tracker");
    let (mut a, admin_a) = spawn_restartable_tracker(&t, &group, 5, &group);
    wait_ready_http(&admin_a).await;

    produce_many(&source, 1, "t", 40).await;
    // Version 1 markers, one Start per record: the test reads where in the log B resumed.
    let mut c = consumer_v1_of(&source, &t.markers, &unique("g"), Duration::from_secs(8)).await;
    let mut unacked = BTreeSet::new();
    for _ in 0..40 {
        let d = next_delivery(&mut c, "delivery").await;
        let key = key_of(&d);
        let n: u32 = key[2..].parse().unwrap();
        // The first half is acked, so the oldest Start in flight is half-way through the log.
        if n < 20 {
            d.ack().await.unwrap();
        } else {
            unacked.insert(key);
            d.abandon();
        }
    }
    // Let tracker A commit past the acked Starts, then kill it before any deadline passes.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, body) = http_get(&admin_a, "/metrics").unwrap();
        if metric_sum(&body, "redelivery_in_flight") == 20.0
            && metric_sum(&body, "redelivery_commits_total") >= 2.0
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "tracker A never settled at 20 in flight:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    kill9(&mut a);
    // Every deadline passes while no tracker runs: wait until the newest Start's deadline
    // (its broker timestamp plus the 8 s timeout) is behind us.
    let newest_start = markers(&t.markers, 40)
        .into_iter()
        .filter(|(_, m)| matches!(m, Marker::Start { .. }))
        .map(|(ts, _)| ts)
        .max()
        .expect("the Starts are in the markers topic");
    while now_ms() < newest_start + 8_000 + 500 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let b_started = now_ms();
    let (mut b, admin_b) = spawn_restartable_tracker(&t, &group, 5, &group);

    let seen = ack_until(&mut c, &unacked, Duration::from_secs(120)).await;
    for k in &unacked {
        assert_eq!(
            seen[k],
            vec![2],
            "{k} should be redelivered exactly once, as attempt 2"
        );
    }
    assert!(
        c.recv_timeout(Duration::from_secs(3)).await.is_none(),
        "an acked record was redelivered"
    );

    // No redelivery during catch-up: every copy was appended after B's own Tick.
    let b_tick = markers(&t.markers, 82)
        .into_iter()
        .filter(|(ts, m)| matches!(m, Marker::Tick { .. }) && *ts >= b_started)
        .map(|(ts, _)| ts)
        .min()
        .expect("tracker B wrote a Tick");
    let copies = read(&source, 60, Duration::from_secs(30));
    let copy_times: Vec<i64> = copies
        .iter()
        .filter(|m| header(m, "kr-attempt").is_some())
        .filter_map(|m| m.timestamp().to_millis())
        .collect();
    assert_eq!(copy_times.len(), 20);
    assert!(
        copy_times.iter().all(|&ts| ts >= b_tick),
        "a copy was produced before catch-up ended"
    );

    // B resumed from A's committed offset, the oldest Start still in flight: it read the 20
    // Starts of the unacked half and the 20 Starts of their copies, not the 40 originals.
    let (_, body) = http_get(&admin_b, "/metrics").unwrap();
    let starts_read = metric_value(&body, "redelivery_markers_total{type=\"start\"}");
    assert_eq!(
        starts_read, 40.0,
        "B did not resume from the committed offset"
    );
    sigterm(&b);
    assert!(
        b.wait().unwrap().success(),
        "SIGTERM ends the tracker with exit 0"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn surviving_replica_takes_over_with_nothing_lost() {
    let t = topics(4, 4).await;
    let group = unique("tracker");
    let (mut a, admin_a) = spawn_tracker(&t, &group, 5);
    let (mut b, admin_b) = spawn_tracker(&t, &group, 5);
    wait_ready_http(&admin_a).await;
    wait_ready_http(&admin_b).await;
    // Both replicas own part of the markers topic.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let assigned = |admin: &str| {
            metric_sum(
                &http_get(admin, "/metrics").unwrap().1,
                "redelivery_assigned_partitions",
            )
        };
        if assigned(&admin_a) > 0.0 && assigned(&admin_b) > 0.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the replicas never shared the partitions"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    produce_many(&t.source, 4, "r", 100).await;
    let mut c = consumer(&t, Duration::from_secs(5)).await;
    for _ in 0..100 {
        next_delivery(&mut c, "delivery").await.abandon();
    }
    sigterm(&a);
    assert!(
        a.wait().unwrap().success(),
        "SIGTERM ends the tracker with exit 0"
    );
    let all: BTreeSet<String> = (0..100).map(|i| format!("r-{i}")).collect();
    let seen = ack_until(&mut c, &all, Duration::from_secs(120)).await;
    assert!(seen
        .values()
        .all(|attempts| attempts.iter().all(|&a| a >= 2)));
    let (_, body) = http_get(&admin_b, "/metrics").unwrap();
    assert_eq!(
        metric_sum(&body, "redelivery_assigned_partitions"),
        4.0,
        "B owns every partition"
    );
    kill9(&mut b);
}
