//! The soak (`scripts/soak`): a fixed offered load for an hour with faults every few minutes,
//! nothing lost, and the resident memory, file descriptors and threads of one tracker replica
//! and one worker sampled every 10 s. Those two are never hit by a fault themselves (the
//! faults go to the other worker slots, the other replica and the broker), so their series run
//! unbroken through the rebalances, takeovers and broker restarts the faults cause; the slope
//! of each after a warm-up says whether anything grows.
//!
//! Nothing is checked from the workers' logs (millions of lines): at the end every record is
//! looked up in the topics. A produced record (or a published schedule) is settled when the
//! dead-letter topic holds it, or when it and every copy the tracker made of it (copies name
//! their very first record in `kr-original-*`) have an End in the markers topic: a redelivered
//! delivery is ended by the tracker once its copy is durable, the last one by its worker.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kafka_redelivery::client::{ScheduledRecord, Scheduler, SchedulerConfig};
use kafka_redelivery::marker::{decode, Marker};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::producer::FutureRecord;
use rdkafka::util::Timeout;
use rdkafka::{Offset, TopicPartitionList};

use crate::common::{Cluster, Topics};
use crate::fleet::{Fleet, Profile};
use crate::schedule::{Fault, FaultKind};

/// The size of a soak.
pub struct SoakSize {
    /// Records produced per second, evenly.
    pub rate: u64,
    /// How long the load and the faults last.
    pub span: Duration,
    /// Time between two faults.
    pub fault_every: Duration,
    /// Samples before this are left out of the slopes.
    pub warm_up: Duration,
    /// The fault kinds, taken in turn.
    pub kinds: Vec<FaultKind>,
    /// Where the samples (CSV) and the plot go.
    pub out: PathBuf,
}

/// The kinds a soak may inject, by the names `SOAK_FAULTS` takes.
const KINDS: [(&str, FaultKind); 4] = [
    ("worker-kill", FaultKind::WorkerKill),
    ("worker-stop", FaultKind::WorkerStop),
    ("tracker-kill", FaultKind::TrackerKill),
    ("broker-restart", FaultKind::BrokerRestart),
];

/// The kinds `SOAK_FAULTS` names (comma-separated; `none` for a soak without faults), or all
/// four in turn when it is unset. An unknown name fails the run rather than quietly soaking
/// without the fault it asked for.
pub fn kinds(names: Option<&str>) -> Vec<FaultKind> {
    match names {
        None => return KINDS.iter().map(|(_, k)| *k).collect(),
        Some("none") => return Vec::new(),
        Some(_) => {}
    }
    names
        .unwrap_or_default()
        .split(',')
        .map(|n| {
            KINDS
                .iter()
                .find(|(name, _)| *name == n.trim())
                .map(|(_, k)| *k)
                .unwrap_or_else(|| panic!("SOAK_FAULTS: unknown fault {n:?}; known: {KINDS:?}"))
        })
        .collect()
}

/// One sample of one process.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    rss_kib: u64,
    fds: u64,
    threads: u64,
}

fn usage(pid: u32) -> Option<Usage> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    };
    Some(Usage {
        rss_kib: field("VmRSS:")?,
        threads: field("Threads:")?,
        fds: std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as u64,
    })
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    let (sx, sy) = points
        .iter()
        .fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let (num, den) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| {
        (a + (x - mx) * (y - my), b + (x - mx) * (x - mx))
    });
    if den == 0.0 {
        0.0
    } else {
        num / den
    }
}

/// The faults: each kind in turn, never on worker slot 0 or tracker replica 0.
fn plan(size: &SoakSize, workers: usize) -> Vec<Fault> {
    let kinds = &size.kinds;
    let mut faults = Vec::new();
    let mut at = size.fault_every;
    let mut n = 0;
    while at < size.span && !kinds.is_empty() {
        let kind = kinds[n % kinds.len()];
        let target = match kind {
            FaultKind::TrackerKill => 1,
            _ => 1 + (n / kinds.len()) % (workers - 1),
        };
        faults.push(Fault { at, kind, target });
        at += size.fault_every;
        n += 1;
    }
    faults
}

pub async fn soak(size: SoakSize) {
    std::fs::create_dir_all(&size.out).unwrap();
    let cluster = Cluster::private("soak");
    let t = cluster.topics(8, 4).await;
    // 10 % nacked with the client's exponential back-off (1 s after the first delivery, then
    // 2 s, 4 s ... at most 30 s, 20 % jitter), 1 % rejected, handlers of 5 ms, nothing logged.
    let profile = Profile {
        args: [
            "--process-time",
            "5ms",
            "--max-unsettled",
            "2000",
            "--nack-rate",
            "0.1",
            "--nack-backoff",
            "exponential",
            "--nack-delay",
            "1s",
            "--nack-max-delay",
            "30s",
            "--reject-rate",
            "0.01",
        ]
        .map(String::from)
        .to_vec(),
        logs: false,
    };
    let workers = 3;
    let mut fleet = Fleet::start_with(&cluster, &t, workers, 2, profile);
    let sampled = (fleet.tracker_pid(0).unwrap(), fleet.worker_pid(0));
    let plan = plan(&size, workers);
    println!(
        "soak: {} records/s for {:?}, a fault every {:?} ({} faults); sampling tracker pid {} and worker pid {}",
        size.rate,
        size.span,
        size.fault_every,
        plan.len(),
        sampled.0,
        sampled.1
    );

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let stop = stop.clone();
        let csv = size.out.join("samples.csv");
        move || sample(sampled, &csv, &stop)
    });
    let producer = tokio::spawn(produce(
        cluster.producer(),
        t.source.clone(),
        size.rate,
        size.span,
    ));
    let scheduler = Scheduler::new(SchedulerConfig::new(cluster.addr.clone(), &t.markers))
        .await
        .expect("scheduler");
    let schedules = tokio::spawn(schedule(scheduler, t.source.clone(), size.span));

    let started = Instant::now();
    let done =
        tokio::task::block_in_place(|| crate::inject(&cluster, &t, &mut fleet, &plan, started));
    let produced = producer.await.unwrap();
    let scheduled = schedules.await.unwrap();
    fleet.heal();
    println!(
        "soak: load over: {produced} produced, {scheduled} scheduled; {} faults",
        done.len()
    );

    // The last schedules fall due up to 2 minutes after the load; then every record must settle.
    let deadline = Instant::now() + Duration::from_secs(900);
    tokio::time::sleep(Duration::from_secs(150)).await;
    let outcome = loop {
        let outcome = tokio::task::block_in_place(|| check(&cluster, &t, produced));
        println!("soak: {outcome:?}");
        if outcome.unsettled == 0 || Instant::now() > deadline {
            break outcome;
        }
        tokio::time::sleep(Duration::from_secs(60)).await;
    };
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let samples = sampler.join().unwrap();
    report(&size, &samples);
    assert_eq!(
        outcome.missing_records, 0,
        "records never produced: {outcome:?}"
    );
    assert_eq!(outcome.unsettled, 0, "records lost: {outcome:?}");
    assert_eq!(
        outcome.schedules_published, scheduled,
        "schedules never published: {outcome:?}"
    );
}

/// Produces `rate` records a second for `span`, keyed `s-<n>`; returns how many.
async fn produce(
    producer: rdkafka::producer::FutureProducer,
    topic: String,
    rate: u64,
    span: Duration,
) -> u64 {
    let started = Instant::now();
    let tick = Duration::from_millis(100);
    let per_tick = rate / 10;
    let mut n = 0u64;
    while started.elapsed() < span {
        let keys: Vec<String> = (n..n + per_tick).map(|i| format!("s-{i}")).collect();
        let sends: Vec<_> = keys
            .iter()
            .map(|key| {
                producer.send(
                    FutureRecord::to(&topic).key(key).payload(key.as_bytes()),
                    Timeout::Never,
                )
            })
            .collect();
        for r in futures::future::join_all(sends).await {
            r.map_err(|(e, _)| e)
                .expect("the harness produced its record");
        }
        n += per_tick;
        let due = tick.mul_f64((n / per_tick) as f64);
        tokio::time::sleep(due.saturating_sub(started.elapsed())).await;
    }
    n
}

/// Five schedules a second, due 5 to 120 s later, keyed `sched-<n>`; returns how many.
async fn schedule(scheduler: Scheduler, topic: String, span: Duration) -> u64 {
    let started = Instant::now();
    let mut n = 0u64;
    while started.elapsed() < span {
        for _ in 0..5 {
            let delay = Duration::from_secs(5 + n % 116);
            let key = format!("sched-{n}");
            let record = ScheduledRecord::to(&topic)
                .key(key.as_bytes())
                .payload(key.as_bytes());
            // Through a broker restart a send can fail: then it is tried again.
            while scheduler.send_after(record.clone(), delay).await.is_err() {
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            n += 1;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    n
}

/// Samples both processes every 10 s until told to stop, appending to `csv`.
fn sample(
    (tracker, worker): (u32, u32),
    csv: &Path,
    stop: &std::sync::atomic::AtomicBool,
) -> Vec<(f64, Usage, Usage)> {
    let mut file = std::fs::File::create(csv).unwrap();
    writeln!(file, "seconds,tracker_rss_kib,tracker_fds,tracker_threads,worker_rss_kib,worker_fds,worker_threads").unwrap();
    let started = Instant::now();
    let mut out = Vec::new();
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        if let (Some(a), Some(b)) = (usage(tracker), usage(worker)) {
            let at = started.elapsed().as_secs_f64();
            writeln!(
                file,
                "{at:.0},{},{},{},{},{},{}",
                a.rss_kib, a.fds, a.threads, b.rss_kib, b.fds, b.threads
            )
            .unwrap();
            out.push((at, a, b));
        } else {
            panic!("a sampled process is gone: the soak never faults them");
        }
        let next = Instant::now() + Duration::from_secs(10);
        while Instant::now() < next && !stop.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    out
}

/// What the topics say at the end.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Records whose key the source topic does not hold at all.
    missing_records: u64,
    /// Records (and published schedules) neither dead-lettered nor ended in every delivery.
    unsettled: u64,
    /// Records in the dead-letter topic (a record dead-lettered twice counts twice).
    dead_lettered: u64,
    copies: u64,
    schedules_published: u64,
}

/// A set of (partition, offset), as a bit per offset: millions of them in a few megabytes.
#[derive(Default)]
struct Offsets(Vec<Vec<u64>>);

impl Offsets {
    fn insert(&mut self, (partition, offset): (i32, i64)) {
        let (p, o) = (partition as usize, offset as usize);
        if self.0.len() <= p {
            self.0.resize_with(p + 1, Vec::new);
        }
        let words = &mut self.0[p];
        if words.len() <= o / 64 {
            words.resize(o / 64 + 1, 0);
        }
        words[o / 64] |= 1 << (o % 64);
    }

    fn contains(&self, (partition, offset): (i32, i64)) -> bool {
        let (p, o) = (partition as usize, offset as usize);
        self.0
            .get(p)
            .and_then(|w| w.get(o / 64))
            .is_some_and(|w| w & (1 << (o % 64)) != 0)
    }
}

fn check(cluster: &Cluster, t: &Topics, produced: u64) -> Outcome {
    let mut outcome = Outcome::default();
    // Every first delivery, and every copy by the first delivery it copies.
    let mut first: Vec<(i32, i64)> = Vec::new();
    let mut copies: HashMap<(i32, i64), Vec<(i32, i64)>> = HashMap::new();
    let mut seen_records = vec![false; produced as usize];
    let mut seen_schedules: std::collections::HashSet<u64> = Default::default();
    scan(cluster, &t.source, |m| {
        let at = (m.partition(), m.offset());
        match original(m) {
            Some(o) => {
                outcome.copies += 1;
                copies.entry(o).or_default().push(at);
            }
            None => {
                let key = m
                    .key()
                    .map(|k| String::from_utf8_lossy(k).into_owned())
                    .unwrap_or_default();
                if let Some(n) = key.strip_prefix("s-").and_then(|n| n.parse::<usize>().ok()) {
                    if let Some(seen) = seen_records.get_mut(n) {
                        *seen = true;
                    }
                } else if let Some(n) = key.strip_prefix("sched-").and_then(|n| n.parse().ok()) {
                    seen_schedules.insert(n);
                }
                first.push(at);
            }
        }
    });
    outcome.missing_records = seen_records.iter().filter(|s| !**s).count() as u64;
    outcome.schedules_published = seen_schedules.len() as u64;
    let mut ended = Offsets::default();
    scan(cluster, &t.markers, |m| match m.payload().map(decode) {
        Some(Ok(Marker::End { source })) if *source.topic == *t.source => {
            ended.insert((source.partition, source.offset));
        }
        Some(Ok(Marker::Settle(s))) if s.topic == t.source => {
            for o in s.ends.iter() {
                ended.insert((s.partition, o));
            }
        }
        _ => {}
    });
    let mut dead = Offsets::default();
    scan(cluster, &t.dlq, |m| {
        if let Some(o) = original(m) {
            outcome.dead_lettered += 1;
            dead.insert(o);
        }
    });
    for &at in &first {
        let chain_ended = ended.contains(at)
            && copies
                .get(&at)
                .is_none_or(|cs| cs.iter().all(|&c| ended.contains(c)));
        if !dead.contains(at) && !chain_ended {
            outcome.unsettled += 1;
        }
    }
    outcome
}

/// The first delivery a copy or dead letter names in its `kr-original-*` headers.
fn original(m: &BorrowedMessage<'_>) -> Option<(i32, i64)> {
    let headers = m.headers()?;
    let text = |name: &str| {
        headers
            .iter()
            .find(|h| h.key == name)
            .and_then(|h| h.value)
            .and_then(|v| std::str::from_utf8(v).ok())
            .and_then(|v| v.parse::<i64>().ok())
    };
    Some((
        i32::try_from(text("kr-original-partition")?).ok()?,
        text("kr-original-offset")?,
    ))
}

/// Calls `f` with every record of `topic` up to the end offsets seen when called.
pub fn scan(cluster: &Cluster, topic: &str, mut f: impl FnMut(&BorrowedMessage<'_>)) {
    let c: BaseConsumer = cluster
        .client()
        .set("group.id", crate::common::unique("checker"))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(30))
        .unwrap();
    let mut tpl = TopicPartitionList::new();
    let mut ends = HashMap::new();
    for p in md.topics()[0].partitions() {
        let (_, high) = c
            .fetch_watermarks(topic, p.id(), Duration::from_secs(30))
            .unwrap();
        if high > 0 {
            ends.insert(p.id(), high);
            tpl.add_partition_offset(topic, p.id(), Offset::Beginning)
                .unwrap();
        }
    }
    if ends.is_empty() {
        return;
    }
    c.assign(&tpl).unwrap();
    let deadline = Instant::now() + Duration::from_secs(600);
    while !ends.is_empty() && Instant::now() < deadline {
        if let Some(Ok(m)) = c.poll(Duration::from_millis(200)) {
            if m.offset() + 1 >= ends.get(&m.partition()).copied().unwrap_or(0) {
                ends.remove(&m.partition());
            }
            f(&m);
        }
    }
    assert!(ends.is_empty(), "{topic} could not be read to its end");
}

/// The least value of `points` (seconds, value) in each window of `window` seconds, at the
/// window's start; windows without a point are left out.
fn floors(points: &[(f64, f64)], window: f64) -> Vec<(f64, f64)> {
    let mut lows: BTreeMap<u64, f64> = BTreeMap::new();
    for (at, v) in points {
        let w = (at / window.max(1.0)) as u64;
        let low = lows.entry(w).or_insert(*v);
        *low = low.min(*v);
    }
    lows.into_iter()
        .map(|(w, v)| (w as f64 * window, v))
        .collect()
}

/// Prints the slopes after the warm-up and plots every series.
fn report(size: &SoakSize, samples: &[(f64, Usage, Usage)]) {
    // The slopes cover the load after the warm-up; the drain that follows has no load.
    let (warm, end) = (size.warm_up.as_secs_f64(), size.span.as_secs_f64());
    let after: Vec<&(f64, Usage, Usage)> = samples
        .iter()
        .filter(|s| s.0 >= warm && s.0 <= end)
        .collect();
    let per_hour = |pick: &dyn Fn(&Usage) -> f64, tracker: bool| {
        let points: Vec<(f64, f64)> = after
            .iter()
            .map(|(at, a, b)| (at / 3600.0, pick(if tracker { a } else { b })))
            .collect();
        slope(&points)
    };
    let mib = |u: &Usage| u.rss_kib as f64 / 1024.0;
    let fds = |u: &Usage| u.fds as f64;
    let threads = |u: &Usage| u.threads as f64;
    for (name, tracker) in [("tracker", true), ("worker", false)] {
        let range = |pick: &dyn Fn(&Usage) -> f64| {
            let values = after
                .iter()
                .map(|(_, a, b)| pick(if tracker { a } else { b }));
            let (lo, hi) = values.fold((f64::MAX, f64::MIN), |(l, h), v| (l.min(v), h.max(v)));
            format!("{lo:.1} to {hi:.1}")
        };
        println!(
            "soak: {name}: resident {} MiB, slope {:+.2} MiB/h; fds {}, slope {:+.2}/h; threads {}, slope {:+.2}/h ({} samples of the load after a {:?} warm-up)",
            range(&mib),
            per_hour(&mib, tracker),
            range(&fds),
            per_hour(&fds, tracker),
            range(&threads),
            per_hour(&threads, tracker),
            after.len(),
            size.warm_up
        );
        // Replays after faults make peaks that the trim takes back within half a minute; the
        // level memory comes back to between two faults is what says whether anything stays.
        let points: Vec<(f64, f64)> = after
            .iter()
            .map(|(at, a, b)| (*at, mib(if tracker { a } else { b })))
            .collect();
        let lows = floors(&points, size.fault_every.as_secs_f64());
        if let (Some(first), Some(last)) = (lows.first(), lows.last()) {
            let per_hour: Vec<(f64, f64)> = lows.iter().map(|(t, v)| (t / 3600.0, *v)).collect();
            println!(
                "soak: {name}: least resident between two faults {:.1} MiB in the first window, {:.1} in the last, slope {:+.2} MiB/h ({} windows)",
                first.1,
                last.1,
                slope(&per_hour),
                lows.len()
            );
        }
    }
    if let Err(e) = plot(&size.out.join("soak.png"), samples, warm) {
        println!("soak: no plot: {e}");
    }
}

fn plot(
    path: &Path,
    samples: &[(f64, Usage, Usage)],
    warm: f64,
) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let font = redelivery_testkit::fonts::sans_serif().ok_or("no DejaVuSans.ttf for the labels")?;
    let bytes: &'static [u8] = Box::leak(std::fs::read(font)?.into_boxed_slice());
    plotters::style::register_font("sans-serif", plotters::style::FontStyle::Normal, bytes)
        .map_err(|_| "unusable font")?;
    let root = BitMapBackend::new(path, (1000, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    let minutes = samples.last().map_or(1.0, |s| s.0 / 60.0).max(1.0);
    let max_mib = samples
        .iter()
        .map(|(_, a, b)| a.rss_kib.max(b.rss_kib) as f64 / 1024.0)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&top)
        .caption("resident memory (MiB)", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..minutes, 0.0..max_mib * 1.1)?;
    chart.configure_mesh().x_desc("minutes").draw()?;
    let series = |pick: fn(&(f64, Usage, Usage)) -> f64| -> Vec<(f64, f64)> {
        samples.iter().map(|s| (s.0 / 60.0, pick(s))).collect()
    };
    chart
        .draw_series(LineSeries::new(
            series(|s| s.1.rss_kib as f64 / 1024.0),
            &BLUE,
        ))?
        .label("tracker")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    chart
        .draw_series(LineSeries::new(
            series(|s| s.2.rss_kib as f64 / 1024.0),
            &RED,
        ))?
        .label("worker")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    chart.draw_series(std::iter::once(PathElement::new(
        vec![(warm / 60.0, 0.0), (warm / 60.0, max_mib * 1.1)],
        BLACK.mix(0.3),
    )))?;
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .draw()?;
    let max_count = samples
        .iter()
        .map(|(_, a, b)| a.fds.max(b.fds).max(a.threads).max(b.threads) as f64)
        .fold(1.0, f64::max);
    let mut chart = ChartBuilder::on(&bottom)
        .caption("file descriptors and threads", ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..minutes, 0.0..max_count * 1.1)?;
    chart.configure_mesh().x_desc("minutes").draw()?;
    for (name, pick, color) in [
        (
            "tracker fds",
            (|s: &(f64, Usage, Usage)| s.1.fds as f64) as fn(&_) -> f64,
            BLUE,
        ),
        ("worker fds", |s: &(f64, Usage, Usage)| s.2.fds as f64, RED),
        (
            "tracker threads",
            |s: &(f64, Usage, Usage)| s.1.threads as f64,
            CYAN,
        ),
        (
            "worker threads",
            |s: &(f64, Usage, Usage)| s.2.threads as f64,
            MAGENTA,
        ),
    ] {
        chart
            .draw_series(LineSeries::new(series(pick), &color))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_of_each_window_shows_growth_that_the_peaks_hide() {
        // Peaks after each fault, and a level that does not move: flat floors.
        let flat: Vec<(f64, f64)> = (0..60)
            .map(|i| (i as f64 * 10.0, if i % 5 == 1 { 70.0 } else { 20.0 }))
            .collect();
        let lows = floors(&flat, 50.0);
        assert_eq!(lows.len(), 12);
        assert!(lows.iter().all(|(_, v)| *v == 20.0));
        assert_eq!(lows[1].0, 50.0, "at the window's start");
        // A level that rises by 2 each window: the floors' slope says so.
        let rising: Vec<(f64, f64)> = (0..60)
            .map(|i| (i as f64 * 10.0, 20.0 + 2.0 * (i / 5) as f64))
            .collect();
        let lows = floors(&rising, 50.0);
        assert!((slope(&lows) - 2.0 / 50.0).abs() < 1e-9);
    }
}
