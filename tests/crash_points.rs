//! The client killed at each step of the protocol (test-only failpoints, feature `failpoints`):
//! whatever the step, every record is acked in the end. What differs is the duplicates, and each
//! test says which it expects.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::process::Stdio;
use std::time::{Duration, Instant};

use common::*;

const RECORDS: usize = 20;

/// Runs the example worker until the failpoint aborts it, then acks everything with a fresh
/// consumer in the same group. Returns the attempts the fresh consumer saw per key.
async fn crash_at(point: &str, worker_args: &[&str]) -> HashMap<String, Vec<u32>> {
    crash_with(point, worker_args, None).await.0
}

/// [`crash_at`], with the tracker told the workers' group when `hold` is given
/// (`--source-group`, holding copies for at most `hold`); the group then has committed offset 0
/// before the worker starts, as a group that consumed before has. Also returns the tracker's
/// `redelivery_group_holds_total` counts: held, copied after holding because the wait ran
/// out, and copied after holding for any reason.
async fn crash_with(
    point: &str,
    worker_args: &[&str],
    hold: Option<Duration>,
) -> (HashMap<String, Vec<u32>>, f64, f64, f64) {
    let t = topics(1, 1).await;
    let group = unique("workers");
    let mut config = tracker_config(&t, 10);
    if let Some(wait) = hold {
        config.source_group = Some(group.clone());
        config.source_group_wait = wait;
        commit_offset_zero(&t.source, &group);
    }
    let tracker = TrackerGuard::start(config);
    tracker.wait_ready().await;
    produce_many(&t.source, 1, "c", RECORDS).await;
    let mut worker = worker_command(&t, &group)
        .args(["--timeout", "2s"])
        // The killed worker's membership must expire before the fresh consumer below gets its
        // partition: 6 s (the broker's minimum) rather than librdkafka's 45 s default.
        .args(["-X", "session.timeout.ms=6000"])
        .args(worker_args)
        .env("KR_FAILPOINT", point)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let status = loop {
        if let Some(status) = worker.try_wait().unwrap() {
            break status;
        }
        if started.elapsed() > Duration::from_secs(60) {
            worker.kill().unwrap();
            panic!("the worker never reached {point}: was it built with `--features failpoints`? (scripts/test builds it so)");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(
        !status.success(),
        "the worker should have crashed at {point}"
    );

    let mut c = consumer_of(&t.source, &t.markers, &group, Duration::from_secs(30)).await;
    let mut seen: HashMap<String, Vec<u32>> = HashMap::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.len() < RECORDS {
        let left = deadline.saturating_duration_since(Instant::now());
        let d = c
            .recv_timeout(left)
            .await
            .unwrap_or_else(|| panic!("{point}: lost records; got {} of {RECORDS}", seen.len()));
        let key = String::from_utf8_lossy(d.key().unwrap()).into_owned();
        seen.entry(key).or_default().push(d.attempt());
        d.ack().await.unwrap();
    }
    // Anything still due arrives within a few timeouts.
    while let Some(d) = c.recv_timeout(Duration::from_secs(5)).await {
        let key = String::from_utf8_lossy(d.key().unwrap()).into_owned();
        seen.entry(key).or_default().push(d.attempt());
        d.ack().await.unwrap();
    }
    let held = tracker.metric(r#"redelivery_group_holds_total{outcome="held"}"#);
    let holds = |outcome: &str| {
        tracker.metric(&format!(
            "redelivery_group_holds_total{{outcome=\"{outcome}\"}}"
        ))
    };
    let waited = holds("copied_after_wait");
    let copied =
        waited + holds("copied_no_answer") + holds("copied_no_offset") + holds("copied_handed_out");
    tracker.stop().await;
    let duplicates: usize = seen.values().map(|a| a.len() - 1).sum();
    eprintln!("{point}: {RECORDS} records, {duplicates} delivered again after the crash");
    (seen, held, waited, copied)
}

/// Commits offset 0 of `topic`'s partition 0 for `group`, outside any membership.
fn commit_offset_zero(topic: &str, group: &str) {
    use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
    let mut config = rdkafka::ClientConfig::new();
    config
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("enable.auto.commit", "false");
    for (k, v) in &Cluster::shared().settings {
        config.set(k, v);
    }
    let c: BaseConsumer = config.create().unwrap();
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, rdkafka::Offset::Offset(0))
        .unwrap();
    c.commit(&tpl, CommitMode::Sync).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_poll_delivers_each_record_once_more_from_the_source() {
    // Nothing was written or committed: the batch is simply polled again.
    let seen = crash_at("after-poll", &[]).await;
    assert!(seen.values().all(|a| a == &vec![1]), "{seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_start_sent_loses_nothing() {
    // Starts may or may not be durable, nothing is committed: the batch is polled again, and a
    // record whose first Start outlived its timeout can also come back as a copy.
    crash_at("after-start-sent", &[]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_start_durable_loses_nothing() {
    crash_at("after-start-durable", &[]).await;
}

/// With `--source-group`, the Starts of a batch its worker never committed (killed between
/// the durable Starts and the commit) are not copied: the group's next reader, which starts
/// at the committed offset, delivers every record again itself, once. Without the option
/// the tracker's copies come on top (the test above allows them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_start_durable_with_the_source_group_known_delivers_each_record_once() {
    let (seen, held, _, copied) =
        crash_with("after-start-durable", &[], Some(Duration::from_secs(60))).await;
    assert!(seen.values().all(|a| a == &vec![1]), "{seen:?}");
    assert!(held >= 1.0, "the tracker held the due deliveries: {held}");
    assert_eq!(copied, 0.0);
}

/// The hold is bounded: with a wait shorter than the group takes to come back (the dead
/// worker's session lasts 6 s), the copies are made after all, and nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_held_for_the_source_group_is_made_once_the_wait_runs_out() {
    let (seen, held, waited, _) =
        crash_with("after-start-durable", &[], Some(Duration::from_secs(1))).await;
    assert!(held >= 1.0, "{held}");
    assert!(waited >= 1.0, "copied once the wait ran out: {waited}");
    assert!(
        seen.values().any(|a| a.contains(&2)),
        "copies delivered: {seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_commit_leaves_the_batch_to_the_tracker() {
    // Committed but never handed over: those records never come from the source again, only
    // as redelivered copies.
    let seen = crash_at("after-commit", &[]).await;
    let copies: Vec<_> = seen.iter().filter(|(_, a)| a.contains(&2)).collect();
    assert!(
        !copies.is_empty(),
        "the committed batch must come back as copies: {seen:?}"
    );
    for (key, attempts) in copies {
        assert!(
            !attempts.contains(&1),
            "{key} was committed yet polled again: {attempts:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_during_processing_loses_nothing() {
    // The worker holds deliveries and dies before settling any: all come back as copies.
    crash_at("none", &["--crash-after", "5", "--process-time", "1h"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crash_after_end_sent_loses_nothing() {
    // The first ack's End may or may not be durable; every other delivery in hand comes back.
    crash_at("after-end-sent", &[]).await;
}

/// A Start that fails, then a seek back to it that fails too (failpoints `fail:start-once`
/// and `fail:seek`): later batches of that partition used to be committed past the record,
/// whose Start never became durable, so it was lost. Now the partition is held: nothing of it
/// from that record on is committed. The worker is killed while held, and a fresh consumer
/// gets every record.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_start_whose_seek_fails_too_is_never_committed_past() {
    let t = topics(1, 1).await;
    let tracker = TrackerGuard::start(tracker_config(&t, 10));
    tracker.wait_ready().await;
    let group = unique("workers");
    produce_many(&t.source, 1, "first", 10).await;
    let mut worker = ChildGuard(
        worker_command(&t, &group)
            // It never settles: everything it was handed comes back as a copy.
            .args(["--timeout", "2s", "--process-time", "1h"])
            .args(["-X", "session.timeout.ms=6000"])
            .env("KR_FAILPOINT", "fail:start-once,fail:seek")
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file(&group)))
            .spawn()
            .unwrap(),
    );
    // The first batch fails and is held; a second batch arrives while it is.
    tokio::time::sleep(Duration::from_secs(4)).await;
    produce_many(&t.source, 1, "second", 10).await;
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(worker.try_wait().unwrap().is_none(), "the worker exited");
    worker.kill().unwrap();
    worker.wait().unwrap();

    let mut c = consumer_of(&t.source, &t.markers, &group, Duration::from_secs(30)).await;
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while seen.len() < 20 {
        let left = deadline.saturating_duration_since(Instant::now());
        let Some(d) = c.recv_timeout(left).await else {
            panic!("lost records: got {} of 20: {seen:?}", seen.len());
        };
        seen.insert(String::from_utf8_lossy(d.key().unwrap()).into_owned());
        d.ack().await.unwrap();
    }
    c.close().await.unwrap();
    tracker.stop().await;
}
