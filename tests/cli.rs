//! The `redelivery-tracker` binary as an operator meets it: flags, topic creation, start-up
//! checks and the admin endpoints.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::process::{Command, Output};
use std::time::Duration;

use common::*;
use rdkafka::admin::{AdminClient, AdminOptions, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::ClientConfig;

fn tracker(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(tracker_bin());
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_flags_give_one_line_naming_the_flag_and_exit_64() {
    type Case<'a> = (Vec<&'a str>, Vec<(&'a str, &'a str)>, &'a str);
    let cases: Vec<Case> = vec![
        (
            vec!["run", "--markers-topic", "m", "--max-deliveries", "0"],
            vec![],
            "--max-deliveries",
        ),
        (
            // More than the tracker can count: the limit would never be reached.
            vec!["run", "--markers-topic", "m", "--max-deliveries", "8192"],
            vec![],
            "--max-deliveries",
        ),
        (
            vec!["run", "--markers-topic", "m", "--commit-interval", "soon"],
            vec![],
            "--commit-interval",
        ),
        (
            vec!["run", "--markers-topic", "m", "-X", "novalue"],
            vec![],
            "-X",
        ),
        (
            vec!["run", "--markers-topic", "m", "--admin-listen", "nowhere"],
            vec![],
            "--admin-listen",
        ),
        (
            vec!["run", "--markers-topic", "m", "--source-group", " "],
            vec![],
            "--source-group",
        ),
        (
            vec!["run", "--markers-topic", "m"],
            vec![("REDELIVERY_SOURCE_GROUP_WAIT", "a while")],
            "--source-group-wait",
        ),
        (vec!["run"], vec![], "--markers-topic"),
        (
            vec!["run", "--markers-topic", "m"],
            vec![("REDELIVERY_MAX_DELIVERIES", "many")],
            "--max-deliveries",
        ),
        (
            vec!["run", "--markers-topic", "m"],
            vec![("REDELIVERY_LOG_FORMAT", "xml")],
            "--log-format",
        ),
        (vec!["demo", "--fail-rate", "2"], vec![], "--fail-rate"),
        (vec!["frobnicate"], vec![], "frobnicate"),
    ];
    for (args, env, flag) in cases {
        let out = tracker(&args, &env);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(64), "{args:?} {env:?}: {err}");
        assert_eq!(
            err.trim().lines().count(),
            1,
            "{args:?}: not one line: {err}"
        );
        assert!(err.contains(flag), "{args:?}: {err} does not name {flag}");
    }
}

#[test]
fn help_lists_every_run_flag_with_its_environment_variable() {
    let out = tracker(&["run", "--help"], &[]);
    assert!(out.status.success());
    let help = String::from_utf8_lossy(&out.stdout);
    for env in [
        "REDELIVERY_BROKERS",
        "REDELIVERY_MARKERS_TOPIC",
        "REDELIVERY_GROUP_ID",
        "REDELIVERY_ADMIN_LISTEN",
        "REDELIVERY_MAX_DELIVERIES",
        "REDELIVERY_DLQ_TOPIC",
        "REDELIVERY_LOG_FORMAT",
        "REDELIVERY_RDKAFKA",
        "REDELIVERY_COMMIT_INTERVAL",
    ] {
        assert!(help.contains(env), "--help does not mention {env}");
    }
}

async fn topic_config(topic: &str) -> Vec<(String, String)> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .create()
        .unwrap();
    let r = admin
        .describe_configs(&[ResourceSpecifier::Topic(topic)], &AdminOptions::new())
        .await
        .unwrap();
    let resource = r.into_iter().next().unwrap().unwrap();
    resource
        .entries
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect()
}

#[test]
fn sigterm_while_kafka_is_out_of_reach_stops_the_tracker_cleanly_at_once() {
    // The start-up check waits up to 10 s a round for a broker; a stop asked meanwhile must
    // neither wait for the round nor kill the process by the signal's default action (an
    // orchestrator reports exit-by-signal as a failure).
    for _ in 0..3 {
        let admin = admin_addr();
        let nowhere = format!("127.0.0.1:{}", free_port());
        let mut child = Command::new(tracker_bin())
            .args(["run", "--brokers", &nowhere, "--markers-topic", "m"])
            .args(admin.args())
            .stderr(std::process::Stdio::from(log_file("sigterm-unreachable")))
            .spawn()
            .unwrap();
        admin
            .wait(Some(&mut child), Duration::from_secs(30))
            .unwrap();
        // Well inside the first round of asking for the broker.
        std::thread::sleep(Duration::from_millis(300));
        sigterm(&child);
        let status = redelivery_testkit::wait::until(
            Duration::from_secs(5),
            Duration::from_millis(20),
            || child.try_wait().unwrap(),
        );
        let _ = child.kill();
        let status = status.expect("the tracker was still running 5 s after SIGTERM");
        assert!(status.success(), "the tracker stopped with {status}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topics_create_sets_what_the_tracker_needs() {
    let source = unique("src");
    let markers = format!("{source}.markers");
    let args = [
        "topics",
        "create",
        "--brokers",
        &brokers(),
        "--markers-topic",
        &markers,
        "--partitions",
        "3",
        "--retention",
        "2d",
        "--source-topic",
        &source,
    ];
    let out = tracker(&args, &[]);
    assert!(out.status.success(), "{}", stderr(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains(&format!("created {markers}")), "{stdout}");
    assert!(
        stdout.contains(&format!("created {source}.dlq")),
        "{stdout}"
    );
    let config = topic_config(&markers).await;
    let get = |k: &str| config.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
    assert_eq!(
        get("message.timestamp.type").as_deref(),
        Some("LogAppendTime")
    );
    assert_eq!(get("retention.ms").as_deref(), Some("172800000"));
    assert_eq!(get("cleanup.policy").as_deref(), Some("delete"));
    // Running it again changes nothing and says so.
    let again = tracker(&args, &[]);
    assert!(again.status.success());
    assert!(String::from_utf8_lossy(&again.stdout).contains(&format!("exists  {markers}")));
}

#[test]
fn run_refuses_a_missing_markers_topic() {
    let missing = unique("missing");
    let out = tracker(
        &[
            "run",
            "--brokers",
            &brokers(),
            "--markers-topic",
            &missing,
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(78), "{}", stderr(&out));
    assert!(stderr(&out).contains(&missing));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_refuses_a_create_time_markers_topic_unless_allowed() {
    let markers = unique("markers-ct");
    create_topic(&markers, 1, &[("message.timestamp.type", "CreateTime")]).await;
    let out = tracker(
        &[
            "run",
            "--brokers",
            &brokers(),
            "--markers-topic",
            &markers,
            "--admin-listen",
            "127.0.0.1:0",
        ],
        &[],
    );
    assert_eq!(out.status.code(), Some(78));
    assert!(stderr(&out).contains("LogAppendTime"), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--allow-create-time"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoints_answer_and_change_nothing() {
    let t = topics(1, 1).await;
    let (mut child, admin) = spawn_tracker(&t, &unique("tracker"), 5);
    wait_ready_http(&admin).await;
    assert_eq!(http_get(&admin, "/healthz").unwrap().0, 200);
    assert_eq!(http_get(&admin, "/nothing").unwrap().0, 404);
    let (status, body) = http_get(&admin, "/metrics").unwrap();
    assert_eq!(status, 200);
    for family in [
        "redelivery_markers_total",
        "redelivery_in_flight",
        "redelivery_oldest_in_flight_age_seconds",
        "redelivery_ready",
        "redelivery_deadline_lag_seconds_bucket",
        "redelivery_commits_total",
        "redelivery_commit_failures_total",
    ] {
        assert!(body.contains(family), "/metrics lacks {family}");
    }
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(&*admin).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(
        s,
        "POST /readyz HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    s.read_to_string(&mut reply).unwrap();
    assert!(reply.starts_with("HTTP/1.1 405"), "{reply}");
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inspect_shows_what_a_running_tracker_holds() {
    let t = topics(2, 2).await;
    let (mut child, admin) = spawn_tracker(&t, &unique("tracker"), 5);
    wait_ready_http(&admin).await;
    produce_many(&t.source, 2, "i", 6).await;
    let mut c = consumer(&t, Duration::from_secs(120)).await;
    let mut held = Vec::new();
    for _ in 0..6 {
        held.push(next_delivery(&mut c, "delivery").await);
    }
    // The view refreshes every commit interval; wait until it shows all six.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let view = loop {
        let out = tracker(&["inspect", "--admin", &admin, "--json"], &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let in_flight: u64 = v["partitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["in_flight"].as_u64().unwrap())
            .sum();
        if in_flight == 6 {
            break v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "inspect never showed 6 in flight: {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(view["ready"], true);
    for p in view["partitions"].as_array().unwrap() {
        if p["in_flight"].as_u64().unwrap() > 0 {
            let next = p["next_deadlines_in_ms"].as_array().unwrap();
            assert!(!next.is_empty(), "{p}");
            // Two-minute timeouts: the next deadline is still ahead.
            assert!(next[0].as_i64().unwrap() > 60_000, "{p}");
            let oldest = p["oldest"].as_str().unwrap();
            assert!(oldest.starts_with(&format!("{}/", t.source)), "{p}");
        }
    }
    let table = tracker(&["inspect", "--admin", &admin], &[]);
    let text = String::from_utf8_lossy(&table.stdout);
    assert!(text.starts_with("PARTITION"), "{text}");
    assert!(text.contains("6 in flight, 0 scheduled, ready"), "{text}");
    let unreachable = tracker(
        &["inspect", "--admin", &format!("127.0.0.1:{}", free_port())],
        &[],
    );
    assert_eq!(unreachable.status.code(), Some(1));
    assert!(
        stderr(&unreachable).contains("cannot reach"),
        "{}",
        stderr(&unreachable)
    );
    for d in held {
        d.ack().await.unwrap();
    }
    child.kill().unwrap();
    child.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dlq_redrive_sends_filtered_records_back_and_resumes_where_it_stopped() {
    let t = topics(1, 1).await;
    let (mut child, admin) = spawn_tracker(&t, &unique("tracker"), 1);
    wait_ready_http(&admin).await;
    produce_many(&t.source, 1, "d", 8).await;
    let group = unique("g");
    let mut c = consumer_of(&t.source, &t.markers, &group, Duration::from_millis(500)).await;
    let mut originals = std::collections::HashMap::new();
    // Even keys are rejected, odd ones abandoned: with one delivery allowed, all 8 are dead-lettered.
    for _ in 0..8 {
        let d = next_delivery(&mut c, "delivery").await;
        let key = String::from_utf8_lossy(d.key().unwrap()).into_owned();
        originals.insert(key.clone(), d.offset());
        if key[2..].parse::<u32>().unwrap() % 2 == 0 {
            d.reject("bad").await.unwrap();
        } else {
            d.abandon();
        }
    }
    assert_eq!(read(&t.dlq, 8, Duration::from_secs(60)).len(), 8);
    // Stop consuming while redriving: with one delivery allowed and a short timeout, a
    // redriven record left unsettled would be dead-lettered again.
    c.close().await.unwrap();
    let bootstrap = brokers();
    let redrive = |extra: &[&str]| {
        let mut args = vec![
            "dlq",
            "redrive",
            "--brokers",
            &bootstrap,
            "--dlq-topic",
            &t.dlq,
            "--reason",
            "rejected",
        ];
        args.extend_from_slice(extra);
        let out = tracker(&args, &[]);
        assert!(out.status.success(), "{}", stderr(&out));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    assert!(
        redrive(&["--dry-run"]).contains("would redrive 4 of 8"),
        "dry run counts the rejected ones"
    );
    assert_eq!(
        read(&t.source, 9, Duration::from_secs(3)).len(),
        8,
        "a dry run sends nothing"
    );
    // Interrupted after two, then run again: the other two follow, none is sent twice.
    assert!(redrive(&["--max", "2"]).starts_with("redrove 2 of"));
    assert!(redrive(&[]).starts_with("redrove 2 of"));
    assert!(
        redrive(&[]).starts_with("redrove 0 of 0"),
        "a finished redrive has nothing left"
    );
    let mut c = consumer_of(&t.source, &t.markers, &group, Duration::from_secs(60)).await;
    let mut back = Vec::new();
    for _ in 0..4 {
        let d = next_delivery(&mut c, "redriven record").await;
        assert_eq!(d.attempt(), 1, "a redriven record starts again");
        let key = String::from_utf8_lossy(d.key().unwrap()).into_owned();
        assert_eq!(
            d.original().map(|o| o.offset),
            Some(originals[&key]),
            "original coordinates kept"
        );
        assert!(headers_of(&d).contains("kr-redriven-from"));
        back.push(key);
        d.ack().await.unwrap();
    }
    back.sort();
    assert_eq!(back, vec!["d-0", "d-2", "d-4", "d-6"]);
    assert!(c.recv_timeout(Duration::from_secs(2)).await.is_none());
    child.kill().unwrap();
    child.wait().unwrap();
}

fn headers_of(d: &kafka_redelivery::client::Delivery) -> String {
    d.headers()
        .iter()
        .map(|(k, _)| k.to_string())
        .collect::<Vec<_>>()
        .join(",")
}

/// `field` (in KiB) of `/proc/<pid>/status`, in bytes.
fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kib: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kib * 1024
}

/// A replay's memory (librdkafka's prefetched markers, freed on its own threads) goes back to
/// the system once the tracker has caught up, instead of staying resident: the one-hour soak
/// saw about 10 MiB more at every takeover before `tracker/memory.rs` (RELIABILITY.md, "Soak").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tracker_gives_back_the_memory_of_its_replay() {
    use kafka_redelivery::marker::{encode, markers_partition, Marker, SourceRef};
    use rdkafka::producer::FutureRecord;
    // What a tracker holds with nothing to replay.
    let idle = {
        let t = topics(1, 4).await;
        let (child, admin) = spawn_tracker(&t, &unique("tracker"), 5);
        wait_ready_http(&admin).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        proc_status_bytes(child.id(), "VmRSS:")
    };
    let t = topics(1, 4).await;
    // Started and ended deliveries: nothing is left in flight after the replay, so whatever
    // stays resident beyond an idle tracker's size is memory the replay did not give back.
    let pairs: i32 = 200_000;
    let markers: Vec<(i32, Vec<u8>)> = (0..pairs)
        .flat_map(|i| {
            let source = SourceRef::new("replayed", i % 16, i64::from(i));
            let partition = markers_partition(&source.topic, source.partition, 4);
            let start = Marker::Start {
                source: source.clone(),
                timeout_ms: 3_600_000,
                attempt: 1,
            };
            [
                (partition, encode(&start)),
                (partition, encode(&Marker::End { source })),
            ]
        })
        .collect();
    let p = producer();
    // In chunks: librdkafka's queue holds 100,000 records at most.
    for chunk in markers.chunks(20_000) {
        let sends = chunk.iter().map(|(partition, bytes)| {
            let record = FutureRecord::<(), _>::to(&t.markers)
                .partition(*partition)
                .payload(bytes);
            p.send_result(record).map_err(|(e, _)| e).unwrap()
        });
        for r in futures::future::join_all(sends.collect::<Vec<_>>()).await {
            r.unwrap().unwrap();
        }
    }

    let (child, admin) = spawn_tracker(&t, &unique("tracker"), 5);
    wait_ready_http(&admin).await;
    let pid = child.id();
    let peak = proc_status_bytes(pid, "VmHWM:");
    let replay = peak.saturating_sub(idle);
    // The tracker trims as it becomes ready and every 30 s; give it one period more.
    let deadline = std::time::Instant::now() + Duration::from_secs(40);
    let kept = || proc_status_bytes(pid, "VmRSS:").saturating_sub(idle);
    let mut left = kept();
    while left > replay / 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        left = kept();
    }
    eprintln!(
        "idle {} MiB, peak {} MiB, {} MiB of the replay's kept",
        idle >> 20,
        peak >> 20,
        left >> 20
    );
    assert!(
        left <= replay / 2,
        "{} MiB of the replay's {} MiB still resident (idle {} MiB)",
        left >> 20,
        replay >> 20,
        idle >> 20
    );
}
