//! The consumers compared: a plain one (the ceiling), the design floors (a plain one that also
//! writes small durable records: two per message for version 1's design, two per poll batch and
//! partition for version 2's), ours (the client library) and Kafka share groups.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::join_all;
use futures::stream::{FuturesUnordered, StreamExt};
use kafka_redelivery::client::{ConsumerConfig, Delivery, MarkerFormat, RedeliveryConsumer};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{BorrowedMessage, Message};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};

use super::kafka::{client, create, unique, Topics};
use super::share;
use super::Error;
use redelivery_testkit::clock::now_ms_f64 as now_ms;

/// Which consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Plain,
    /// Version 1's floor: one small durable record per message before handing it out, one
    /// after.
    Floor,
    /// Version 2's floor: one small durable record per poll batch and source partition before
    /// handing the batch out, one after it is settled.
    BatchFloor,
    Ours,
    /// Kafka share groups (KIP-932), the Java client in a child process.
    Share,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Plain,
        Kind::Floor,
        Kind::BatchFloor,
        Kind::Ours,
        Kind::Share,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Plain => "plain",
            Kind::Floor => "floor",
            Kind::BatchFloor => "batch_floor",
            Kind::Ours => "ours",
            Kind::Share => "share",
        }
    }
}

/// The marker format "ours" writes, chosen once on the command line.
static OURS_FORMAT: std::sync::OnceLock<MarkerFormat> = std::sync::OnceLock::new();

pub fn set_ours_format(format: MarkerFormat) {
    let _ = OURS_FORMAT.set(format);
}

/// How "ours" settles what it receives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Acks {
    /// One `ack()` future per delivery.
    #[default]
    Each,
    /// One `Delivery::ack_many` per batch from `recv_batch`.
    Batch,
}

/// How "ours" settles, chosen once on the command line.
static OURS_ACKS: std::sync::OnceLock<Acks> = std::sync::OnceLock::new();

pub fn set_ours_acks(acks: Acks) {
    let _ = OURS_ACKS.set(acks);
}

pub fn parse_acks(s: &str) -> Result<Acks, String> {
    match s {
        "each" => Ok(Acks::Each),
        "batch" => Ok(Acks::Batch),
        _ => Err(format!("`{s}`: `each` or `batch`")),
    }
}

/// librdkafka settings "ours" passes to its client (consumer and markers producer), chosen once
/// on the command line: to try a knob with everything else equal.
static OURS_SETTINGS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

pub fn set_ours_settings(settings: Vec<(String, String)>) {
    let _ = OURS_SETTINGS.set(settings);
}

/// Ours' settle window, when the command line gives one (else the client's default).
static OURS_SETTLE_WINDOW: std::sync::OnceLock<Duration> = std::sync::OnceLock::new();

pub fn set_ours_settle_window(window: Duration) {
    let _ = OURS_SETTLE_WINDOW.set(window);
}

pub fn parse_setting(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

pub fn parse_format(s: &str) -> Result<MarkerFormat, String> {
    match s {
        "v1" => Ok(MarkerFormat::V1),
        "v2" => Ok(MarkerFormat::V2),
        other => Err(format!("`{other}` is not a marker format (v1 or v2)")),
    }
}

/// Records per batch for the floor and ours (ours: `max_batch`): the same for both, so the
/// comparison is of the work per record, not of batch sizes.
pub const BATCH: usize = 2_000;

/// Ours may hold this many deliveries unsettled (`max_unsettled`): room for the batches in
/// flight plus the acks on their way.
const UNSETTLED: usize = 10_000;

/// What one consuming run saw.
pub struct Consumed {
    pub received: usize,
    /// From subscribing (creating the consumer) to the last record processed.
    pub elapsed: Duration,
    /// The steady part: records processed after the one at a fifth of a known target, and the
    /// time from that record to the end (see [`Steady`]); `None` when the target was unknown.
    pub steady: Option<(usize, Duration)>,
    /// Produce-to-handout latency of each record, in ms (record creation time to the moment
    /// the application gets it).
    pub latencies_ms: Vec<f64>,
    /// CPU seconds of a consumer that runs in its own process; `None` when it runs in this
    /// one (the caller measures this process).
    pub cpu_seconds: Option<f64>,
    /// The part of `cpu_seconds` a JVM consumer's JIT compiler threads used (the share peer).
    pub jit_cpu_seconds: Option<f64>,
}

/// Marks the record at a fifth of the target, so that the throughput is taken over the rest
/// of the run: neither joining the group (which varies by seconds from run to run, and most
/// for share groups, whose assignment can wait for a heartbeat) nor the first fetch is in it,
/// while all the fetching, handing out and acknowledging after it is, up to the last record
/// durable. Every kind is measured this way, the Java share peer too.
pub struct Steady {
    mark: usize,
    at: Option<Instant>,
}

impl Steady {
    /// For a run that stops at `target` records (`usize::MAX`: unknown, no steady part).
    pub fn new(target: usize) -> Self {
        Steady {
            mark: if target == usize::MAX {
                usize::MAX
            } else {
                target / 5
            },
            at: None,
        }
    }

    /// `count` records were handed out so far.
    pub fn saw(&mut self, count: usize) {
        if self.at.is_none() && count >= self.mark {
            self.at = Some(Instant::now());
        }
    }

    /// The steady part of a run that ended now with `total` records processed.
    pub fn window(&self, total: usize) -> Option<(usize, Duration)> {
        Some((total.checked_sub(self.mark)?, self.at?.elapsed()))
    }
}

/// Stops a consumer once it has processed this many records (`usize::MAX` until known).
pub type Target = Arc<AtomicUsize>;

/// How many records a running consumer has handed out so far.
pub type Seen = Arc<AtomicUsize>;

fn latency_of(m: &BorrowedMessage<'_>) -> f64 {
    m.timestamp()
        .to_millis()
        .map_or(0.0, |ts| (now_ms() - ts as f64).max(0.0))
}

/// Consumes `topics.source` with `kind` until `target` records were processed or `limit`
/// passed. `unsettled` is the share of first deliveries ours leaves unacked (redelivered).
pub async fn consume(
    kind: Kind,
    brokers: &str,
    topics: &Topics,
    target: Target,
    seen: Seen,
    limit: Duration,
    unsettled: f64,
) -> Result<Consumed, Error> {
    match kind {
        Kind::Plain => {
            let (b, t) = (brokers.to_string(), topics.source.clone());
            tokio::task::spawn_blocking(move || plain(&b, &t, &target, &seen, limit)).await?
        }
        Kind::Floor | Kind::BatchFloor => {
            let side = format!("{}.floor", topics.source);
            // As many partitions as ours' markers topic, so that the floor writes its small
            // records into as many partitions, and so as many produce requests, as ours would.
            create(brokers, &side, super::kafka::markers_partitions(), &[]).await?;
            let (b, t) = (brokers.to_string(), topics.source.clone());
            let per_batch = kind == Kind::BatchFloor;
            tokio::task::spawn_blocking(move || {
                floor(&b, &t, &side, &target, &seen, limit, per_batch)
            })
            .await?
        }
        Kind::Ours => ours(brokers, topics, &target, &seen, limit, unsettled).await,
        Kind::Share => {
            let peers = share::dir()?;
            let (b, t) = (brokers.to_string(), topics.source.clone());
            let warm_up = topics.share_warm_up.map(|n| (topics.warm_up(), n));
            tokio::task::spawn_blocking(move || {
                share::consume(&peers, &b, &t, warm_up, &target, &seen, limit)
            })
            .await?
        }
    }
}

/// A consumer for the plain and floor kinds, with the fetch pacing the client library uses
/// (`fetch.queue.backoff.ms=10`): with librdkafka's default of a second, the ceiling itself
/// idled most of each second and was no ceiling.
fn base_consumer(brokers: &str, topic: &str, auto_commit: bool) -> Result<BaseConsumer, Error> {
    let c: BaseConsumer = client(brokers)
        .set("fetch.queue.backoff.ms", "10")
        .set("group.id", unique("bench-group"))
        .set("auto.offset.reset", "earliest")
        .set(
            "enable.auto.commit",
            if auto_commit { "true" } else { "false" },
        )
        .create()?;
    c.subscribe(&[topic])?;
    Ok(c)
}

fn plain(
    brokers: &str,
    topic: &str,
    target: &Target,
    seen: &Seen,
    limit: Duration,
) -> Result<Consumed, Error> {
    let started = Instant::now();
    let mut steady = Steady::new(target.load(Ordering::Relaxed));
    let c = base_consumer(brokers, topic, true)?;
    let mut lat = Vec::new();
    while lat.len() < target.load(Ordering::Relaxed) && started.elapsed() < limit {
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            let m = m?;
            lat.push(latency_of(&m));
            seen.fetch_add(1, Ordering::Relaxed);
            steady.saw(lat.len());
        }
    }
    Ok(Consumed {
        received: lat.len(),
        elapsed: started.elapsed(),
        steady: steady.window(lat.len()),
        latencies_ms: lat,
        cpu_seconds: None,
        jit_cpu_seconds: None,
    })
}

/// The least any markers design must do: before handing a batch out, one small durable record
/// per message (the Start); after, another (the End), sent while the next batch is polled.
/// With `per_batch`, one record per source partition of the batch instead of one per message:
/// what version 2's batch Start and Settle cost at the least.
fn floor(
    brokers: &str,
    topic: &str,
    side: &str,
    target: &Target,
    seen: &Seen,
    limit: Duration,
    per_batch: bool,
) -> Result<Consumed, Error> {
    let started = Instant::now();
    let mut steady = Steady::new(target.load(Ordering::Relaxed));
    let c = base_consumer(brokers, topic, false)?;
    let p: FutureProducer = client(brokers)
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "2")
        .create()?;
    let mut lat = Vec::new();
    let mut ends: Vec<DeliveryFuture> = Vec::new();
    let small = [0u8; 16];
    while lat.len() < target.load(Ordering::Relaxed) && started.elapsed() < limit {
        let mut batch = Vec::new();
        if let Some(m) = c.poll(Duration::from_millis(100)) {
            batch.push(m?);
            while batch.len() < BATCH {
                match c.poll(Duration::ZERO) {
                    Some(m) => batch.push(m?),
                    None => break,
                }
            }
        }
        if batch.is_empty() {
            continue;
        }
        // The partitions a marker is written to: one per message, or one per partition. The
        // side topic has as many partitions as ours' markers topic; a source partition maps to
        // one by its number modulo the count (ours hashes it, which may collide more).
        let side_partitions = super::kafka::markers_partitions();
        let mut marked: Vec<i32> = batch
            .iter()
            .map(|m| m.partition() % side_partitions)
            .collect();
        if per_batch {
            marked.sort_unstable();
            marked.dedup();
        }
        let small_record = |partition: i32| {
            p.send_result(
                FutureRecord::<(), _>::to(side)
                    .partition(partition)
                    .payload(&small[..]),
            )
            .map_err(|(e, _)| e)
        };
        let starts: Vec<DeliveryFuture> = marked
            .iter()
            .map(|&partition| small_record(partition))
            .collect::<Result<_, _>>()?;
        futures::executor::block_on(join_all(starts.into_iter().chain(ends.drain(..))));
        c.commit_consumer_state(CommitMode::Async)?;
        for m in &batch {
            lat.push(latency_of(m));
            seen.fetch_add(1, Ordering::Relaxed);
        }
        for &partition in &marked {
            ends.push(small_record(partition)?);
        }
        steady.saw(lat.len());
    }
    futures::executor::block_on(join_all(ends));
    Ok(Consumed {
        received: lat.len(),
        elapsed: started.elapsed(),
        steady: steady.window(lat.len()),
        latencies_ms: lat,
        cpu_seconds: None,
        jit_cpu_seconds: None,
    })
}

/// The client library. Acks are pipelined as an application would: each `ack()` future goes
/// into one `FuturesUnordered` driven by the receive loop, so many Ends are on their way at
/// once without a task per record (a `tokio::spawn` per ack cost more CPU than our whole
/// settlement path; BENCHMARKS.md, "Client cost per record"). With `--ours-acks batch` it
/// works a batch at a time instead: `recv_batch`, then one `Delivery::ack_many` per batch.
/// With `unsettled` > 0, that share of first deliveries is abandoned and acked when it comes
/// back.
async fn ours(
    brokers: &str,
    topics: &Topics,
    target: &Target,
    seen: &Seen,
    limit: Duration,
    unsettled: f64,
) -> Result<Consumed, Error> {
    let config = ConsumerConfig::new(
        brokers,
        unique("bench-group"),
        [&topics.source],
        &topics.markers,
    )
    .timeout(Duration::from_secs(2))
    .max_batch(BATCH)
    .max_unsettled(UNSETTLED)
    .marker_format(OURS_FORMAT.get().copied().unwrap_or_default());
    let config = match OURS_SETTLE_WINDOW.get() {
        Some(&window) => config.settle_window(window),
        None => config,
    };
    let config = OURS_SETTINGS
        .get()
        .into_iter()
        .flatten()
        .fold(config, |c, (k, v)| c.set(k, v));
    let started = Instant::now();
    let mut steady = Steady::new(target.load(Ordering::Relaxed));
    let mut c = RedeliveryConsumer::new(config).await?;
    let mut lat = Vec::new();
    // What the application does with a delivery before settling it: note it, and abandon
    // the `unsettled` share of first deliveries (`None`).
    let mut take = |d: Delivery| {
        let handed = seen.fetch_add(1, Ordering::Relaxed) + 1;
        steady.saw(handed);
        if d.attempt() == 1 {
            lat.push(
                d.timestamp_ms()
                    .map_or(0.0, |ts| (now_ms() - ts as f64).max(0.0)),
            );
            if rand::random::<f64>() < unsettled {
                d.abandon();
                return None;
            }
        }
        Some(d)
    };
    let give_up = tokio::time::sleep(limit.saturating_sub(started.elapsed()));
    tokio::pin!(give_up);
    // The target can grow while nothing arrives (a fixed-load run sets it when its producer
    // is done): look at it again now and then.
    let mut recheck = tokio::time::interval(Duration::from_millis(10));
    let mut acked = 0usize;
    if OURS_ACKS.get().copied().unwrap_or_default() == Acks::Batch {
        let mut acks = FuturesUnordered::new();
        while acked < target.load(Ordering::Relaxed) {
            tokio::select! {
                biased;
                Some(done) = acks.next() => acked += Result::unwrap_or(done, 0),
                got = c.recv_batch() => {
                    let Some(batch) = got else { break };
                    let kept: Vec<Delivery> = batch.into_iter().filter_map(&mut take).collect();
                    let n = kept.len();
                    acks.push(async move { Delivery::ack_many(kept).await.map(|()| n) });
                }
                _ = recheck.tick() => {}
                () = &mut give_up => break,
            }
        }
    } else {
        let mut acks = FuturesUnordered::new();
        while acked < target.load(Ordering::Relaxed) {
            tokio::select! {
                biased;
                Some(done) = acks.next() => {
                    if Result::is_ok(&done) {
                        acked += 1;
                    }
                }
                got = c.recv() => {
                    let Some(d) = got else { break };
                    if let Some(d) = take(d) {
                        acks.push(d.ack());
                    }
                }
                _ = recheck.tick() => {}
                () = &mut give_up => break,
            }
        }
    }
    let received = acked;
    let elapsed = started.elapsed();
    let steady = steady.window(received);
    // The client's poll thread alone, from its start to here (it exits when the consumer
    // closes): the part of the client's CPU the library spends outside the application's
    // thread and the producers', with less noise than the whole process's.
    if std::env::var_os("BENCH_POLL_THREAD_CPU").is_some() {
        let poll = redelivery_testkit::process::thread_cpu_seconds(
            std::process::id(),
            &["redelivery-poll"],
        );
        eprintln!(
            "ours: the poll thread's CPU s per million {:.3}",
            poll / received.max(1) as f64 * 1e6
        );
    }
    c.close().await?;
    Ok(Consumed {
        received,
        elapsed,
        steady,
        latencies_ms: lat,
        cpu_seconds: None,
        jit_cpu_seconds: None,
    })
}
