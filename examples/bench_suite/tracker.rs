//! The tracker as its own process (so its CPU and memory are its own), and the "tracker alone"
//! scenario: markers applied per second, memory per delivery in flight, restart-to-ready.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kafka_redelivery::client::MarkerFormat;
use kafka_redelivery::marker::{
    encode, markers_partition, Marker, Offsets, Settle, SourceRef, StartBatch,
};
use rdkafka::producer::{FutureProducer, FutureRecord};
use redelivery_testkit::admin::{http_get, wait_ready, AdminAddr};
use redelivery_testkit::metrics::{bucket_quantile, histogram_buckets, metric_value};
use redelivery_testkit::process::stop_within;

use super::kafka::{client, cpu_seconds, create, drop_topics, resident_bytes, unique, PARTITIONS};
use super::Error;

/// A running `redelivery-tracker run`, killed when dropped.
pub struct TrackerProcess {
    child: Child,
    admin: String,
    log: TrackerLog,
}

impl Drop for TrackerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.log.finish();
    }
}

/// Where a tracker's log goes: always a file, so that a tracker that never became ready can
/// say why (its stderr at `warn` once said nothing at all). Its warnings and errors are copied
/// to the suite's stderr when it ends; the file is removed unless `BENCH_TRACKER_LOGS=DIR`
/// asked to keep it (at debug level, for profiling a run).
struct TrackerLog {
    path: std::path::PathBuf,
    keep: bool,
}

impl TrackerLog {
    fn create(group: &str) -> Result<(Self, std::fs::File, &'static str), Error> {
        let (dir, keep, filter) = match std::env::var_os("BENCH_TRACKER_LOGS") {
            Some(dir) => (dir.into(), true, "info,kafka_redelivery=debug"),
            None => (
                std::env::temp_dir().join("bench-tracker-logs"),
                false,
                "info,rdkafka=info",
            ),
        };
        std::fs::create_dir_all(&dir)?;
        let path = std::path::Path::new(&dir).join(format!("{group}.log"));
        let file = std::fs::File::create(&path)?;
        Ok((Self { path, keep }, file, filter))
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.path).unwrap_or_default()
    }

    /// The last `n` lines, for an error message.
    fn tail(&self, n: usize) -> String {
        let text = self.text();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    fn finish(&mut self) {
        for line in self.text().lines() {
            // The level as tracing writes it, with or without colours.
            if line.contains("WARN") || line.contains("ERROR") {
                eprintln!("{line}");
            }
        }
        if !self.keep {
            let _ = std::fs::remove_file(&self.path);
        }
    }
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
        let admin = AdminAddr::new_in(&std::env::temp_dir().join("bench-admin"))?;
        let (mut log, file, filter) = TrackerLog::create(group)?;
        let started = Instant::now();
        let mut child = Command::new(redelivery_testkit::bins::binary("redelivery-tracker")?)
            .args(["run", "--brokers", brokers, "--markers-topic", markers])
            .args(["--group-id", group])
            .args(admin.args())
            .args(["--commit-interval", "1s", "--max-deliveries", "100"])
            .args(extra)
            .env("RUST_LOG", filter)
            .env("NO_COLOR", "1")
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()?;
        let limit = Duration::from_secs(600);
        let addr = admin.wait(Some(&mut child), limit).map(str::to_string);
        let ready = addr
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|a| wait_ready(a, Some(&mut child), limit).map_err(|e| e.to_string()));
        if let Err(e) = ready {
            // What it held and what it said, before it is killed.
            let inspect = addr
                .ok()
                .and_then(|a| http_get(&a, "/inspect"))
                .map_or_else(|| "(no answer)".to_string(), |r| r.1);
            let _ = child.kill();
            let _ = child.wait();
            let message = format!(
                "{e}\n/inspect: {inspect}\nthe last lines of its log ({}):\n{}",
                log.path.display(),
                log.tail(40)
            );
            log.keep = true;
            log.finish();
            return Err(message.into());
        }
        let admin = addr?;
        let t = TrackerProcess { child, admin, log };
        Ok((t, started.elapsed()))
    }

    /// Stops it with SIGTERM, so it commits and leaves its group at once (a killed member
    /// holds its partitions until its session times out).
    pub fn stop(mut self) {
        stop_within(&mut self.child, Duration::from_secs(30));
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

/// The tracker's deadline-to-redelivery histogram, summed over `metrics`.
fn lag_buckets(metrics: &[String]) -> Vec<(f64, f64)> {
    histogram_buckets(metrics, "redelivery_deadline_lag_seconds")
}

/// How many lags the tracker's histograms in `metrics` recorded, summed.
pub fn lag_count(metrics: &[String]) -> f64 {
    lag_buckets(metrics).last().map_or(0.0, |b| b.1)
}

/// The deadline-to-redelivery lag at quantile `q` in ms, from the tracker histograms in
/// `metrics` (summed): the upper bound of the bucket that holds it.
pub fn lag_quantile_ms(metrics: &[String], q: f64) -> Option<f64> {
    bucket_quantile(&lag_buckets(metrics), q).map(|le| le * 1000.0)
}

/// The tracker's `redelivery_read_ahead_records_total` per outcome, summed over `metrics`.
pub fn read_ahead_outcomes(metrics: &[String]) -> BTreeMap<&'static str, f64> {
    ["read", "used", "unused", "skipped"]
        .into_iter()
        .map(|outcome| {
            let series = format!("redelivery_read_ahead_records_total{{outcome=\"{outcome}\"}}");
            let n = metrics.iter().map(|m| metric_value(m, &series)).sum();
            (outcome, n)
        })
        .collect()
}

/// Writes Start markers for `n` records of one source topic (and, with `ended`, their Ends),
/// in `format`: one marker per record and settlement (v1), or a batch Start and a Settle per
/// 500 consecutive records of one source partition (v2), as the client writes them.
async fn write_markers(
    brokers: &str,
    markers: &str,
    n: usize,
    ended: bool,
    format: MarkerFormat,
) -> Result<(), Error> {
    let p: FutureProducer = client(brokers)
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .set("enable.idempotence", "true")
        .create()?;
    let all = match format {
        MarkerFormat::V2 => v2_markers(n, ended),
        _ => v1_markers(n, ended),
    };
    for chunk in all.chunks(20_000) {
        let mut sends = Vec::with_capacity(chunk.len());
        for (partition, bytes) in chunk {
            sends.push(
                p.send_result(
                    FutureRecord::<(), _>::to(markers)
                        .partition(*partition)
                        .payload(bytes),
                )
                .map_err(|(e, _)| e)?,
            );
        }
        for r in futures::future::join_all(sends).await {
            r?.map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

const SOURCE: &str = "bench-source";
const SOURCE_PARTITIONS: i32 = 64;
const BATCH: usize = 500;

/// (markers partition, encoded marker) for `n` records, one marker per record and settlement.
fn v1_markers(n: usize, ended: bool) -> Vec<(i32, Vec<u8>)> {
    let mut out = Vec::new();
    for i in 0..n {
        let s = SourceRef::new(SOURCE, i as i32 % SOURCE_PARTITIONS, i as i64);
        let partition = markers_partition(&s.topic, s.partition, PARTITIONS);
        out.push((
            partition,
            encode(&Marker::Start {
                source: s.clone(),
                timeout_ms: 3_600_000,
                attempt: 1,
            }),
        ));
        if ended {
            out.push((partition, encode(&Marker::End { source: s })));
        }
    }
    out
}

/// The same `n` records in batch Starts of 500 consecutive offsets per source partition, each
/// followed (with `ended`) by one Settle acking the batch.
fn v2_markers(n: usize, ended: bool) -> Vec<(i32, Vec<u8>)> {
    let mut out = Vec::new();
    for b in 0..n.div_ceil(BATCH) {
        let source_partition = b as i32 % SOURCE_PARTITIONS;
        let first = (b / SOURCE_PARTITIONS as usize * BATCH) as i64;
        let count = BATCH.min(n - b * BATCH);
        let mut offsets = Offsets::new();
        for i in 0..count as i64 {
            offsets.push(first + i);
        }
        let partition = markers_partition(SOURCE, source_partition, PARTITIONS);
        let mut settle = Settle::new(SOURCE, source_partition);
        settle.ends = offsets.clone();
        out.push((partition, encode(&start_batch(source_partition, offsets))));
        if ended {
            out.push((partition, encode(&Marker::Settle(Box::new(settle)))));
        }
    }
    out
}

fn start_batch(partition: i32, offsets: Offsets) -> Marker {
    Marker::StartBatch(Box::new(StartBatch {
        topic: SOURCE.into(),
        partition,
        timeout_ms: 3_600_000,
        offsets,
        attempts: vec![],
        timeouts: vec![],
    }))
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
    /// The marker format written: v1 or v2.
    pub marker_format: String,
    pub markers_applied: usize,
    pub markers_per_second: f64,
    /// Records those markers started and settled (v1: half the markers).
    pub records_per_second: f64,
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

/// `pairs` Start+End pairs replayed (40 times as many records with version 2), then
/// `in_flight` Starts held, each by a fresh tracker.
pub async fn alone(
    brokers: &str,
    pairs: usize,
    in_flight: usize,
    format: MarkerFormat,
) -> Result<Alone, Error> {
    // An idle tracker: the baseline for memory and time to ready.
    let idle_topic = markers_topic(brokers).await?;
    let (idle, idle_ready) = TrackerProcess::start(brokers, &idle_topic, &unique("g"))?;
    std::thread::sleep(Duration::from_secs(1));
    let idle_rss = idle.resident_bytes();
    drop(idle);

    // Version 2 names 500 records per marker: replay as many *markers* as version 1 would
    // take, or the replay hides inside the time an idle tracker takes to be ready.
    let pairs = match format {
        MarkerFormat::V2 => pairs * 40,
        _ => pairs,
    };
    let replay_topic = markers_topic(brokers).await?;
    write_markers(brokers, &replay_topic, pairs, true, format).await?;
    let (t, ready) = TrackerProcess::start(brokers, &replay_topic, &unique("g"))?;
    drop(t);
    let applied = match format {
        MarkerFormat::V2 => 2 * pairs.div_ceil(BATCH),
        _ => pairs * 2,
    };
    let replay = ready
        .saturating_sub(idle_ready)
        .max(Duration::from_millis(1));

    let held_topic = markers_topic(brokers).await?;
    write_markers(brokers, &held_topic, in_flight, false, format).await?;
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
        marker_format: format!("{format:?}").to_lowercase(),
        markers_applied: applied,
        markers_per_second: applied as f64 / replay.as_secs_f64(),
        records_per_second: pairs as f64 / replay.as_secs_f64(),
        in_flight,
        bytes_per_in_flight: rss.saturating_sub(idle_rss) as f64 / in_flight.max(1) as f64,
        restart_to_ready_ms: restart.as_secs_f64() * 1000.0,
        restart_from_snapshot_ms: from_snapshot.as_secs_f64() * 1000.0,
        idle_ready_ms: idle_ready.as_secs_f64() * 1000.0,
    })
}
