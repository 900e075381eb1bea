//! What operators rely on: the alert rules (promtool) and every dashboard and alert query run by
//! a real Prometheus scraping a tracker that does real work.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn tool(name: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .unwrap();
    assert!(
        found.status.success(),
        "`{name}` is missing: install Debian's `prometheus` package (.ci/run does)"
    );
    Command::new(name)
}

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let check = tool("promtool")
        .args(["check", "rules"])
        .arg(repo("docker/alerts.yml"))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
    let test = tool("promtool")
        .args(["test", "rules", "alerts.test.yml"])
        .current_dir(repo("docker"))
        .output()
        .unwrap();
    assert!(
        test.status.success(),
        "{}{}",
        String::from_utf8_lossy(&test.stdout),
        String::from_utf8_lossy(&test.stderr)
    );
}

/// Every PromQL expression of the Grafana dashboard, with Grafana's `$__rate_interval` filled in.
fn dashboard_queries() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo("grafana/dashboards/kafka-redelivery.json")).unwrap();
    let dash: serde_json::Value = serde_json::from_str(&text).unwrap();
    let mut out = Vec::new();
    for panel in dash["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let expr = target["expr"]
                .as_str()
                .unwrap()
                .replace("$__rate_interval", "30s");
            out.push((panel["title"].as_str().unwrap().to_string(), expr));
        }
    }
    out
}

fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn start_prometheus(target: &str, dir: &Path) -> (Prometheus, String) {
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: tracker\n    static_configs:\n      - targets: ['{target}']\n",
            repo("docker/alerts.yml").display()
        ),
    )
    .unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let child = tool("prometheus")
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={addr}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Prometheus(child), addr)
}

fn query(prom: &str, expr: &str) -> serde_json::Value {
    let (status, body) = http_get(prom, &format!("/api/v1/query?query={}", url_encode(expr)))
        .expect("prometheus answers");
    let v: serde_json::Value =
        serde_json::from_str(&body).unwrap_or_else(|_| panic!("HTTP {status}: {body}"));
    assert_eq!(v["status"], "success", "query `{expr}` failed: {body}");
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_runs_every_dashboard_and_alert_query_against_a_working_tracker() {
    let t = topics(2, 2).await;
    let (mut tracker, admin) = spawn_tracker(&t, &unique("tracker"), 2);
    wait_ready_http(&admin).await;
    let dir = tempfile::tempdir().unwrap();
    let (_prom, prom) = start_prometheus(&admin, dir.path());

    // Real work: acks, timeouts to the maximum, rejects, nacks, and one undecodable marker.
    produce_many(&t.source, 2, "op", 40).await;
    let mut c = consumer(&t, Duration::from_millis(800)).await;
    let worker = tokio::spawn(async move {
        while let Some(d) = c.recv().await {
            let n: u32 = String::from_utf8_lossy(d.key().unwrap())[3..]
                .parse()
                .unwrap();
            match n % 4 {
                0 => d.ack().await.unwrap(),
                1 => d.abandon(),
                2 => d.reject("operations test").await.unwrap(),
                _ if d.attempt() == 1 => d.nack_after(Duration::ZERO).await.unwrap(),
                _ => d.ack().await.unwrap(),
            }
        }
    });
    // A schedule, for the schedules panel (acked by the worker: 100 % 4 == 0).
    let scheduler = kafka_redelivery::client::Scheduler::new(
        kafka_redelivery::client::SchedulerConfig::new(brokers(), &t.markers),
    )
    .await
    .unwrap();
    scheduler
        .send_after(
            kafka_redelivery::client::ScheduledRecord::to(&t.source).key("op-100"),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    producer()
        .send(
            rdkafka::producer::FutureRecord::<(), [u8]>::to(&t.markers)
                .partition(0)
                .payload(&[0xff, 0xff][..]),
            Duration::from_secs(10),
        )
        .await
        .map_err(|(e, _)| e)
        .unwrap();

    // Let Prometheus scrape long enough for every rate window and the statistics-fed lag gauge.
    let deadline = Instant::now() + Duration::from_secs(90);
    let queries = dashboard_queries();
    let mut empty: Vec<(String, String)>;
    loop {
        tokio::time::sleep(Duration::from_secs(2)).await;
        empty = queries
            .iter()
            .filter(|(_, expr)| {
                query(&prom, expr)["data"]["result"]
                    .as_array()
                    .is_none_or(|r| r.is_empty())
            })
            .cloned()
            .collect();
        if empty.is_empty() || Instant::now() > deadline {
            break;
        }
    }
    assert!(
        empty.is_empty(),
        "dashboard panels with no data from a working tracker: {empty:#?}"
    );

    // Every alert rule was loaded and evaluated by Prometheus without error.
    let (_, body) = http_get(&prom, "/api/v1/rules").unwrap();
    let rules: serde_json::Value = serde_json::from_str(&body).unwrap();
    let loaded: Vec<&serde_json::Value> = rules["data"]["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap())
        .collect();
    let written =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docker/alerts.yml"))
            .unwrap()
            .matches("- alert:")
            .count();
    assert_eq!(loaded.len(), written, "{body}");
    for rule in loaded {
        assert_eq!(
            rule["health"], "ok",
            "rule {} failed: {}",
            rule["name"], rule["lastError"]
        );
    }
    // Reading ahead (on by default, 100 ms) worked against the real broker: the abandoned
    // records, due 800 ms after their Start, were read before their deadline and their copies
    // made from those reads. The unit tests of `read_ahead.rs` cover the cache itself.
    let (_, body) = http_get(&admin, "/metrics").unwrap();
    let used = metric_value(
        &body,
        "redelivery_read_ahead_records_total{outcome=\"used\"}",
    );
    assert!(
        used > 0.0,
        "no copy was made from a record read ahead:\n{body}"
    );
    worker.abort();
    tracker.kill().unwrap();
    tracker.wait().unwrap();
}
