//! The broker side of the suite: fresh topics, preloading records, and a producer that offers
//! a fixed load.

use std::time::{Duration, Instant};

use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;

use super::Error;

/// Source partitions in every scenario.
pub const PARTITIONS: i32 = 8;

/// Partitions of the markers topic of the throughput, latency and redelivery scenarios: the
/// command line's `--markers-partitions`, else 1, `topics create`'s default.
static MARKERS_PARTITIONS: std::sync::OnceLock<i32> = std::sync::OnceLock::new();

pub fn set_markers_partitions(partitions: i32) {
    let _ = MARKERS_PARTITIONS.set(partitions);
}

pub fn markers_partitions() -> i32 {
    MARKERS_PARTITIONS.get().copied().unwrap_or(1)
}

pub use redelivery_testkit::kafka::client;
pub use redelivery_testkit::names::unique;
use redelivery_testkit::process::thread_cpu_seconds;
pub use redelivery_testkit::process::{cpu_seconds, resident_bytes};

/// Creates a topic and waits until every partition of it is in the metadata.
pub async fn create(
    brokers: &str,
    name: &str,
    partitions: i32,
    config: &[(&str, &str)],
) -> Result<(), Error> {
    redelivery_testkit::kafka::create_topic(&client(brokers), name, partitions, config).await
}

/// A source topic, its markers topic and its dead-letter topic, all new.
pub struct Topics {
    pub source: String,
    pub markers: String,
    /// Records preloaded into [`Topics::warm_up`] for the share peer to consume before its
    /// timed part (throughput runs only; see `ShareConsumerBench.java`).
    pub share_warm_up: Option<usize>,
}

pub async fn topics(brokers: &str) -> Result<Topics, Error> {
    let source = unique("bench");
    let markers = format!("{source}.markers");
    create(brokers, &source, PARTITIONS, &[]).await?;
    create(
        brokers,
        &markers,
        markers_partitions(),
        &[("message.timestamp.type", "LogAppendTime")],
    )
    .await?;
    create(brokers, &format!("{source}.dlq"), 1, &[]).await?;
    Ok(Topics {
        source,
        markers,
        share_warm_up: None,
    })
}

impl Topics {
    /// Every topic a run on these may have made: source, markers, dead letters, the floor's
    /// side topic, a snapshots topic and the share peer's warm-up topic.
    pub fn all(&self) -> Vec<String> {
        vec![
            self.source.clone(),
            format!("{}.dlq", self.source),
            format!("{}.floor", self.source),
            self.markers.clone(),
            format!("{}.snapshots", self.markers),
            self.warm_up(),
        ]
    }

    /// The topic the share peer warms up on.
    pub fn warm_up(&self) -> String {
        format!("{}.warm-up", self.source)
    }
}

/// Deletes topics a run made, so that a full suite (gigabytes of records at the specified
/// loads) does not fill the broker's disk. Missing topics and failures are ignored: the
/// broker is wiped at its next fresh start anyway.
pub async fn drop_topics(brokers: &str, names: &[String]) {
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let _ = redelivery_testkit::kafka::delete_topics(&client(brokers), &names).await;
}

/// Deletes topics a run made and waits (up to a minute) until the broker no longer lists
/// them, so that the next run does not pay for the deletion.
pub async fn drop_topics_and_wait(brokers: &str, names: &[String]) {
    drop_topics(brokers, names).await;
    let Ok(probe) = client(brokers).create::<rdkafka::consumer::BaseConsumer>() else {
        return;
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let listed =
            rdkafka::consumer::Consumer::fetch_metadata(&probe, None, Duration::from_secs(5))
                .map(|md| {
                    md.topics()
                        .iter()
                        .any(|t| names.iter().any(|n| n == t.name()))
                })
                .unwrap_or(true);
        if !listed {
            return;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!("  topics of the last run were still listed a minute after their deletion");
}

static SETTLING: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Whether [`settle`] waits (off for `--quick`, which checks the harness on a busy machine,
/// not the numbers).
pub fn set_settling(on: bool) {
    let _ = SETTLING.set(on);
}

/// How long [`settle`] waited, and how busy the machine was when it stopped waiting.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Settled {
    pub waited_s: f64,
    pub busy: f64,
}

/// Waits until the machine is quiet: its CPU (all cores, from `/proc/stat`) under 10 % busy
/// for a whole second, or 60 s have passed. A run that starts while the broker still deletes
/// the last run's topics, flushes the preload or a process of the last run is exiting pays
/// for them: that made one kind look slower in rotation than alone.
pub async fn settle() -> Settled {
    if !SETTLING.get().copied().unwrap_or(true) {
        return Settled::default();
    }
    let started = Instant::now();
    let mut quiet_for = 0;
    let mut busy = 1.0;
    let mut last = cpu_times();
    while started.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = cpu_times();
        if let (Some((t0, i0)), Some((t1, i1))) = (last, now) {
            let total = t1.saturating_sub(t0).max(1) as f64;
            busy = 1.0 - i1.saturating_sub(i0) as f64 / total;
        }
        last = now;
        quiet_for = if busy < 0.10 { quiet_for + 1 } else { 0 };
        if quiet_for >= 4 {
            break;
        }
    }
    Settled {
        waited_s: started.elapsed().as_secs_f64(),
        busy,
    }
}

/// (all jiffies, idle + iowait jiffies) of the machine, from the first line of `/proc/stat`.
fn cpu_times() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let idle = fields.get(3)? + fields.get(4).copied().unwrap_or(0);
    Some((fields.iter().sum(), idle))
}

/// The producer the suite writes source records with.
pub fn producer(brokers: &str) -> Result<FutureProducer, Error> {
    Ok(client(brokers)
        .set("linger.ms", "5")
        .set("enable.idempotence", "true")
        .create()?)
}

/// Writes `n` records of `size` bytes round-robin over the partitions, as fast as possible.
pub async fn preload(brokers: &str, topic: &str, n: usize, size: usize) -> Result<(), Error> {
    preload_with(&producer(brokers)?, topic, n, size).await
}

/// [`preload`] with a producer of the caller's.
pub async fn preload_with(
    p: &FutureProducer,
    topic: &str,
    n: usize,
    size: usize,
) -> Result<(), Error> {
    let payload = vec![b'x'; size];
    for chunk in (0..n).collect::<Vec<_>>().chunks(10_000) {
        let sends: Vec<_> = chunk
            .iter()
            .map(|&i| {
                let key = i.to_string();
                p.send_result(
                    FutureRecord::to(topic)
                        .key(&key)
                        .payload(&payload)
                        .partition(i as i32 % PARTITIONS),
                )
                .map_err(|(e, _)| e)
            })
            .collect::<Result<_, _>>()?;
        for r in futures::future::join_all(sends).await {
            r?.map_err(|(e, _)| e)?;
        }
    }
    Ok(())
}

/// Produces `rate` records per second of `size` bytes for `span`, in steps of 10 ms. Each
/// record's timestamp is its creation time, from which consumers measure latency, so `p`
/// should have written to every partition of `topic` already: a new producer's first records
/// wait for its producer id, metadata and connections (about half a second on the test broker,
/// in about half the runs), and that wait would count as the consumer's.
pub async fn offer(
    p: &FutureProducer,
    topic: &str,
    rate: f64,
    span: Duration,
    size: usize,
) -> Result<usize, Error> {
    let payload = vec![b'x'; size];
    let started = Instant::now();
    let mut sent = 0usize;
    let mut pending = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    while started.elapsed() < span {
        tick.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate) as usize;
        while sent < due {
            let key = sent.to_string();
            let record = FutureRecord::to(topic)
                .key(&key)
                .payload(&payload)
                .partition(sent as i32 % PARTITIONS);
            match p.send_result(record) {
                Ok(f) => {
                    pending.push(f);
                    sent += 1;
                }
                // More offered than the producer can send: let its queue drain. The load
                // actually offered is what `sent` says.
                Err((e, _)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    for r in futures::future::join_all(pending.drain(..)).await {
                        r?.map_err(|(e, _)| e)?;
                    }
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        if pending.len() > 10_000 {
            for r in futures::future::join_all(pending.drain(..)).await {
                r?.map_err(|(e, _)| e)?;
            }
        }
    }
    for r in futures::future::join_all(pending).await {
        r?.map_err(|(e, _)| e)?;
    }
    Ok(sent)
}

/// The broker's process id, from `KAFKA_BROKER_PID` (`scripts/bench` sets it), if it names a
/// running process.
pub fn broker_pid() -> Option<u32> {
    let pid = std::env::var("KAFKA_BROKER_PID")
        .ok()?
        .trim()
        .parse()
        .ok()?;
    std::path::Path::new(&format!("/proc/{pid}"))
        .exists()
        .then_some(pid)
}

/// CPU seconds the JIT compiler threads of JVM `pid` have used. A broker started for the
/// benchmark still compiles the code paths each kind exercises for the first time (measured:
/// up to 40 % of its CPU in the first runs of a rotation, falling run after run), and so does
/// the share peer's JVM, started for each run; a broker or a consumer in service did that long
/// ago, so the figures report this part apart.
pub fn jit_cpu_seconds(pid: u32) -> f64 {
    thread_cpu_seconds(pid, &["C1 CompilerThre", "C2 CompilerThre"])
}
