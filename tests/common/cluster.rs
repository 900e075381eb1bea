//! A Kafka broker the tests talk to: the shared one, or a private instance that a test may
//! stop, kill, resume or secure without disturbing the tests running beside it.

use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use kafka_redelivery::client::{ConsumerConfig, RedeliveryConsumer};
use kafka_redelivery::tracker::TrackerConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Header, OwnedHeaders, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;

use super::{brokers, log_file, tracker_bin, unique, AdminAddr, ChildGuard, Topics};

/// A broker and the client settings it needs.
pub struct Cluster {
    /// Bootstrap address.
    pub addr: String,
    /// librdkafka settings every client of this cluster needs (security), as the super user.
    pub settings: Vec<(String, String)>,
    /// The `KAFKA_INSTANCE` name of a private broker; `None` for the shared one.
    instance: Option<String>,
    /// Extra environment for `scripts/kafka` (security mode, users).
    env: Vec<(String, String)>,
    /// The scripts/netns network its nodes (and the processes a test puts there) live on.
    pub net: Option<u8>,
}

/// The password of the secured broker's super user (see `scripts/kafka`).
pub const ADMIN_PASSWORD: &str = "admin-secret";

impl Cluster {
    /// The broker every ordinary test shares.
    pub fn shared() -> &'static Cluster {
        static SHARED: OnceLock<Cluster> = OnceLock::new();
        SHARED.get_or_init(|| Cluster {
            addr: brokers(),
            settings: Vec::new(),
            instance: None,
            env: Vec::new(),
            net: None,
        })
    }

    /// Starts a private plaintext broker; it is stopped and wiped when dropped.
    pub fn private(prefix: &str) -> Cluster {
        Self::start_private(prefix, Vec::new())
    }

    /// Starts a private SASL_SSL (SCRAM-SHA-512) broker with the standard authorizer and the
    /// given `(user, password)` SCRAM users besides `admin`.
    pub fn secured(prefix: &str, users: &[(&str, &str)]) -> Cluster {
        let users: Vec<String> = users.iter().map(|(u, p)| format!("{u}:{p}")).collect();
        let env = vec![
            ("KAFKA_SECURITY".to_string(), "sasl_ssl".to_string()),
            ("KAFKA_SCRAM_USERS".to_string(), users.join(" ")),
        ];
        let mut cluster = Self::start_private(prefix, env);
        cluster.settings = cluster.user_settings("admin", ADMIN_PASSWORD);
        cluster
    }

    /// Starts a private cluster of `brokers` combined KRaft nodes (replication factor 3,
    /// `min.insync.replicas` 2); stopped and wiped when dropped. Node ids are 1 to `brokers`.
    pub fn private_cluster(prefix: &str, brokers: u32) -> Cluster {
        let env = vec![("KAFKA_BROKERS".to_string(), brokers.to_string())];
        Self::start_private(prefix, env)
    }

    /// [`Cluster::private_cluster`] with every node in a network namespace of its own on a
    /// new scripts/netns network (node n at 10.77.NET.n), so that a node, or a process put on
    /// the network with [`Cluster::on_network`], can be cut off ([`Cluster::cut`]). Needs root.
    pub fn private_cluster_on_network(prefix: &str, brokers: u32) -> Cluster {
        // A network no other run on this machine uses: its bridge does not exist yet.
        let net = (0..100)
            .map(|_| rand::random::<u8>() % 250 + 1)
            .find(|n| {
                !Command::new("ip")
                    .args(["link", "show", &format!("krbr{n}")])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .status()
                    .is_ok_and(|s| s.success())
            })
            .expect("a free scripts/netns network");
        let env = vec![
            ("KAFKA_BROKERS".to_string(), brokers.to_string()),
            ("KAFKA_NET".to_string(), net.to_string()),
        ];
        let mut cluster = Self::start_private(prefix, env);
        cluster.net = Some(net);
        cluster
    }

    /// `command` run inside the namespace `host` (made with address 10.77.NET.`ip` if it does
    /// not exist yet) of this cluster's network; its stdio is still the caller's to set.
    pub fn on_network(&self, host: &str, ip: u8, command: &Command) -> Command {
        let net = self
            .net
            .expect("a cluster started on a network")
            .to_string();
        self.netns(&["add", &net, host, &ip.to_string()]);
        let mut c = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/netns"));
        c.args(["exec", &net, host])
            .arg(command.get_program())
            .args(command.get_args());
        for (k, v) in command.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }

    /// Cuts `host` (a node's `b<n>`, or a name given to [`Cluster::on_network`]) off the
    /// network: its packets go nowhere, silently.
    pub fn cut(&self, host: &str) {
        let net = self
            .net
            .expect("a cluster started on a network")
            .to_string();
        self.netns(&["cut", &net, host]);
    }

    /// Joins `host` to the network again.
    pub fn heal(&self, host: &str) {
        let net = self
            .net
            .expect("a cluster started on a network")
            .to_string();
        self.netns(&["heal", &net, host]);
    }

    fn netns(&self, args: &[&str]) {
        let out = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/netns"))
            .args(args)
            .stderr(Stdio::inherit())
            .output()
            .expect("scripts/netns could not be run");
        assert!(
            out.status.success(),
            "scripts/netns {args:?} failed (it needs root)"
        );
    }

    /// Runs `scripts/kafka ACTION` on one node of a private cluster (kill, stop, resume,
    /// pause, unpause); panics if it fails.
    pub fn node(&self, node: i32, action: &str) {
        let out = self.script_with(&[action], &[("KAFKA_NODE", &node.to_string())]);
        assert!(
            out.status.success(),
            "scripts/kafka {action} of node {node} failed"
        );
    }

    /// Starts killed nodes of a private cluster again in one `scripts/kafka resume`, which
    /// waits until the cluster has all its nodes: resumed one at a time, the first would
    /// wait for the others; panics if it fails.
    pub fn resume_nodes(&self, nodes: &[i32]) {
        let list: Vec<String> = nodes.iter().map(i32::to_string).collect();
        let list = list.join(" ");
        let out = self.script_with(&["resume"], &[("KAFKA_NODE", &list)]);
        assert!(
            out.status.success(),
            "scripts/kafka resume of node(s) {list} failed"
        );
    }

    /// The node id of a private cluster's active controller.
    pub fn controller(&self) -> i32 {
        let out = self.script(&["controller"]);
        let text = String::from_utf8_lossy(&out.stdout);
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("no controller id in {text:?}"))
    }

    /// The broker leading each partition of `topic`, as the cluster's metadata says now
    /// (-1 for a partition without a leader).
    pub fn leaders(&self, topic: &str) -> Vec<i32> {
        let c: BaseConsumer = self.client().create().unwrap();
        let md = c
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .expect("metadata");
        let mut partitions: Vec<(i32, i32)> = md.topics()[0]
            .partitions()
            .iter()
            .map(|p| (p.id(), p.leader()))
            .collect();
        partitions.sort();
        partitions.into_iter().map(|(_, leader)| leader).collect()
    }

    fn start_private(prefix: &str, env: Vec<(String, String)>) -> Cluster {
        let mut cluster = Cluster {
            addr: String::new(),
            settings: Vec::new(),
            instance: Some(unique(prefix)),
            env,
            net: None,
        };
        let out = cluster.script(&["start"]);
        assert!(out.status.success(), "private broker did not start");
        cluster.addr = String::from_utf8_lossy(&out.stdout)
            .lines()
            .last()
            .expect("scripts/kafka printed no address")
            .trim()
            .to_string();
        cluster
    }

    /// Runs `scripts/kafka` for this broker.
    pub fn script(&self, args: &[&str]) -> Output {
        self.script_with(args, &[])
    }

    /// Runs `scripts/kafka` for this broker with more environment.
    fn script_with(&self, args: &[&str], extra: &[(&str, &str)]) -> Output {
        let mut c = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/kafka"));
        c.args(args)
            .envs(extra.iter().copied())
            .stderr(Stdio::inherit());
        if let Some(i) = &self.instance {
            c.env("KAFKA_INSTANCE", i);
        }
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c.output().expect("scripts/kafka could not be run")
    }

    /// The folder holding this private broker's data, certificate and logs.
    pub fn run_dir(&self) -> std::path::PathBuf {
        let i = self.instance.as_deref().expect("only private brokers");
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(format!(".cache/kafka/run-{i}"))
    }

    /// Copies the broker logs of a failed test's private broker or cluster to
    /// `target/tmp/logs` before its data is deleted: a failure on a cluster is seldom
    /// understood without the group coordinator's and the controller's side of it.
    fn keep_broker_logs(&self) {
        let run = self.run_dir();
        let into = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("logs");
        let name = self.instance.as_deref().unwrap_or_default();
        let nodes = std::fs::read_dir(&run)
            .map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
            .unwrap_or_default();
        for dir in nodes.iter().filter(|p| p.is_dir()).chain([&run]) {
            let log = dir.join("server.log");
            let node = dir.file_name().and_then(|n| n.to_str()).unwrap_or("broker");
            let to = into.join(format!("{name}-{node}-server.log"));
            if log.exists() && std::fs::copy(&log, &to).is_ok() {
                eprintln!("broker log kept: {}", to.display());
            }
        }
    }

    /// Settings for a client logging in as `user` on the secured broker.
    pub fn user_settings(&self, user: &str, password: &str) -> Vec<(String, String)> {
        let ca = self.run_dir().join("ca.pem");
        [
            ("security.protocol", "SASL_SSL"),
            ("sasl.mechanism", "SCRAM-SHA-512"),
            ("sasl.username", user),
            ("sasl.password", password),
            ("ssl.ca.location", &ca.to_string_lossy()),
        ]
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    }

    /// Stops a private broker cleanly (SIGTERM), keeping its data.
    pub fn stop(&self) {
        assert!(self.script(&["stop"]).status.success());
    }

    /// Kills a private broker (SIGKILL), keeping its data.
    pub fn kill(&self) {
        assert!(self.script(&["kill"]).status.success());
    }

    /// Starts a stopped private broker again, on the same address with the same data.
    pub fn resume(&self) {
        assert!(
            self.script(&["resume"]).status.success(),
            "broker did not resume"
        );
    }

    /// A librdkafka config for this broker.
    pub fn client(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.addr);
        for (k, v) in &self.settings {
            c.set(k, v);
        }
        c
    }

    /// Creates a topic and waits until its metadata is visible.
    pub async fn create_topic(&self, name: &str, partitions: i32, config: &[(&str, &str)]) {
        redelivery_testkit::kafka::create_topic(&self.client(), name, partitions, config)
            .await
            .expect("topic created");
    }

    /// Deletes a topic.
    pub async fn delete_topic(&self, name: &str) {
        redelivery_testkit::kafka::delete_topics(&self.client(), &[name])
            .await
            .expect("topic deleted");
    }

    /// Creates a source topic, a markers topic (LogAppendTime) and its dead-letter topic.
    pub async fn topics(&self, source_partitions: i32, markers_partitions: i32) -> Topics {
        let source = unique("src");
        let markers = format!("{source}.markers");
        let dlq = format!("{source}.dlq");
        self.create_topic(&source, source_partitions, &[]).await;
        // As `topics create` makes it; retention.ms explicit (Apache Kafka's default), since
        // Tansu reports no default the scheduler could check a delay against.
        self.create_topic(
            &markers,
            markers_partitions,
            &[
                ("message.timestamp.type", "LogAppendTime"),
                ("retention.ms", "604800000"),
            ],
        )
        .await;
        self.create_topic(&dlq, 1, &[]).await;
        Topics {
            source,
            markers,
            dlq,
        }
    }

    /// An idempotent producer.
    pub fn producer(&self) -> FutureProducer {
        self.client()
            .set("enable.idempotence", "true")
            .create()
            .unwrap()
    }

    /// Produces one record with a key, a payload and headers; returns (partition, offset).
    pub async fn produce(
        &self,
        topic: &str,
        partition: Option<i32>,
        key: &str,
        payload: &[u8],
        headers: &[(&str, &str)],
    ) -> (i32, i64) {
        let mut h = OwnedHeaders::new();
        for (k, v) in headers {
            h = h.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        let mut record = FutureRecord::to(topic).key(key).payload(payload).headers(h);
        if let Some(p) = partition {
            record = record.partition(p);
        }
        let d = self
            .producer()
            .send(record, Duration::from_secs(10))
            .await
            .map_err(|(e, _)| e)
            .unwrap();
        (d.partition, d.offset)
    }

    /// Produces `n` records keyed `{prefix}-{i}` round-robin over `partitions`.
    pub async fn produce_many(&self, topic: &str, partitions: i32, prefix: &str, n: usize) {
        self.produce_range(topic, partitions, prefix, 0..n).await
    }

    /// Like [`Self::produce_many`] for the keys `prefix-i`, `i` in `range` (record `i` goes to
    /// partition `i % partitions`), so a test can produce in waves.
    pub async fn produce_range(
        &self,
        topic: &str,
        partitions: i32,
        prefix: &str,
        range: std::ops::Range<usize>,
    ) {
        let p = self.producer();
        let futures = range.map(|i| {
            let key = format!("{prefix}-{i}");
            let p = &p;
            async move {
                p.send(
                    FutureRecord::to(topic)
                        .key(&key)
                        .payload(key.as_bytes())
                        .partition((i as i32) % partitions),
                    Duration::from_secs(10),
                )
                .await
                .map_err(|(e, _)| e)
                .unwrap();
            }
        });
        futures::future::join_all(futures).await;
    }

    /// Reads `topic` from the start until `n` records arrived or `timeout` passed.
    pub fn read(&self, topic: &str, n: usize, timeout: Duration) -> Vec<OwnedMessage> {
        let c: BaseConsumer = self
            .client()
            .set("group.id", unique("reader"))
            .set("auto.offset.reset", "earliest")
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        c.subscribe(&[topic]).unwrap();
        let deadline = Instant::now() + timeout;
        let mut out = Vec::new();
        while out.len() < n && Instant::now() < deadline {
            if let Some(Ok(m)) = c.poll(Duration::from_millis(100)) {
                out.push(m.detach());
            }
        }
        out
    }

    /// A client-library consumer of `source` in `group`, with this cluster's settings.
    pub async fn consumer_of(
        &self,
        source: &str,
        markers: &str,
        group: &str,
        timeout: Duration,
    ) -> RedeliveryConsumer {
        let mut config =
            ConsumerConfig::new(self.addr.clone(), group, [source], markers).timeout(timeout);
        for (k, v) in &self.settings {
            config = config.set(k, v);
        }
        RedeliveryConsumer::new(config)
            .await
            .expect("consumer created")
    }

    /// A tracker config for tests: fast commits, the given max deliveries.
    pub fn tracker_config(&self, t: &Topics, max_deliveries: u32) -> TrackerConfig {
        TrackerConfig {
            group_id: unique("tracker"),
            max_deliveries,
            commit_interval: Duration::from_millis(200),
            rdkafka: self.settings.clone(),
            ..TrackerConfig::new(self.addr.clone(), &t.markers)
        }
    }

    /// `-X key=value` arguments carrying this cluster's settings.
    pub fn x_args(&self) -> Vec<String> {
        self.settings
            .iter()
            .flat_map(|(k, v)| ["-X".to_string(), format!("{k}={v}")])
            .collect()
    }

    /// The example worker, set up for the test's topics and `group`; add switches and spawn it.
    pub fn worker_command(&self, t: &Topics, group: &str) -> Command {
        let mut c = Command::new(super::example_bin("worker"));
        c.args(["--brokers", &self.addr, "--topic", &t.source])
            .args(["--markers-topic", &t.markers, "--group", group])
            .args(self.x_args());
        c
    }

    /// The tracker binary's `run` command for the test's markers topic, with an admin server
    /// on a port of its choosing; returns the command and the admin address (read back once
    /// the tracker has bound it). Add flags and spawn it.
    pub fn tracker_command(
        &self,
        t: &Topics,
        group: &str,
        max_deliveries: u32,
    ) -> (Command, AdminAddr) {
        let admin = super::admin_addr();
        let mut c = Command::new(tracker_bin());
        c.args([
            "run",
            "--brokers",
            &self.addr,
            "--markers-topic",
            &t.markers,
        ])
        .args(["--group-id", group])
        .args(admin.args())
        .args(["--max-deliveries", &max_deliveries.to_string()])
        .args(["--commit-interval", "200ms"])
        .args(self.x_args())
        .env("RUST_LOG", "info,kafka_redelivery=debug")
        .stdout(Stdio::null());
        (c, admin)
    }

    /// Starts the tracker binary with an admin port; returns the child and the admin address.
    pub fn spawn_tracker(
        &self,
        t: &Topics,
        group: &str,
        max_deliveries: u32,
    ) -> (ChildGuard, AdminAddr) {
        let (mut c, admin) = self.tracker_command(t, group, max_deliveries);
        let child = c
            .stderr(Stdio::from(log_file(group)))
            .spawn()
            .expect("tracker binary started");
        (ChildGuard(child), admin)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if self.instance.is_some() {
            let _ = self.script(&["stop"]);
            if std::thread::panicking() {
                self.keep_broker_logs();
            }
            let _ = std::fs::remove_dir_all(self.run_dir());
            let addr = self.run_dir().with_file_name(format!(
                "addr-{}",
                self.instance.as_deref().unwrap_or_default()
            ));
            let _ = std::fs::remove_file(addr);
        }
        if let Some(net) = self.net {
            let _ = Command::new(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/netns"))
                .args(["down", &net.to_string()])
                .status();
        }
    }
}
