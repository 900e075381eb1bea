//! A secured broker: SASL_SSL with SCRAM-SHA-512 over TLS (certificate made by
//! `scripts/kafka`), the standard authorizer, and only the ACLs the README lists.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use kafka_redelivery::client::{ConsumerConfig, RedeliveryConsumer};
use kafka_redelivery::headers;
use kafka_redelivery::tracker::TrackerConfig;

const TRACKER_PASSWORD: &str = "tracker-Pa55-never-shown";
const WORKER_PASSWORD: &str = "worker-Pa55-never-shown";

fn secured() -> Cluster {
    Cluster::secured(
        "secure",
        &[("tracker", TRACKER_PASSWORD), ("worker", WORKER_PASSWORD)],
    )
}

/// Allows `principal` the `operations` on one resource (`--topic` or `--group` and its name),
/// with Kafka's AclCommand; panics if it fails.
fn acl(cluster: &Cluster, principal: &str, resource: (&str, &str), operations: &[&str]) {
    let principal = format!("User:{principal}");
    let mut args = vec!["acl", "--add", "--allow-principal", &principal];
    for op in operations {
        args.extend(["--operation", op]);
    }
    args.extend([resource.0, resource.1]);
    let out = cluster.script(&args);
    assert!(out.status.success(), "acl {args:?} failed");
}

/// Grants exactly the ACLs of the README's table, for one source topic. With `with_dlq`
/// false, the tracker's Write on the dead-letter topic is left out.
fn grant(cluster: &Cluster, t: &Topics, worker_group: &str, tracker_group: &str, with_dlq: bool) {
    acl(cluster, "worker", ("--topic", &t.source), &["Read"]);
    acl(cluster, "worker", ("--group", worker_group), &["Read"]);
    acl(cluster, "worker", ("--topic", &t.markers), &["Write"]);
    let markers_ops = ["Read", "Write", "DescribeConfigs"];
    acl(cluster, "tracker", ("--topic", &t.markers), &markers_ops);
    acl(cluster, "tracker", ("--group", tracker_group), &["Read"]);
    acl(
        cluster,
        "tracker",
        ("--topic", &t.source),
        &["Read", "Write"],
    );
    if with_dlq {
        grant_dlq(cluster, t);
    }
}

fn grant_dlq(cluster: &Cluster, t: &Topics) {
    acl(cluster, "tracker", ("--topic", &t.dlq), &["Write"]);
}

async fn worker(cluster: &Cluster, t: &Topics, group: &str) -> RedeliveryConsumer {
    let mut config = ConsumerConfig::new(cluster.addr.clone(), group, [&t.source], &t.markers)
        .timeout(Duration::from_secs(2));
    for (k, v) in cluster.user_settings("worker", WORKER_PASSWORD) {
        config = config.set(k, v);
    }
    RedeliveryConsumer::new(config)
        .await
        .expect("consumer created")
}

fn tracker_config(cluster: &Cluster, t: &Topics, group: &str) -> TrackerConfig {
    TrackerConfig {
        group_id: group.to_string(),
        commit_interval: Duration::from_millis(200),
        rdkafka: cluster.user_settings("tracker", TRACKER_PASSWORD),
        ..TrackerConfig::new(cluster.addr.clone(), &t.markers)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_documented_acls_everything_works_and_a_missing_dlq_acl_loses_nothing() {
    let cluster = secured();
    let t = cluster.topics(1, 1).await;
    let (wg, tg) = (unique("workers"), unique("trackers"));
    grant(&cluster, &t, &wg, &tg, false);
    let tracker = TrackerGuard::start(tracker_config(&cluster, &t, &tg));
    tracker.wait_ready().await;
    let mut c = worker(&cluster, &t, &wg).await;

    cluster
        .produce(&t.source, Some(0), "timeout", b"1", &[])
        .await;
    cluster
        .produce(&t.source, Some(0), "reject", b"2", &[])
        .await;
    let first = c.recv().await.unwrap();
    assert_eq!(first.key(), Some(&b"timeout"[..]));
    first.abandon();
    let second = c.recv().await.unwrap();
    second.reject("bad input").await.unwrap();
    let again = c.recv().await.unwrap();
    assert_eq!(again.key(), Some(&b"timeout"[..]));
    assert_eq!(again.attempt(), 2, "redelivered through the secured broker");
    again.ack().await.unwrap();

    // Without Write on the dead-letter topic the rejected record cannot go there: it is
    // counted and parked, still in flight.
    tracker
        .wait_metric("redelivery_parked_deliveries", 1.0)
        .await;
    assert!(tracker.metric("redelivery_produce_errors_total{what=\"dead_letter\"}") >= 1.0);
    assert!(tracker.metric_sum("redelivery_in_flight") >= 1.0);
    assert!(cluster.read(&t.dlq, 1, Duration::from_secs(2)).is_empty());

    // Granting the ACL lets the parked delivery through on its next try.
    grant_dlq(&cluster, &t);
    let dlq = cluster.read(&t.dlq, 1, Duration::from_secs(60));
    assert_eq!(
        dlq.len(),
        1,
        "the parked delivery reached the dead-letter topic"
    );
    assert_eq!(
        header(&dlq[0], headers::DLQ_REASON).as_deref(),
        Some("rejected")
    );
    tracker
        .wait_metric("redelivery_parked_deliveries", 0.0)
        .await;
    c.close().await.unwrap();
    tracker.stop().await;
}

/// The tracker's `run` command as `user` tracker with `password`, its admin server where
/// `admin` says (its args: see `AdminAddr`).
fn tracker_run(
    cluster: &Cluster,
    t: &Topics,
    group: &str,
    password: &str,
    admin: &AdminAddr,
) -> Command {
    let mut c = Command::new(tracker_bin());
    c.args([
        "run",
        "--brokers",
        &cluster.addr,
        "--markers-topic",
        &t.markers,
    ])
    .args(["--group-id", group])
    .args(admin.args());
    let settings: Vec<String> = cluster
        .user_settings("tracker", password)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    // The settings come from the environment, as a deployment would pass a secret.
    c.env("REDELIVERY_RDKAFKA", settings.join(";"))
        .env("RUST_LOG", "debug");
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_password_fails_fast_and_secrets_are_never_shown() {
    let cluster = secured();
    let t = cluster.topics(1, 1).await;
    let tg = unique("trackers");
    grant(&cluster, &t, "unused", &tg, true);

    let wrong = "wrong-Pa55-never-shown";
    let started = Instant::now();
    let out = tracker_run(&cluster, &t, &tg, wrong, &admin_addr())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(77), "{stderr}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?} to give up",
        started.elapsed()
    );
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.contains("authentication") && last.contains(&cluster.addr),
        "{last}"
    );
    assert!(!stderr.contains(wrong), "the password was logged: {stderr}");

    // --help with the secret in the environment.
    let help = tracker_run(&cluster, &t, &tg, TRACKER_PASSWORD, &admin_addr())
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("REDELIVERY_RDKAFKA"));
    assert!(
        !help.contains(TRACKER_PASSWORD),
        "--help shows the password"
    );

    // A working tracker at debug level: logs, /metrics and /inspect.
    let admin = admin_addr();
    let log = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique("secure.log"));
    let mut running = ChildGuard(
        tracker_run(&cluster, &t, &tg, TRACKER_PASSWORD, &admin)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    wait_ready_http(&admin).await;
    let metrics = http_get(&admin, "/metrics").unwrap().1;
    let inspect = http_get(&admin, "/inspect").unwrap().1;
    running.0.kill().unwrap();
    running.0.wait().unwrap();
    let logged = std::fs::read_to_string(&log).unwrap();
    assert!(
        logged.contains("tracker starting") && logged.contains("sasl.password"),
        "the effective configuration is logged at debug level"
    );
    for (what, text) in [
        ("log", &logged),
        ("/metrics", &metrics),
        ("/inspect", &inspect),
    ] {
        assert!(
            !text.contains(TRACKER_PASSWORD),
            "{what} shows the password"
        );
        assert!(
            !text.contains("admin-secret"),
            "{what} shows the key password"
        );
    }
}

/// A tracker missing the ACL on its group, and one missing Read on the markers topic: each
/// ends with exit 77, saying what Kafka refused, instead of staying up unready for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracker_refused_its_group_or_markers_topic_exits_saying_so() {
    let cluster = secured();
    let (no_group, no_read) = (cluster.topics(1, 1).await, cluster.topics(1, 1).await);
    let (ungranted, granted) = (unique("trackers"), unique("trackers"));
    let markers_ops = ["Read", "Write", "DescribeConfigs"];
    acl(
        &cluster,
        "tracker",
        ("--topic", &no_group.markers),
        &markers_ops,
    );
    acl(
        &cluster,
        "tracker",
        ("--topic", &no_read.markers),
        &markers_ops[1..],
    );
    acl(&cluster, "tracker", ("--group", &granted), &["Read"]);

    let runs: Vec<(&str, std::path::PathBuf, ChildGuard)> = [
        (&no_group, &ungranted, "Group authorization failed"),
        (&no_read, &granted, "Topic authorization failed"),
    ]
    .into_iter()
    .map(|(t, group, refused)| {
        let log = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(unique("refused.log"));
        let child = tracker_run(&cluster, t, group, TRACKER_PASSWORD, &admin_addr())
            .env("RUST_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        (refused, log, ChildGuard(child))
    })
    .collect();
    for (refused, log, mut child) in runs {
        // Far beyond the refusal's grace: a bound for a test that would otherwise hang.
        let status = redelivery_testkit::wait::until(
            Duration::from_secs(120),
            Duration::from_millis(100),
            || child.0.try_wait().ok().flatten(),
        );
        let stderr = std::fs::read_to_string(&log).unwrap();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(77),
            "{refused}: {stderr}"
        );
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.contains("refused") && last.contains(refused),
            "the last line names what was refused: {last}"
        );
    }
}
