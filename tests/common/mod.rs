//! Helpers for tests against the real Apache Kafka broker that `scripts/kafka` runs.
//!
//! Every test gets fresh topics and groups with random names, so tests run in parallel on one
//! broker and never see each other's records. There is no skipping: if the broker cannot be
//! started, the test fails.
#![allow(dead_code, unused_imports, clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kafka_redelivery::tracker::{Metrics, Tracker, TrackerConfig};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureProducer;

mod cluster;
pub mod help;
pub use cluster::Cluster;
pub use redelivery_testkit::admin::{http_get, AdminAddr};
pub use redelivery_testkit::clock::now_ms;
pub use redelivery_testkit::metrics::{metric_sum, metric_value};
pub use redelivery_testkit::names::unique;
pub use redelivery_testkit::process::ChildGuard;

/// The broker's bootstrap address; starts the broker on first use.
pub fn brokers() -> String {
    static ADDR: OnceLock<String> = OnceLock::new();
    ADDR.get_or_init(|| {
        if let Ok(addr) = std::env::var("KAFKA_BOOTSTRAP") {
            return addr;
        }
        let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka"))
            .arg("start")
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/kafka could not be run");
        assert!(
            out.status.success(),
            "scripts/kafka start failed; a real broker is required"
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        stdout
            .lines()
            .last()
            .expect("scripts/kafka printed no address")
            .trim()
            .to_string()
    })
    .clone()
}

/// Creates a topic on the shared broker and waits until its metadata is visible.
pub async fn create_topic(name: &str, partitions: i32, config: &[(&str, &str)]) {
    Cluster::shared()
        .create_topic(name, partitions, config)
        .await
}

/// Deletes a topic on the shared broker.
pub async fn delete_topic(name: &str) {
    Cluster::shared().delete_topic(name).await
}

/// Source, markers and dead-letter topics for one test.
pub struct Topics {
    pub source: String,
    pub markers: String,
    pub dlq: String,
}

/// Creates a source topic, a markers topic (LogAppendTime) and its dead-letter topic on the
/// shared broker.
pub async fn topics(source_partitions: i32, markers_partitions: i32) -> Topics {
    Cluster::shared()
        .topics(source_partitions, markers_partitions)
        .await
}

pub fn producer() -> FutureProducer {
    Cluster::shared().producer()
}

/// Produces one record with a key, a payload and headers; returns (partition, offset).
pub async fn produce(
    topic: &str,
    partition: Option<i32>,
    key: &str,
    payload: &[u8],
    headers: &[(&str, &str)],
) -> (i32, i64) {
    Cluster::shared()
        .produce(topic, partition, key, payload, headers)
        .await
}

/// Produces `n` records keyed `{prefix}-{i}` round-robin over `partitions`.
pub async fn produce_many(topic: &str, partitions: i32, prefix: &str, n: usize) {
    Cluster::shared()
        .produce_many(topic, partitions, prefix, n)
        .await
}

/// Produces the keys `prefix-i`, `i` in `range`, on the shared broker (see
/// [`Cluster::produce_range`]).
pub async fn produce_range(
    topic: &str,
    partitions: i32,
    prefix: &str,
    range: std::ops::Range<usize>,
) {
    Cluster::shared()
        .produce_range(topic, partitions, prefix, range)
        .await
}

/// Reads `topic` from the start until `n` records arrived or `timeout` passed.
pub fn read(topic: &str, n: usize, timeout: Duration) -> Vec<OwnedMessage> {
    Cluster::shared().read(topic, n, timeout)
}

/// The value of the (last) header `name` as text, read with the crate's own byte-exact header
/// reader (rdkafka's panics on a name that is not UTF-8). Not generic, so `&&OwnedMessage`
/// from an iterator coerces.
pub fn header(m: &OwnedMessage, name: &str) -> Option<String> {
    kafka_redelivery::headers::record_text(m, name)
}

/// A tracker running inside the test process.
pub struct TrackerGuard {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: Option<tokio::task::JoinHandle<()>>,
    pub metrics: Metrics,
    pub ready: kafka_redelivery::tracker::Readiness,
}

impl TrackerGuard {
    pub fn start(config: TrackerConfig) -> Self {
        let tracker = Tracker::new(config);
        let metrics = tracker.metrics();
        let ready = tracker.readiness();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            tracker
                .run(async {
                    let _ = stopped.await;
                })
                .await
                .expect("tracker ran");
        });
        TrackerGuard {
            stop: Some(stop),
            task: Some(task),
            metrics,
            ready,
        }
    }

    /// Waits until the tracker reports ready.
    pub async fn wait_ready(&self) {
        tokio::time::timeout(Duration::from_secs(60), self.ready.wait())
            .await
            .expect("tracker never became ready");
    }

    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.task.take() {
            t.await.unwrap();
        }
    }

    /// Waits until `series` reaches `value` (metrics move just after the Kafka writes they
    /// count, so a test that saw the write may look a moment too early).
    pub async fn wait_metric(&self, series: &str, value: f64) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.metric(series) != value {
            assert!(
                Instant::now() < deadline,
                "{series} is {}, expected {value}",
                self.metric(series)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sum of all series of a metric family.
    pub fn metric_sum(&self, name: &str) -> f64 {
        metric_sum(&self.metrics.render(), name)
    }

    /// Value of a metric sample in Prometheus text, matched by its full name with labels.
    pub fn metric(&self, series: &str) -> f64 {
        metric_value(&self.metrics.render(), series)
    }
}

/// The consumer's next delivery. A minute is a bound for a test that would otherwise hang,
/// never a timing assertion; `what` names the delivery the panic says did not come.
pub async fn next_delivery(
    c: &mut kafka_redelivery::client::RedeliveryConsumer,
    what: &str,
) -> kafka_redelivery::client::Delivery {
    match c.recv_timeout(Duration::from_secs(60)).await {
        Some(d) => d,
        None => panic!("no {what} within a minute"),
    }
}

/// A client-library consumer of the test's source topic, in a fresh group.
pub async fn consumer(
    t: &Topics,
    timeout: Duration,
) -> kafka_redelivery::client::RedeliveryConsumer {
    consumer_of(&t.source, &t.markers, &unique("group"), timeout).await
}

/// A client-library consumer of `source` in `group`.
pub async fn consumer_of(
    source: &str,
    markers: &str,
    group: &str,
    timeout: Duration,
) -> kafka_redelivery::client::RedeliveryConsumer {
    Cluster::shared()
        .consumer_of(source, markers, group, timeout)
        .await
}

/// Like [`consumer_of`], writing marker format version 1 (one marker per record and
/// settlement), for tests whose subject is the tracker's handling of many markers.
pub async fn consumer_v1_of(
    source: &str,
    markers: &str,
    group: &str,
    timeout: Duration,
) -> kafka_redelivery::client::RedeliveryConsumer {
    let config = kafka_redelivery::client::ConsumerConfig::new(brokers(), group, [source], markers)
        .timeout(timeout)
        .marker_format(kafka_redelivery::client::MarkerFormat::V1);
    kafka_redelivery::client::RedeliveryConsumer::new(config)
        .await
        .expect("consumer created")
}

/// A tracker config for tests: fast commits, the given max deliveries.
pub fn tracker_config(t: &Topics, max_deliveries: u32) -> TrackerConfig {
    Cluster::shared().tracker_config(t, max_deliveries)
}

/// A file of this repository, by its path from the top.
pub fn repo(path: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// Path of a binary built by cargo for these tests.
pub fn tracker_bin() -> &'static str {
    env!("CARGO_BIN_EXE_redelivery-tracker")
}

/// Path of an example binary (cargo builds examples before integration tests).
pub fn example_bin(name: &str) -> std::path::PathBuf {
    let mut p = std::path::PathBuf::from(tracker_bin());
    p.pop();
    p.push("examples");
    p.push(name);
    assert!(p.exists(), "example {name} not built at {}", p.display());
    p
}

/// The example worker, set up for the test's topics and `group`; add switches and spawn it.
pub fn worker_command(t: &Topics, group: &str) -> Command {
    Cluster::shared().worker_command(t, group)
}

/// Whether the tests run against Tansu (`scripts/test-tansu` sets `KAFKA_FLAVOR=tansu`).
pub fn on_tansu() -> bool {
    std::env::var("KAFKA_FLAVOR").is_ok_and(|f| f == "tansu")
}

/// Gives a tracker that the test kills with SIGKILL and starts again one stable
/// `group.instance.id` (static membership) on Tansu, and nothing elsewhere. Tansu does not
/// always evict a killed member, and a replacement with a new id then waits for minutes
/// (README "Tested brokers"); with the same id it takes the old place at once, which is what
/// the README tells operators there to do. Tansu holds a static member back about 6 s
/// before assigning it and expires it if its session timeout is not longer than that (a
/// rebalance every session timeout, measured with 6 s; 20 s is stable), so the session
/// timeout is raised too: call this after the command's other `-X` settings. On Apache Kafka
/// the test runs as users run by default.
pub fn restartable<'c>(c: &'c mut Command, member: &str) -> &'c mut Command {
    if on_tansu() {
        c.args(["-X", &format!("group.instance.id={member}")])
            .args(["-X", "session.timeout.ms=20000"]);
    }
    c
}

/// [`spawn_tracker`], [`restartable`] as `member`.
pub fn spawn_restartable_tracker(
    t: &Topics,
    group: &str,
    max_deliveries: u32,
    member: &str,
) -> (ChildGuard, AdminAddr) {
    let (mut c, admin) = Cluster::shared().tracker_command(t, group, max_deliveries);
    let child = restartable(&mut c, member)
        .stderr(std::process::Stdio::from(log_file(group)))
        .spawn()
        .expect("tracker binary started");
    (ChildGuard(child), admin)
}

/// Starts the tracker binary with an admin port; returns the child and the admin address.
pub fn spawn_tracker(t: &Topics, group: &str, max_deliveries: u32) -> (ChildGuard, AdminAddr) {
    Cluster::shared().spawn_tracker(t, group, max_deliveries)
}

/// A file under the test target directory for a child process's log.
pub fn log_file(name: &str) -> std::fs::File {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("logs");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::File::create(dir.join(format!("{name}-{}.log", rand::random::<u32>()))).unwrap()
}

/// Sends SIGTERM to a child process, as an orchestrator stopping it would.
pub fn sigterm(child: &std::process::Child) {
    redelivery_testkit::process::signal(child.id(), "TERM").expect("kill -TERM");
}

/// A new admin address file for a tracker process, under the test target directory.
pub fn admin_addr() -> AdminAddr {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("admin");
    AdminAddr::new_in(&dir).expect("admin address folder")
}

/// A port free at the time of asking, for programs that cannot report the port they bound
/// (Prometheus) and for "nothing listens here yet". Our own tracker binds port 0 instead.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until the tracker process at `admin` answers /readyz with 200.
pub async fn wait_ready_http(admin: &str) {
    let admin = admin.to_string();
    tokio::task::spawn_blocking(move || {
        redelivery_testkit::admin::wait_ready(&admin, None, Duration::from_secs(60))
    })
    .await
    .unwrap()
    .expect("tracker ready");
}

/// Waits until the sum of metric family `name` on the tracker process at `admin` satisfies
/// `done`; fails after a minute, showing the value.
pub async fn wait_metric_http(
    admin: &str,
    name: &str,
    done: impl Fn(f64) -> bool + Send + 'static,
) {
    let (admin, name) = (admin.to_string(), name.to_string());
    tokio::task::spawn_blocking(move || {
        let value = || http_get(&admin, "/metrics").map(|(_, body)| metric_sum(&body, &name));
        let got = redelivery_testkit::wait::until(
            Duration::from_secs(60),
            Duration::from_millis(100),
            || value().filter(|v| done(*v)),
        );
        assert!(got.is_some(), "{name} at {admin} is {:?}", value());
    })
    .await
    .unwrap();
}

/// Collects, per key, the attempts seen.
pub type Seen = HashMap<String, Vec<u32>>;
