//! The tracker as its own process (so its CPU and memory are its own), and the "tracker alone"
//! scenario: markers applied per second, memory per delivery in flight, restart-to-ready.

use std::io::{Read, Write};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kafka_redelivery::marker::{encode, markers_partition, Marker, SourceRef};
use rdkafka::producer::{FutureProducer, FutureRecord};

use super::kafka::{client, cpu_seconds, create, drop_topics, resident_bytes, unique, PARTITIONS};
use super::Error;

/// A running `redelivery-tracker run`, killed when dropped.
pub struct TrackerProcess {
    child: Child,
    admin: String,
}

impl Drop for TrackerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The tracker binary built next to this example (`target/<profile>/redelivery-tracker`).
fn binary() -> Result<std::path::PathBuf, Error> {
    let me = std::env::current_exe()?;
    let dir = me
        .parent()
        .and_then(|examples| examples.parent())
        .ok_or("cannot locate the target directory")?;
    let bin = dir.join("redelivery-tracker");
    if !bin.exists() {
        return Err(format!(
            "{} is missing: build it with `cargo build --release --all-features --bins`",
            bin.display()
        )
        .into());
    }
    Ok(bin)
}

fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((status, body))
}

impl TrackerProcess {
    /// Starts a tracker for `markers` and returns once it is ready, with the time that took.
    pub fn start(brokers: &str, markers: &str, group: &str) -> Result<(Self, Duration), Error> {
        Self::start_with(brokers, markers, group, &[])
    }

    /// Like [`Self::start`], with extra `run` flags. The tracker binds its admin server on a
    /// port of its choosing and writes the address to a file, read back here: no port is
    /// picked before the tracker binds it.
    pub fn start_with(
        brokers: &str,
        markers: &str,
        group: &str,
        extra: &[&str],
    ) -> Result<(Self, Duration), Error> {
        let address_file = std::env::temp_dir().join(format!("{group}.admin-addr"));
        let _ = std::fs::remove_file(&address_file);
        // BENCH_TRACKER_LOGS=DIR keeps each tracker's debug log there (for profiling a run).
        let log = match std::env::var_os("BENCH_TRACKER_LOGS") {
            Some(dir) => Some(std::fs::File::create(
                std::path::Path::new(&dir).join(format!("{group}.log")),
            )?),
            None => None,
        };
        let started = Instant::now();
        let mut child = Command::new(binary()?)
            .args(["run", "--brokers", brokers, "--markers-topic", markers])
            .args(["--group-id", group, "--admin-listen", "127.0.0.1:0"])
            .arg("--admin-address-file")
            .arg(&address_file)
            .args(["--commit-interval", "1s", "--max-deliveries", "100"])
            .args(extra)
            .env(
                "RUST_LOG",
                if log.is_some() {
                    "info,kafka_redelivery=debug"
                } else {
                    "warn"
                },
            )
            .stdout(Stdio::null())
            // Warnings and errors go where the suite's own stderr goes.
            .stderr(log.map_or_else(Stdio::inherit, Stdio::from))
            .spawn()?;
        let admin = loop {
            if let Ok(a) = std::fs::read_to_string(&address_file) {
                let _ = std::fs::remove_file(&address_file);
                break a;
            }
            if let Some(status) = child.try_wait()? {
                return Err(format!("the tracker exited at start-up ({status})").into());
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut t = TrackerProcess { child, admin };
        while http_get(&t.admin, "/readyz").map(|r| r.0) != Some(200) {
            if let Some(status) = t.child.try_wait()? {
                return Err(format!("the tracker exited before it was ready ({status})").into());
            }
            if started.elapsed() > Duration::from_secs(600) {
                return Err("the tracker was not ready within 10 minutes".into());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok((t, started.elapsed()))
    }

    /// Stops it with SIGTERM, so it commits and leaves its group at once (a killed member
    /// holds its partitions until its session times out).
    pub fn stop(mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds(self.child.id())
    }

    pub fn resident_bytes(&self) -> u64 {
        resident_bytes(self.child.id())
    }

    pub fn metrics(&self) -> String {
        http_get(&self.admin, "/metrics")
            .map(|r| r.1)
            .unwrap_or_default()
    }
}

/// Deadline-to-redelivery quantile `q` in ms, from the tracker's histogram: the upper bound
/// of the bucket holding it (the histogram's resolution).
fn lag_buckets(metrics: &[String]) -> Vec<(f64, f64)> {
    let mut sum: Vec<(f64, f64)> = Vec::new();
    for text in metrics {
        let buckets = text
            .lines()
            .filter_map(|l| l.strip_prefix("redelivery_deadline_lag_seconds_bucket{le=\""))
            .filter_map(|rest| {
                let (le, count) = rest.split_once("\"} ")?;
                let le = if le == "+Inf" {
                    f64::INFINITY
                } else {
                    le.parse().ok()?
                };
                Some((le, count.trim().parse::<f64>().ok()?))
            });
        for (i, (le, count)) in buckets.enumerate() {
            match sum.get_mut(i) {
                Some(b) => b.1 += count,
                None => sum.push((le, count)),
            }
        }
    }
    sum
}

/// How many lags the tracker's histograms in `metrics` recorded, summed.
pub fn lag_count(metrics: &[String]) -> f64 {
    lag_buckets(metrics).last().map_or(0.0, |b| b.1)
}

/// The deadline-to-redelivery lag at quantile `q` in ms, from the tracker histograms in
/// `metrics` (summed): the upper bound of the bucket that holds it.
pub fn lag_quantile_ms(metrics: &[String], q: f64) -> Option<f64> {
    let buckets = lag_buckets(metrics);
    let total = buckets.last()?.1;
    if total == 0.0 {
        return None;
    }
    buckets
        .iter()
        .find(|(_, count)| *count >= q * total)
        .map(|(le, _)| le * 1000.0)
}

/// Writes `n` Start markers (and, with `ended`, their Ends) for records of one source topic.
async fn write_markers(brokers: &str, markers: &str, n: usize, ended: bool) -> Result<(), Error> {
    let p: FutureProducer = client(brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("enable.idempotence", "true")
        .create()?;
    let source = "bench-source";
    for chunk in (0..n).collect::<Vec<_>>().chunks(20_000) {
        let mut sends = Vec::with_capacity(chunk.len() * 2);
        for &i in chunk {
            let s = SourceRef::new(source, (i % 64) as i32, i as i64);
            let partition = markers_partition(&s.topic, s.partition, PARTITIONS);
            let mut ms = vec![Marker::Start {
                source: s.clone(),
                timeout_ms: 3_600_000,
                attempt: 1,
            }];
            if ended {
                ms.push(Marker::End { source: s });
            }
            for m in ms {
                let bytes = encode(&m);
                sends.push(
                    p.send_result(
                        FutureRecord::<(), _>::to(markers)
                            .partition(partition)
                            .payload(&bytes),
                    )
                    .map_err(|(e, _)| e)?,
                );
            }
        }
        for r in futures::future::join_all(sends).await {
            r?.map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

fn snapshots_written(metrics: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("redelivery_snapshots_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Results of the tracker-alone scenario.
#[derive(Debug, serde::Serialize)]
pub struct Alone {
    pub markers_applied: usize,
    pub markers_per_second: f64,
    pub in_flight: usize,
    pub bytes_per_in_flight: f64,
    pub restart_to_ready_ms: f64,
    /// The same restart once a snapshot of the in-flight deliveries is committed.
    pub restart_from_snapshot_ms: f64,
    pub idle_ready_ms: f64,
}

async fn markers_topic(brokers: &str) -> Result<String, Error> {
    let name = unique("bench-alone.markers");
    create(
        brokers,
        &name,
        PARTITIONS,
        &[("message.timestamp.type", "LogAppendTime")],
    )
    .await?;
    Ok(name)
}

/// `pairs` Start+End pairs replayed, then `in_flight` Starts held, each by a fresh tracker.
pub async fn alone(brokers: &str, pairs: usize, in_flight: usize) -> Result<Alone, Error> {
    // An idle tracker: the baseline for memory and time to ready.
    let idle_topic = markers_topic(brokers).await?;
    let (idle, idle_ready) = TrackerProcess::start(brokers, &idle_topic, &unique("g"))?;
    std::thread::sleep(Duration::from_secs(1));
    let idle_rss = idle.resident_bytes();
    drop(idle);

    let replay_topic = markers_topic(brokers).await?;
    write_markers(brokers, &replay_topic, pairs, true).await?;
    let (t, ready) = TrackerProcess::start(brokers, &replay_topic, &unique("g"))?;
    drop(t);
    let applied = pairs * 2;
    let replay = ready
        .saturating_sub(idle_ready)
        .max(Duration::from_millis(1));

    let held_topic = markers_topic(brokers).await?;
    write_markers(brokers, &held_topic, in_flight, false).await?;
    let (t, restart) = TrackerProcess::start(brokers, &held_topic, &unique("g"))?;
    std::thread::sleep(Duration::from_secs(1));
    let rss = t.resident_bytes();
    drop(t);

    // With a snapshots topic: one tracker replays and snapshots, the next one restores.
    create(
        brokers,
        &format!("{held_topic}.snapshots"),
        PARTITIONS,
        &[
            ("cleanup.policy", "compact"),
            ("max.message.bytes", "2097152"),
        ],
    )
    .await?;
    let group = unique("g");
    let snap = ["--snapshot-after-markers", "1", "--snapshot-interval", "1s"];
    let (t, _) = TrackerProcess::start_with(brokers, &held_topic, &group, &snap)?;
    let waited = Instant::now();
    // Every partition holding deliveries is snapshotted; one holding none needs no snapshot.
    loop {
        let written = snapshots_written(&t.metrics());
        if written >= PARTITIONS as f64
            || (written >= 1.0 && waited.elapsed() > Duration::from_secs(20))
        {
            break;
        }
        if waited.elapsed() > Duration::from_secs(300) {
            return Err("no snapshot within 5 minutes".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // The commit after a snapshot names it; commits run every second.
    std::thread::sleep(Duration::from_millis(2_500));
    t.stop();
    let (t, from_snapshot) = TrackerProcess::start_with(brokers, &held_topic, &group, &snap)?;
    drop(t);
    let snapshots = format!("{held_topic}.snapshots");
    drop_topics(brokers, &[idle_topic, replay_topic, held_topic, snapshots]).await;
    Ok(Alone {
        markers_applied: applied,
        markers_per_second: applied as f64 / replay.as_secs_f64(),
        in_flight,
        bytes_per_in_flight: rss.saturating_sub(idle_rss) as f64 / in_flight.max(1) as f64,
        restart_to_ready_ms: restart.as_secs_f64() * 1000.0,
        restart_from_snapshot_ms: from_snapshot.as_secs_f64() * 1000.0,
        idle_ready_ms: idle_ready.as_secs_f64() * 1000.0,
    })
}
