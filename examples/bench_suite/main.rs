//! The benchmark suite: our client and tracker side by side with a plain consumer (the ceiling)
//! and the design floor, on the same broker in the same run, scenarios alternating. Writes
//! `results.json` and PNG plots to a results folder; BENCHMARKS.md has the method and numbers.
//!
//! ```text
//! scripts/bench                 # starts the broker, builds in release, runs everything
//! scripts/bench --quick         # every scenario briefly (what CI runs; no timing claims)
//! ```

mod consumers;
mod kafka;
mod plot;
mod share;
mod stats;
mod tracker;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;

use consumers::{consume, Kind};
use stats::{Latency, Spread};
use tracker::TrackerProcess;

/// Any error of the suite, with its message.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser, Debug)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "KAFKA_BOOTSTRAP", default_value = "127.0.0.1:39092")]
    brokers: String,
    /// Run every scenario briefly, to prove the harness works; the numbers mean nothing.
    #[arg(long)]
    quick: bool,
    /// Where results.json and the plots go.
    #[arg(long, default_value = "bench-results")]
    out: PathBuf,
    /// Repetitions of each scenario (alternating A B C A B C ...).
    #[arg(long)]
    reps: Option<usize>,
    /// Offer this many records per second in the latency runs instead of half the plain
    /// consumer's median throughput (which the slower consumers may not sustain).
    #[arg(long)]
    offered: Option<f64>,
    /// A second latency load that every consumer sustains (records per second; 0: none).
    #[arg(long, default_value_t = 20_000.0)]
    sustained: f64,
    /// Offered load (records per second) of the redelivery scenario's fixed-load runs.
    #[arg(long, default_value_t = 10_000.0)]
    redelivery_offered: f64,
    /// Message sizes in bytes.
    #[arg(long, value_delimiter = ',', default_value = "100,1024")]
    sizes: Vec<usize>,
    /// Which parts to run (all by default): throughput, latency, redelivery, alone. Latency
    /// without throughput needs `--offered`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "throughput,latency,redelivery,alone"
    )]
    parts: Vec<Part>,
    /// Which consumers to compare (all by default).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "plain,floor,batch-floor,ours,share"
    )]
    kinds: Vec<Kind>,
    /// The marker format "ours" writes: v2 (batched, the client's default) or v1 (one marker
    /// per record), to compare the two with everything else equal; the tracker-alone scenario
    /// writes its markers in it too.
    #[arg(long, default_value = "v2", value_parser = consumers::parse_format)]
    ours_format: kafka_redelivery::client::MarkerFormat,
    /// How ours' application settles: `each` delivery with its own `ack()` future (a handler
    /// pool's way), or each poll `batch` with one `Delivery::ack_many` (a batch worker's way).
    #[arg(long, default_value = "each", value_parser = consumers::parse_acks)]
    ours_acks: consumers::Acks,
    /// A librdkafka setting for ours' client (repeatable), e.g. `--ours-set linger.ms=0`.
    #[arg(long, value_name = "KEY=VALUE", value_parser = consumers::parse_setting)]
    ours_set: Vec<(String, String)>,
    /// Ours' settle window in ms (the client's `settle_window`, 1 by default): how long
    /// settlements are gathered into one Settle marker.
    #[arg(long)]
    ours_settle_window_ms: Option<u64>,
    /// Partitions of the markers topic in the throughput, latency and redelivery scenarios (1,
    /// `topics create`'s default). Each markers partition a poll batch's records map to costs a
    /// produce request the batch waits for: BENCHMARKS.md, "How many markers partitions".
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(i32).range(1..))]
    markers_partitions: i32,
    /// Records the share peer, a JVM started for each throughput run, consumes from a topic of
    /// its own before its timed part, so that its code is compiled before the clock starts as
    /// a long-running consumer's is (200,000 by default, 500 with `--quick`; 0: none).
    #[arg(long)]
    share_warm_up: Option<usize>,
    /// Run the latency runs of every kind at the same time, each on topics of its own with a
    /// load of its own, their loads starting together: a broker pause or a busy moment of the
    /// machine then falls on every kind alike, where one after another it falls on whichever
    /// kind is running and decides the ratio of their p99s.
    #[arg(long)]
    together: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Part {
    Throughput,
    Latency,
    Redelivery,
    Alone,
}

/// The amounts of work; `--quick` shrinks all of them.
struct Plan {
    reps: usize,
    throughput_messages: usize,
    latency_span: Duration,
    /// Caps the offered load of the latency runs (quick mode: the harness, not the numbers).
    max_offered: f64,
    /// A fixed offered load, if given.
    offered: Option<f64>,
    alone_pairs: usize,
    alone_in_flight: usize,
    /// Offered load of the redelivery scenario's fixed-load runs.
    redelivery_offered: f64,
    /// The second, sustainable latency load.
    sustained: f64,
    /// Records the share peer consumes before a timed throughput run (`--share-warm-up`).
    share_warm_up: usize,
    /// Latency runs of all kinds at once (`--together`).
    together: bool,
    kinds: Vec<Kind>,
    parts: Vec<Part>,
}

impl Plan {
    fn of(args: &Args) -> Self {
        if args.quick {
            Plan {
                reps: args.reps.unwrap_or(1),
                throughput_messages: 2_000,
                latency_span: Duration::from_secs(2),
                max_offered: 2_000.0,
                offered: args.offered,
                alone_pairs: 5_000,
                alone_in_flight: 5_000,
                redelivery_offered: 1_000.0,
                sustained: args.sustained.min(1_000.0),
                share_warm_up: args.share_warm_up.unwrap_or(500),
                together: args.together,
                kinds: args.kinds.clone(),
                parts: args.parts.clone(),
            }
        } else {
            Plan {
                reps: args.reps.unwrap_or(3),
                throughput_messages: 500_000,
                latency_span: Duration::from_secs(5),
                max_offered: f64::INFINITY,
                offered: args.offered,
                alone_pairs: 500_000,
                alone_in_flight: 1_000_000,
                redelivery_offered: args.redelivery_offered,
                sustained: args.sustained,
                share_warm_up: args.share_warm_up.unwrap_or(200_000),
                together: args.together,
                kinds: args.kinds.clone(),
                parts: args.parts.clone(),
            }
        }
    }
}

impl Plan {
    fn runs(&self, part: Part) -> bool {
        self.parts.contains(&part)
    }
}
const LIMIT: Duration = Duration::from_secs(600);

#[derive(Debug, Default, Serialize)]
struct SizeResult {
    /// Messages per second over the steady part of each run, per consumer.
    throughput: BTreeMap<&'static str, Spread>,
    /// Messages per second from subscribing to the last record (group join included).
    throughput_from_subscription: BTreeMap<&'static str, Spread>,
    /// `max.poll.records` of the share consumer: the batch ours and the floor take.
    share_max_poll_records: usize,
    /// CPU seconds per million messages: the consuming process (client), and the tracker.
    client_cpu_per_million: BTreeMap<&'static str, Spread>,
    /// The part of `client_cpu_per_million` a JVM client (the share peer, started for each
    /// run) spent compiling its own code, which a consumer in service did long ago.
    client_jit_cpu_per_million: BTreeMap<&'static str, Spread>,
    tracker_cpu_per_million: Spread,
    /// CPU seconds per million messages of the broker process (when its pid is known): share
    /// groups move work from the client to the broker, so this belongs in the comparison.
    broker_cpu_per_million: BTreeMap<&'static str, Spread>,
    /// The part of `broker_cpu_per_million` the broker's JIT compiler threads used: warm-up
    /// that a broker in service has behind it (`kafka::jit_cpu_seconds`).
    broker_jit_cpu_per_million: BTreeMap<&'static str, Spread>,
    /// Produce-to-handout latency per offered load: `half_plain` (half the plain consumer's
    /// median throughput, as specified) and `sustained` (a load every consumer keeps up with,
    /// so the figures are latencies rather than backlogs).
    latency: BTreeMap<&'static str, LoadResult>,
}

/// Latency at one offered load.
#[derive(Debug, Default, Serialize)]
struct LoadResult {
    offered_per_second: f64,
    p50_ms: BTreeMap<&'static str, Spread>,
    p99_ms: BTreeMap<&'static str, Spread>,
    /// The p99 of the records after the first second of load. Every run starts on topics
    /// created for it, and the first tenth of a second or so of load is slow for every kind,
    /// plain included (BENCHMARKS.md, "The start of a latency run"): in a five-second run that
    /// start alone can set the whole run's p99.
    steady_p99_ms: BTreeMap<&'static str, Spread>,
    #[serde(skip)]
    samples: BTreeMap<&'static str, Vec<f64>>,
}

/// Deadline-to-redelivery lag from the tracker's histogram: each figure is the upper bound of
/// the bucket holding that quantile (1, 2, 5, 7.5, 10, 12.5, 15, 20, 25, 50, 100, 250 ms, ...).
#[derive(Debug, Default, Serialize)]
struct Lag {
    p50_ms: Option<f64>,
    p99_ms: Option<f64>,
    max_bucket_ms: Option<f64>,
    redeliveries: f64,
    /// Records the tracker read ahead of their deadline, by outcome (`read`, `used`, `unused`,
    /// `skipped`): `unused` is the reading done for deliveries settled just before they fell due.
    read_ahead: BTreeMap<&'static str, f64>,
}

#[derive(Debug, Default, Serialize)]
struct Redelivery {
    unsettled_share: f64,
    /// Flat out: messages per second, and the lag while the client takes the CPU.
    throughput: Spread,
    flat_out: Lag,
    /// At a fixed offered load the machine sustains.
    offered_per_second: f64,
    at_offered_load: Lag,
}

#[derive(Debug, Serialize)]
struct Results {
    quick: bool,
    machine: String,
    reps: usize,
    throughput_messages: usize,
    latency_span_s: u64,
    /// Whether the latency runs of all kinds ran at once (`--together`).
    latency_together: bool,
    /// Whether kmq could be fetched (it is skipped when it cannot).
    kmq: String,
    sizes: BTreeMap<usize, SizeResult>,
    redelivery: Option<Redelivery>,
    tracker_alone: Option<tracker::Alone>,
}

/// What one throughput run measured.
struct Run {
    /// Messages per second over the steady part of the run (`consumers::Steady`).
    rate: f64,
    /// Messages per second from subscribing to the last record: the rate a user starting a
    /// consumer on a backlog sees, group join included.
    from_subscription: f64,
    /// CPU seconds per million messages of the consumer, the tracker (ours) and the broker.
    client_cpu: f64,
    /// The part of `client_cpu` a JVM client's JIT compiler threads used (the share peer).
    client_jit_cpu: Option<f64>,
    tracker_cpu: Option<f64>,
    broker_cpu: Option<f64>,
    /// The part of `broker_cpu` spent compiling (the JVM's JIT threads).
    broker_jit_cpu: Option<f64>,
    /// The tracker's `/metrics` at the end (ours).
    tracker_metrics: Option<String>,
    /// How quiet the machine was when the timed part began.
    settled: kafka::Settled,
}

/// One throughput run: `n` preloaded records consumed as fast as `kind` can.
/// Marks where a throughput run's consuming starts, for an instruction count of the consumer
/// alone: `valgrind --tool=callgrind --dump-before=bench_suite::consuming_starts
/// --dump-before=bench_suite::consuming_ends` writes the counts of every thread between the
/// two to the second dump (the preload's producer and its librdkafka threads left out;
/// `--zero-before` would keep the counts of threads that had already exited).
#[inline(never)]
fn consuming_starts() {
    // Different values, so the linker does not fold the two into one symbol.
    std::hint::black_box(1u8);
}

/// Where a throughput run's consuming ends (see [`consuming_starts`]).
#[inline(never)]
fn consuming_ends() {
    std::hint::black_box(2u8);
}

async fn throughput_run(
    brokers: &str,
    kind: Kind,
    n: usize,
    size: usize,
    unsettled: f64,
    share_warm_up: usize,
) -> Result<Run, Error> {
    kafka::settle().await;
    let mut topics = kafka::topics(brokers).await?;
    kafka::preload(brokers, &topics.source, n, size).await?;
    if kind == Kind::Share && share_warm_up > 0 {
        kafka::create(brokers, &topics.warm_up(), kafka::PARTITIONS, &[]).await?;
        kafka::preload(brokers, &topics.warm_up(), share_warm_up, size).await?;
        topics.share_warm_up = Some(share_warm_up);
    }
    let names = topics.all();
    // The preload leaves the broker flushing; the timed run starts on a quiet machine.
    let settled = kafka::settle().await;
    let tracker = match kind {
        Kind::Ours => Some(
            TrackerProcess::start(brokers, &topics.markers, &kafka::unique("bench-tracker"))?.0,
        ),
        _ => None,
    };
    let me = std::process::id();
    let broker = kafka::broker_pid();
    let (cpu0, tcpu0, bcpu0, jit0) = (
        kafka::cpu_seconds(me),
        tracker.as_ref().map_or(0.0, |t| t.cpu_seconds()),
        broker.map_or(0.0, kafka::cpu_seconds),
        broker.map_or(0.0, kafka::jit_cpu_seconds),
    );
    let target = Arc::new(AtomicUsize::new(n));
    let seen = Arc::new(AtomicUsize::new(0));
    consuming_starts();
    let got = consume(kind, brokers, &topics, target, seen, LIMIT, unsettled).await?;
    consuming_ends();
    if got.received < n {
        return Err(format!("{} consumed {} of {n}", kind.name(), got.received).into());
    }
    let per_million = |seconds: f64| seconds / n as f64 * 1e6;
    let run = Run {
        // The steady part when there is one (always, in these runs: the target is known).
        rate: got.steady.map_or_else(
            || n as f64 / got.elapsed.as_secs_f64().max(1e-6),
            |(k, d)| k as f64 / d.as_secs_f64().max(1e-6),
        ),
        from_subscription: n as f64 / got.elapsed.as_secs_f64().max(1e-6),
        client_cpu: per_million(
            got.cpu_seconds
                .unwrap_or_else(|| kafka::cpu_seconds(me) - cpu0),
        ),
        client_jit_cpu: got.jit_cpu_seconds.map(per_million),
        tracker_cpu: tracker
            .as_ref()
            .map(|t| per_million(t.cpu_seconds() - tcpu0)),
        broker_cpu: broker.map(|b| per_million(kafka::cpu_seconds(b) - bcpu0)),
        broker_jit_cpu: broker.map(|b| per_million(kafka::jit_cpu_seconds(b) - jit0)),
        tracker_metrics: tracker.as_ref().map(|t| t.metrics()),
        settled,
    };
    if let Some(t) = tracker {
        t.stop();
    }
    kafka::drop_topics_and_wait(brokers, &names).await;
    Ok(run)
}

/// What one latency run measured.
struct LatencyRun {
    /// Produce-to-handout latency of each offered record, in ms.
    latencies_ms: Vec<f64>,
    /// The tracker's `/metrics` at the end (ours).
    tracker_metrics: Option<String>,
}

/// One latency run: `rate` records per second offered for `span`; latencies per record.
/// `unsettled` is the share of first deliveries ours leaves unacked (redelivered). With
/// `together`, the load starts only once every run waiting on it has warmed up.
async fn latency_run(
    brokers: &str,
    kind: Kind,
    rate: f64,
    span: Duration,
    size: usize,
    unsettled: f64,
    together: Option<Arc<tokio::sync::Barrier>>,
) -> Result<LatencyRun, Error> {
    kafka::settle().await;
    let topics = kafka::topics(brokers).await?;
    let source = topics.source.clone();
    let names = topics.all();
    let tracker = match kind {
        Kind::Ours => Some(
            TrackerProcess::start(brokers, &topics.markers, &kafka::unique("bench-tracker"))?.0,
        ),
        _ => None,
    };
    let target = Arc::new(AtomicUsize::new(usize::MAX));
    let seen = Arc::new(AtomicUsize::new(0));
    let consumer = {
        let (b, target, seen) = (brokers.to_string(), target.clone(), seen.clone());
        // A consumer that cannot keep up drains its backlog after the load stops; bounded.
        let limit = span + Duration::from_secs(300);
        tokio::spawn(
            async move { consume(kind, &b, &topics, target, seen, limit, unsettled).await },
        )
    };
    // One record per partition first, from the producer that then offers the load, so the
    // group has formed and the producer is connected before the timed load starts.
    let producer = kafka::producer(brokers)?;
    let warm_up = kafka::PARTITIONS as usize;
    kafka::preload_with(&producer, &source, warm_up, size).await?;
    // The share peer (a Java process) reports only its first record; the others count each.
    let (reported, rest) = match kind {
        Kind::Share => (1, Duration::from_secs(1)),
        _ => (warm_up, Duration::ZERO),
    };
    let waited = std::time::Instant::now();
    while seen.load(Ordering::Relaxed) < reported {
        if waited.elapsed() > Duration::from_secs(120) {
            return Err(format!("{}: the warm-up records never arrived", kind.name()).into());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Time for the warm-up records it does not report to arrive before the load starts.
    tokio::time::sleep(rest).await;
    if let Some(all_ready) = together {
        tokio::time::timeout(Duration::from_secs(300), all_ready.wait())
            .await
            .map_err(|_| format!("{}: the kinds run with it never got ready", kind.name()))?;
    }
    let sent = kafka::offer(&producer, &source, rate, span, size).await?;
    eprintln!(
        "  {}: offered {sent} in {span:?}; waiting for the consumer",
        kind.name()
    );
    target.store(sent + warm_up, Ordering::Relaxed);
    let got = consumer.await??;
    if got.received < sent + warm_up {
        return Err(format!(
            "{} received {} of {}",
            kind.name(),
            got.received,
            sent + warm_up
        )
        .into());
    }
    // `BENCH_LATENCIES=DIR` keeps each run's latencies, warm-up first, in the order the
    // records were handed out: where in a run the slow ones fall (BENCHMARKS.md, 2026-12-02).
    if let Some(dir) = std::env::var_os("BENCH_LATENCIES") {
        let text: String = got.latencies_ms.iter().map(|l| format!("{l}\n")).collect();
        let file = std::path::Path::new(&dir).join(format!(
            "{}-{}-{}",
            kind.name(),
            size,
            kafka::unique("run")
        ));
        if let Err(e) = std::fs::write(&file, text) {
            eprintln!("  could not keep the latencies in {}: {e}", file.display());
        }
    }
    let run = LatencyRun {
        latencies_ms: got.latencies_ms.into_iter().skip(warm_up).collect(),
        tracker_metrics: tracker.as_ref().map(|t| t.metrics()),
    };
    if let Some(t) = tracker {
        t.stop();
    }
    kafka::drop_topics_and_wait(brokers, &names).await;
    Ok(run)
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_string())
        })
        .unwrap_or_default();
    format!("{cpus} CPUs, {model}")
}

async fn per_size(brokers: &str, plan: &Plan, size: usize) -> Result<SizeResult, Error> {
    let mut r = SizeResult::default();
    let n = plan.throughput_messages;
    let mut rates: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut from_subscription: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut cpu: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut broker_cpu: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut broker_jit_cpu: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut client_jit_cpu: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut tracker_cpu = Vec::new();
    for rep in 0..plan.reps {
        if !plan.runs(Part::Throughput) {
            break;
        }
        for &kind in &plan.kinds {
            let run = throughput_run(brokers, kind, n, size, 0.0, plan.share_warm_up).await?;
            eprintln!(
                "size {size} rep {rep} {}: {:.0} msg/s ({:.0} from subscription); CPU s/M client {:.2}{}, tracker {:.2}, broker {:.2} (JIT {:.2}) (started after {:.1} s of settling, machine {:.0} % busy)",
                kind.name(),
                run.rate,
                run.from_subscription,
                run.client_cpu,
                run.client_jit_cpu
                    .map_or(String::new(), |j| format!(" (JIT {j:.2})")),
                run.tracker_cpu.unwrap_or(0.0),
                run.broker_cpu.unwrap_or(f64::NAN),
                run.broker_jit_cpu.unwrap_or(f64::NAN),
                run.settled.waited_s,
                run.settled.busy * 100.0,
            );
            rates.entry(kind.name()).or_default().push(run.rate);
            from_subscription
                .entry(kind.name())
                .or_default()
                .push(run.from_subscription);
            cpu.entry(kind.name()).or_default().push(run.client_cpu);
            if let Some(b) = run.broker_cpu {
                broker_cpu.entry(kind.name()).or_default().push(b);
            }
            if let Some(j) = run.client_jit_cpu {
                client_jit_cpu.entry(kind.name()).or_default().push(j);
            }
            if let Some(b) = run.broker_jit_cpu {
                broker_jit_cpu.entry(kind.name()).or_default().push(b);
            }
            tracker_cpu.extend(run.tracker_cpu);
        }
    }
    for (k, v) in &rates {
        r.throughput.insert(k, Spread::of(v));
    }
    for (k, v) in &from_subscription {
        r.throughput_from_subscription.insert(k, Spread::of(v));
    }
    r.share_max_poll_records = consumers::BATCH;
    for (k, v) in &cpu {
        r.client_cpu_per_million.insert(k, Spread::of(v));
    }
    for (k, v) in &broker_cpu {
        r.broker_cpu_per_million.insert(k, Spread::of(v));
    }
    for (k, v) in &client_jit_cpu {
        r.client_jit_cpu_per_million.insert(k, Spread::of(v));
    }
    for (k, v) in &broker_jit_cpu {
        r.broker_jit_cpu_per_million.insert(k, Spread::of(v));
    }
    r.tracker_cpu_per_million = Spread::of(&tracker_cpu);
    if !plan.runs(Part::Latency) {
        return Ok(r);
    }
    let half_plain = plan.offered.unwrap_or_else(|| {
        (r.throughput.get("plain").map_or(1000.0, |s| s.median) / 2.0).min(plan.max_offered)
    });
    let mut loads = vec![("half_plain", half_plain)];
    if plan.sustained > 0.0 {
        loads.push(("sustained", plan.sustained.min(plan.max_offered)));
    }
    for (name, offered) in loads {
        let l = latency_at(brokers, plan, size, offered).await?;
        r.latency.insert(name, l);
    }
    Ok(r)
}

/// Latency runs of every consumer at one offered load, alternating, `plan.reps` times.
async fn latency_at(
    brokers: &str,
    plan: &Plan,
    size: usize,
    offered: f64,
) -> Result<LoadResult, Error> {
    let mut r = LoadResult {
        offered_per_second: offered,
        ..LoadResult::default()
    };
    let mut p50: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut p99: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    let mut steady_p99: BTreeMap<&'static str, Vec<f64>> = BTreeMap::new();
    // The records of the first second of load, in the order they were handed out.
    let first_second = (offered as usize).max(1);
    for rep in 0..plan.reps {
        for (kind, lat) in latency_runs(brokers, plan, size, offered).await? {
            let l = Latency::of(lat.clone());
            let steady = Latency::of(lat.get(first_second..).unwrap_or_default().to_vec());
            eprintln!(
                "size {size} rep {rep} {} at {offered:.0}/s: p50 {:.1} ms, p99 {:.1} ms, \
                 p99 after the first second {:.1} ms",
                kind.name(),
                l.p50,
                l.p99,
                steady.p99
            );
            p50.entry(kind.name()).or_default().push(l.p50);
            p99.entry(kind.name()).or_default().push(l.p99);
            steady_p99.entry(kind.name()).or_default().push(steady.p99);
            r.samples.entry(kind.name()).or_default().extend(lat);
        }
    }
    for (k, v) in &p50 {
        r.p50_ms.insert(k, Spread::of(v));
    }
    for (k, v) in &p99 {
        r.p99_ms.insert(k, Spread::of(v));
    }
    for (k, v) in &steady_p99 {
        r.steady_p99_ms.insert(k, Spread::of(v));
    }
    Ok(r)
}

/// One latency run of each kind: one after another, or all at once (`--together`); each
/// kind's latencies, in `plan.kinds`' order.
async fn latency_runs(
    brokers: &str,
    plan: &Plan,
    size: usize,
    offered: f64,
) -> Result<Vec<(Kind, Vec<f64>)>, Error> {
    let span = plan.latency_span;
    if !plan.together {
        let mut all = Vec::new();
        for &kind in &plan.kinds {
            let run = latency_run(brokers, kind, offered, span, size, 0.0, None).await?;
            all.push((kind, run.latencies_ms));
        }
        return Ok(all);
    }
    let ready = Arc::new(tokio::sync::Barrier::new(plan.kinds.len()));
    let runs: Vec<_> = plan
        .kinds
        .iter()
        .map(|&kind| {
            let (b, ready) = (brokers.to_string(), ready.clone());
            tokio::spawn(async move {
                let run = latency_run(&b, kind, offered, span, size, 0.0, Some(ready)).await?;
                Ok::<_, Error>((kind, run.latencies_ms))
            })
        })
        .collect();
    let mut all = Vec::new();
    for run in futures::future::join_all(runs).await {
        all.push(run??);
    }
    Ok(all)
}

/// Scenario 6: ours with a share of deliveries left unacked. Flat out (preloaded, as fast as
/// it goes: the tracker's redeliveries compete with the client for the CPU), and at a fixed
/// offered load that the machine sustains, where the deadline-to-redelivery lag shows what
/// the tracker itself adds.
async fn redelivery(brokers: &str, plan: &Plan) -> Result<Redelivery, Error> {
    let share = 0.1;
    let mut rates = Vec::new();
    let mut flat_out = Vec::new();
    for _ in 0..plan.reps {
        let run = throughput_run(
            brokers,
            Kind::Ours,
            plan.throughput_messages / 4,
            100,
            share,
            0,
        )
        .await?;
        eprintln!("redelivery flat out: {:.0} msg/s", run.rate);
        rates.push(run.rate);
        flat_out.extend(run.tracker_metrics);
    }
    let mut steady = Vec::new();
    for _ in 0..plan.reps {
        let run = latency_run(
            brokers,
            Kind::Ours,
            plan.redelivery_offered,
            plan.latency_span,
            100,
            share,
            None,
        )
        .await?;
        steady.extend(run.tracker_metrics);
    }
    let lag = |metrics: &[String]| Lag {
        p50_ms: tracker::lag_quantile_ms(metrics, 0.5),
        p99_ms: tracker::lag_quantile_ms(metrics, 0.99),
        max_bucket_ms: tracker::lag_quantile_ms(metrics, 1.0),
        redeliveries: tracker::lag_count(metrics),
        read_ahead: tracker::read_ahead_outcomes(metrics),
    };
    Ok(Redelivery {
        unsettled_share: share,
        throughput: Spread::of(&rates),
        flat_out: lag(&flat_out),
        offered_per_second: plan.redelivery_offered,
        at_offered_load: lag(&steady),
    })
}

fn write_plots(out: &std::path::Path, results: &Results) -> Result<(), Error> {
    plot::register_font()?;
    let mut bars = Vec::new();
    for (size, r) in &results.sizes {
        for kind in Kind::ALL {
            if let Some(s) = r.throughput.get(kind.name()) {
                bars.push((format!("{} {size} B", kind.name()), s.clone()));
            }
        }
    }
    if !bars.is_empty() {
        plot::throughput(
            &out.join("throughput.png"),
            "Throughput (median; line: min to max)",
            &bars,
        )?;
    }
    for (size, r) in &results.sizes {
        for (load, l) in &r.latency {
            let series: Vec<(String, Vec<(f64, f64)>)> = Kind::ALL
                .iter()
                .filter_map(|k| {
                    let samples = l.samples.get(k.name())?;
                    Some((k.name().to_string(), stats::cdf(samples, 400)))
                })
                .collect();
            if series.is_empty() {
                continue;
            }
            plot::latency_cdf(
                &out.join(format!("latency-cdf-{size}-{load}.png")),
                &format!(
                    "Produce to handout, {size}-byte records at {:.0}/s",
                    l.offered_per_second
                ),
                &series,
            )?;
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    consumers::set_ours_format(args.ours_format);
    consumers::set_ours_acks(args.ours_acks);
    consumers::set_ours_settings(args.ours_set.clone());
    if let Some(ms) = args.ours_settle_window_ms {
        consumers::set_ours_settle_window(Duration::from_millis(ms));
    }
    kafka::set_markers_partitions(args.markers_partitions);
    kafka::set_settling(!args.quick);
    let plan = Plan::of(&args);
    if plan.runs(Part::Latency) && !plan.runs(Part::Throughput) && plan.offered.is_none() {
        return Err("--parts latency without throughput needs --offered".into());
    }
    share::prepare()?;
    std::fs::create_dir_all(&args.out)?;
    let mut sizes = BTreeMap::new();
    for &size in &args.sizes {
        sizes.insert(size, per_size(&args.brokers, &plan, size).await?);
    }
    let redelivery = match plan.runs(Part::Redelivery) {
        true => Some(redelivery(&args.brokers, &plan).await?),
        false => None,
    };
    let alone = match plan.runs(Part::Alone) {
        true => Some(
            tracker::alone(
                &args.brokers,
                plan.alone_pairs,
                plan.alone_in_flight,
                args.ours_format,
            )
            .await?,
        ),
        false => None,
    };
    let results = Results {
        kmq: share::kmq_status(),
        quick: args.quick,
        machine: machine(),
        reps: plan.reps,
        throughput_messages: plan.throughput_messages,
        latency_span_s: plan.latency_span.as_secs(),
        latency_together: plan.together,
        sizes,
        redelivery,
        tracker_alone: alone,
    };
    let json = serde_json::to_string_pretty(&results)?;
    std::fs::write(args.out.join("results.json"), &json)?;
    write_plots(&args.out, &results)?;
    println!("{json}");
    eprintln!("results in {}", args.out.display());
    Ok(())
}
