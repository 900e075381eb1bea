//! The rendered containers run for real: the tracker binary started with exactly the
//! environment and arguments the chart gives its Deployment and its topics Job (after the
//! kubelet's `$(NAME)` expansion), its probes asked on the port the chart points them at.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kafka_redelivery::tracker::service::LONGEST_STOP;
use serde_json::Value;

use crate::common::{
    brokers, free_port, http_get, log_file, sigterm, tracker_bin, unique, ChildGuard,
};
use crate::render::*;

/// Starts the tracker binary as the kubelet would start `container`: its args, and only its
/// environment (nothing inherited from the test), Secrets' keys given as `<secret/key>`.
fn command(container: &Value) -> Command {
    let mut c = Command::new(tracker_bin());
    for arg in container["args"].as_array().unwrap() {
        c.arg(arg.as_str().unwrap());
    }
    c.env_clear()
        .envs(expanded_env(container, |r| format!("<{r}>")));
    c
}

/// Waits until `path` on `addr` answers `status`; fails if the tracker exits first.
fn wait_status(child: &mut Child, addr: &str, path: &str, status: u16) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(addr, path).map(|r| r.0) != Some(status) {
        if let Some(exit) = child.try_wait().unwrap() {
            panic!("the tracker exited ({exit}) before {path} answered {status}");
        }
        assert!(
            Instant::now() < deadline,
            "{path} at {addr} never answered {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// SIGTERM, as the kubelet sends it; the tracker must be gone well within the grace period.
fn stop_within_grace(mut guard: ChildGuard) {
    sigterm(&guard.0);
    let deadline = Instant::now() + LONGEST_STOP;
    loop {
        if let Some(exit) = guard.0.try_wait().unwrap() {
            assert!(exit.success(), "the tracker stopped with {exit}");
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the tracker outlived its longest stop after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `--set` values are split at commas; a bootstrap list keeps its own.
fn escaped(list: &str) -> String {
    list.replace(',', "\\,")
}

#[test]
fn the_rendered_job_creates_the_topics_and_the_rendered_tracker_gets_ready_and_stops_in_time() {
    let admin_port = free_port();
    let (markers, source) = (unique("k8s.markers"), unique("k8s.orders"));
    let sets = [
        format!("kafka.brokers={}", escaped(&brokers())),
        format!("tracker.markersTopic={markers}"),
        format!("tracker.adminPort={admin_port}"),
        "topics.create=true".into(),
        "topics.partitions=2".into(),
        format!("topics.sourceTopics={{{source}}}"),
    ];
    let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s.as_str()]).collect();
    let objects = render_default(&args);

    let job = container(one(&objects, "Job"), "topics");
    let out = command(job).output().unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{report}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for topic in [
        markers.clone(),
        format!("{markers}.snapshots"),
        format!("{source}.dlq"),
    ] {
        assert!(
            report.contains(&topic),
            "the Job did not create {topic}: {report}"
        );
    }

    let deployment = one(&objects, "Deployment");
    let tracker = container(deployment, "tracker");
    let mut child = command(tracker)
        .stdout(Stdio::null())
        .stderr(Stdio::from(log_file("k8s-tracker")))
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{}", port(tracker, "admin"));
    for (probe, status) in [("livenessProbe", 200), ("readinessProbe", 200)] {
        let path = tracker[probe]["httpGet"]["path"].as_str().unwrap();
        wait_status(&mut child, &addr, path, status);
    }
    stop_within_grace(ChildGuard(child));
}

#[test]
fn with_every_option_on_and_kafka_out_of_reach_the_tracker_is_alive_but_not_ready() {
    let admin_port = free_port();
    let nowhere = format!("127.0.0.1:{}", free_port());
    let sets = [
        format!("kafka.brokers={nowhere}"),
        format!("tracker.adminPort={admin_port}"),
        // The CA file of the values would be in the mounted Secret: the system's bundle here.
        "kafka.settings.ssl\\.ca\\.location=/etc/ssl/certs/ca-certificates.crt".into(),
    ];
    let args: Vec<&str> = sets.iter().flat_map(|s| ["--set", s.as_str()]).collect();
    let objects = render_all_on(&args);
    let tracker = container(one(&objects, "Deployment"), "tracker");
    let logs = tempfile::NamedTempFile::new().unwrap();
    let mut child = command(tracker)
        .stdout(Stdio::null())
        .stderr(Stdio::from(logs.reopen().unwrap()))
        .spawn()
        .unwrap();
    let addr = format!("127.0.0.1:{}", port(tracker, "admin"));
    // Every value was accepted (a bad one exits 64 at once), the admin server is up: alive.
    let live = tracker["livenessProbe"]["httpGet"]["path"]
        .as_str()
        .unwrap();
    wait_status(&mut child, &addr, live, 200);
    // Not ready while Kafka cannot be reached, and not restarted for it either.
    let ready = tracker["readinessProbe"]["httpGet"]["path"]
        .as_str()
        .unwrap();
    std::thread::sleep(Duration::from_secs(2));
    assert_eq!(http_get(&addr, ready).map(|r| r.0), Some(503));
    assert_eq!(http_get(&addr, live).map(|r| r.0), Some(200));
    assert!(child.try_wait().unwrap().is_none(), "the tracker exited");
    stop_within_grace(ChildGuard(child));
    // librdkafka reports each refused connection (about 40 a second): the log says so once
    // per 10 s, with how many it held back, instead of flooding the pod's log.
    let log = std::fs::read_to_string(logs.path()).unwrap();
    let lines = log.matches("kafka client error").count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} `kafka client error` lines in 3 s:\n{log}"
    );
}
