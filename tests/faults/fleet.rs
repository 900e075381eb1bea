//! The processes under test: example workers and tracker replicas, each started, killed,
//! stopped and continued for real. Every worker incarnation writes its JSON lines to its own
//! file, and the fleet remembers what happened to it, so the checker can say why a record was
//! delivered twice.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::common::{log_file, Cluster, Topics};

/// What the fleet did to one worker process.
#[derive(Debug, Clone, Default)]
pub struct Incarnation {
    /// Its stdout: one JSON line per delivery event.
    pub log: PathBuf,
    /// Wall-clock time of its SIGKILL, if it got one.
    pub killed_at_ms: Option<u64>,
    /// Wall-clock (SIGSTOP, SIGCONT) times; SIGCONT is `u64::MAX` if it never came.
    pub stopped: Vec<(u64, u64)>,
}

struct Slot {
    child: Child,
    incarnation: usize,
}

/// Workers and trackers of one run.
pub struct Fleet<'a> {
    cluster: &'a Cluster,
    topics: &'a Topics,
    worker_group: String,
    tracker_group: String,
    dir: PathBuf,
    workers: Vec<Slot>,
    trackers: Vec<Option<Child>>,
    profile: Profile,
    /// Every worker process ever started, in order.
    pub incarnations: Vec<Incarnation>,
}

/// Milliseconds since the Unix epoch, as the checker's fault times count them.
pub fn now_ms() -> u64 {
    u64::try_from(redelivery_testkit::clock::now_ms()).unwrap_or(0)
}

/// Signals a fleet member; one that is already gone is no fault of the suite's.
fn signal(child: &Child, name: &str) {
    let _ = redelivery_testkit::process::signal(child.id(), name);
}

/// Group settings for trackers: a killed replica leaves its group after 6 s (the broker's
/// minimum) instead of librdkafka's default 45 s.
const FAST_GROUP: [&str; 4] = [
    "-X",
    "session.timeout.ms=6000",
    "-X",
    "heartbeat.interval.ms=1000",
];

/// Group settings for workers: the classic protocol with cooperative (incremental)
/// rebalances, so the other workers go on while one is replaced, and a killed worker's
/// partitions move on after 10 s. Not KIP-848's `group.protocol=consumer`: with librdkafka
/// 2.12.1, a member whose group coordinator stops answering for a few seconds during a
/// rebalance can stay behind its target epoch for good, and the partitions it was to give up
/// or take stay unowned (RELIABILITY.md, "KIP-848 stalls"; `scripts/group-stall` shows it
/// with plain consumers).
const COOPERATIVE_GROUP: [&str; 6] = [
    "-X",
    "partition.assignment.strategy=cooperative-sticky",
    "-X",
    "session.timeout.ms=10000",
    "-X",
    "heartbeat.interval.ms=1000",
];

/// The delivery timeout workers ask for; a SIGSTOP lasts longer than this.
pub const WORKER_TIMEOUT_MS: u64 = 5_000;

/// How the workers behave, beyond the delivery timeout.
#[derive(Debug, Clone)]
pub struct Profile {
    /// Worker switches.
    pub args: Vec<String>,
    /// Whether each worker's JSON lines are kept (for the checker) or thrown away.
    pub logs: bool,
}

impl Profile {
    /// The fault suite's: slow handlers, few nacks and rejects, every delivery logged.
    pub fn faults() -> Self {
        let args = [
            "--process-time",
            "200ms",
            "--max-unsettled",
            "200",
            "--nack-rate",
            "0.01",
            // The client's retry policy: 100 ms after the first delivery, doubling, at most 2 s.
            "--nack-backoff",
            "exponential",
            "--nack-delay",
            "100ms",
            "--nack-max-delay",
            "2s",
            "--reject-rate",
            "0.002",
            "--log-received",
        ];
        Profile {
            args: args.map(String::from).to_vec(),
            logs: true,
        }
    }
}

impl<'a> Fleet<'a> {
    /// Starts `workers` workers and `trackers` tracker replicas.
    pub fn start(
        cluster: &'a Cluster,
        topics: &'a Topics,
        workers: usize,
        trackers: usize,
    ) -> Self {
        Self::start_with(cluster, topics, workers, trackers, Profile::faults())
    }

    /// [`Fleet::start`] with workers that behave as `profile` says.
    pub fn start_with(
        cluster: &'a Cluster,
        topics: &'a Topics,
        workers: usize,
        trackers: usize,
        profile: Profile,
    ) -> Self {
        let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(crate::common::unique("faults"));
        std::fs::create_dir_all(&dir).expect("log folder");
        let mut fleet = Fleet {
            cluster,
            topics,
            worker_group: crate::common::unique("workers"),
            tracker_group: crate::common::unique("trackers"),
            dir,
            workers: Vec::new(),
            trackers: Vec::new(),
            profile,
            incarnations: Vec::new(),
        };
        for i in 0..trackers {
            let t = fleet.spawn_tracker(i);
            fleet.trackers.push(Some(t));
        }
        for i in 0..workers {
            let w = fleet.spawn_worker(i);
            fleet.workers.push(w);
        }
        fleet
    }

    /// The namespace of tracker replica `i` or worker slot `i` on a cluster's network, and its
    /// address there; `None` off a network.
    pub fn host(&self, tracker: bool, i: usize) -> Option<(String, u8)> {
        self.cluster.net?;
        let i = u8::try_from(i).expect("fewer than 20 of each");
        Some(if tracker {
            (format!("t{i}"), 20 + i)
        } else {
            (format!("w{i}"), 40 + i)
        })
    }

    /// `command` as it runs for tracker `i` or worker slot `i`: in its namespace, if any.
    fn placed(&self, tracker: bool, i: usize, command: Command) -> Command {
        match self.host(tracker, i) {
            Some((name, ip)) => self.cluster.on_network(&name, ip, &command),
            None => command,
        }
    }

    fn spawn_worker(&mut self, slot: usize) -> Slot {
        let n = self.incarnations.len();
        let log = self.dir.join(format!("worker-{n}.jsonl"));
        let out = if self.profile.logs {
            Stdio::from(std::fs::File::create(&log).expect("worker log"))
        } else {
            Stdio::null()
        };
        let mut command = self.cluster.worker_command(self.topics, &self.worker_group);
        command
            .args(["--timeout", &format!("{WORKER_TIMEOUT_MS}ms")])
            .args(&self.profile.args)
            .args(COOPERATIVE_GROUP);
        let child = self
            .placed(false, slot, command)
            .stdout(out)
            .stderr(Stdio::from(log_file("fault-worker")))
            .spawn()
            .expect("worker started");
        self.incarnations.push(Incarnation {
            log,
            ..Incarnation::default()
        });
        Slot {
            child,
            incarnation: n,
        }
    }

    fn spawn_tracker(&self, i: usize) -> Child {
        let (mut c, _admin) = self
            .cluster
            .tracker_command(self.topics, &self.tracker_group, 30);
        c.args(FAST_GROUP);
        // `FAULTS_SOURCE_GROUP=1`: the trackers hold back copies of records the workers'
        // group has not committed past (`--source-group`; RELIABILITY.md).
        if std::env::var("FAULTS_SOURCE_GROUP").is_ok_and(|v| v == "1") {
            c.args(["--source-group", &self.worker_group]);
        }
        self.placed(true, i, c)
            .stdout(Stdio::null())
            .stderr(Stdio::from(log_file("fault-tracker")))
            .spawn()
            .expect("tracker started")
    }

    /// The process id of worker slot `i`'s current process.
    pub fn worker_pid(&self, i: usize) -> u32 {
        self.workers[i].child.id()
    }

    /// The process id of tracker replica `i`, if it runs.
    pub fn tracker_pid(&self, i: usize) -> Option<u32> {
        self.trackers[i].as_ref().map(Child::id)
    }

    /// How many worker slots there are.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    /// How many tracker replicas there are.
    pub fn trackers(&self) -> usize {
        self.trackers.len()
    }

    /// SIGKILLs worker `i` and starts a new one in its place.
    pub fn kill_worker(&mut self, i: usize) {
        let slot = &mut self.workers[i];
        let _ = slot.child.kill();
        let _ = slot.child.wait();
        self.incarnations[slot.incarnation].killed_at_ms = Some(now_ms());
        self.workers[i] = self.spawn_worker(i);
    }

    /// SIGSTOPs worker `i`; returns its incarnation, to continue it later.
    pub fn stop_worker(&mut self, i: usize) -> usize {
        let slot = &self.workers[i];
        signal(&slot.child, "STOP");
        self.incarnations[slot.incarnation]
            .stopped
            .push((now_ms(), u64::MAX));
        slot.incarnation
    }

    /// SIGCONTs the worker process `incarnation`, if it is still running.
    pub fn continue_worker(&mut self, incarnation: usize) {
        if let Some(slot) = self.workers.iter().find(|s| s.incarnation == incarnation) {
            signal(&slot.child, "CONT");
            if let Some(last) = self.incarnations[incarnation].stopped.last_mut() {
                last.1 = now_ms();
            }
        }
    }

    /// SIGKILLs tracker replica `i`; [`Fleet::restart_tracker`] brings it back.
    pub fn kill_tracker(&mut self, i: usize) {
        if let Some(mut t) = self.trackers[i].take() {
            let _ = t.kill();
            let _ = t.wait();
        }
    }

    /// Starts tracker replica `i` again if it is down.
    pub fn restart_tracker(&mut self, i: usize) {
        if self.trackers[i].is_none() {
            self.trackers[i] = Some(self.spawn_tracker(i));
        }
    }

    /// Continues every stopped worker and starts every tracker that is down, so the run can
    /// drain.
    pub fn heal(&mut self) {
        let stopped: Vec<usize> = self
            .workers
            .iter()
            .map(|s| s.incarnation)
            .filter(|&n| {
                self.incarnations[n]
                    .stopped
                    .last()
                    .is_some_and(|s| s.1 == u64::MAX)
            })
            .collect();
        for n in stopped {
            self.continue_worker(n);
        }
        for i in 0..self.trackers.len() {
            self.restart_tracker(i);
        }
    }
}

impl Drop for Fleet<'_> {
    fn drop(&mut self) {
        for s in &mut self.workers {
            signal(&s.child, "CONT");
            let _ = s.child.kill();
            let _ = s.child.wait();
        }
        for t in self.trackers.iter_mut().flatten() {
            let _ = t.kill();
            let _ = t.wait();
        }
    }
}
