//! Benchmarks of the tracker's in-memory state (no Kafka): Start+End pairs per second, expiry at
//! one million in flight, and bytes of memory per in-flight delivery.
//!
//! Run: `cargo bench --features fuzzing --bench tracker_state`. The memory figure is printed first; it is the growth
//! of the process's resident set while one million deliveries are tracked, divided by one
//! million, so it includes the allocator's overhead and the hash map's spare capacity.

use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput};
use kafka_redelivery::marker::{Marker, Offsets, ScheduledRecord, Settle, SourceRef, StartBatch};
use kafka_redelivery::tracker::state::PartitionState;

const TOPICS: [&str; 4] = ["orders", "payments", "shipments", "invoices"];

fn source(i: i64) -> SourceRef {
    SourceRef::new(TOPICS[(i % 4) as usize], (i % 16) as i32, i)
}

/// Start and End markers for `n` deliveries, interleaved as a busy consumer writes them: each
/// End follows its Start 100 markers later.
fn start_end_markers(n: i64) -> Vec<Marker> {
    let mut out = Vec::with_capacity(2 * n as usize);
    for i in 0..n {
        out.push(Marker::Start {
            source: source(i),
            timeout_ms: 30_000,
            attempt: 1,
        });
        if i >= 100 {
            out.push(Marker::End {
                source: source(i - 100),
            });
        }
    }
    for i in (n - 100).max(0)..n {
        out.push(Marker::End { source: source(i) });
    }
    out
}

/// Version 2 markers for `n` records in batch Starts of `batch` consecutive offsets, spread
/// over 16 source partitions; with `settled`, each batch is acked by one Settle ten batches
/// later, as a busy consumer writes them.
fn batched_markers(n: i64, batch: i64, settled: bool) -> Vec<Marker> {
    let topic = |b: i64| TOPICS[(b % 4) as usize];
    let partition = |b: i64| (b % 16) as i32;
    // Batch b of a partition covers offsets (b / 16) * batch ..
    let offsets = |b: i64| {
        let mut o = Offsets::new();
        for i in 0..batch {
            o.push((b / 16) * batch + i);
        }
        o
    };
    let batches = n / batch;
    let mut out = Vec::new();
    let settle = |b: i64| {
        let mut s = Settle::new(topic(b), partition(b));
        s.ends = offsets(b);
        Marker::Settle(Box::new(s))
    };
    for b in 0..batches {
        out.push(Marker::StartBatch(Box::new(StartBatch {
            topic: topic(b).into(),
            partition: partition(b),
            timeout_ms: 30_000,
            offsets: offsets(b),
            attempts: vec![],
            timeouts: vec![],
        })));
        if settled && b >= 10 {
            out.push(settle(b - 10));
        }
    }
    if settled {
        out.extend(((batches - 10).max(0)..batches).map(settle));
    }
    out
}

fn batched(c: &mut Criterion) {
    let n = 100_000;
    apply_all(
        c,
        "batched_records_started_and_settled",
        n,
        &batched_markers(n, 500, true),
    );
}

/// Times applying `markers` to a fresh state, `n` elements (records or pairs) per iteration.
fn apply_all(c: &mut Criterion, group: &str, n: i64, markers: &[Marker]) {
    let mut g = c.benchmark_group(group);
    g.throughput(Throughput::Elements(n as u64));
    g.bench_function(BenchmarkId::from_parameter(n), |b| {
        b.iter(|| {
            let mut s = PartitionState::new();
            for (offset, m) in markers.iter().enumerate() {
                black_box(s.on_marker(offset as i64, 0, m));
            }
            s
        })
    });
    g.finish();
}

fn memory_per_batched_delivery() {
    let n = 1_000_000;
    let markers = batched_markers(n, 500, false);
    let before = rss_bytes();
    let mut s = PartitionState::new();
    for (offset, m) in markers.iter().enumerate() {
        s.on_marker(offset as i64, offset as i64, m);
    }
    let after = rss_bytes();
    if let (Some(b), Some(a)) = (before, after) {
        println!(
            "memory: {} deliveries in flight in batch Starts of 500, resident set grew by {:.2} MiB = {:.2} bytes per in-flight delivery",
            s.in_flight(),
            (a.saturating_sub(b)) as f64 / (1024.0 * 1024.0),
            (a.saturating_sub(b)) as f64 / n as f64
        );
    }
    // Then each record is kept alive on its own schedule: every one leaves its group for a
    // slot of its own, and the figure must be no worse than version 1's.
    let mut offset = markers.len() as i64;
    for m in &markers {
        let Marker::StartBatch(b) = m else { continue };
        let mut keep = Settle::new(b.topic.clone(), b.partition);
        keep.keep_alives = b.offsets.iter().map(|o| (o, 60_000)).collect();
        s.on_marker(offset, offset, &Marker::Settle(Box::new(keep)));
        offset += 1;
    }
    let after = rss_bytes();
    if let (Some(b), Some(a)) = (before, after) {
        println!(
            "memory: the same {} deliveries, each kept alive on its own: {:.1} bytes per in-flight delivery",
            s.in_flight(),
            (a.saturating_sub(b)) as f64 / n as f64
        );
    }
    drop(black_box(s));
}

/// A state holding `n` deliveries whose deadlines are spread over one minute.
fn filled(n: i64) -> PartitionState {
    let mut s = PartitionState::new();
    for i in 0..n {
        let m = Marker::Start {
            source: source(i),
            timeout_ms: 30_000,
            attempt: 1,
        };
        s.on_marker(i, (i * 60_000) / n.max(1), &m);
    }
    s
}

fn start_end(c: &mut Criterion) {
    let n = 100_000;
    apply_all(c, "start_end_pairs", n, &start_end_markers(n));
}

fn expiry(c: &mut Criterion) {
    let n = 1_000_000;
    let batch = 1_000;
    let mut g = c.benchmark_group("expiry_at_1m_in_flight");
    g.throughput(Throughput::Elements(batch as u64));
    g.sample_size(20);
    g.bench_function("expire_1000", |b| {
        b.iter_batched_ref(
            || filled(n),
            |s| black_box(s.expired(i64::MAX, batch)),
            criterion::BatchSize::PerIteration,
        )
    });
    g.finish();
}

fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

fn memory_per_delivery() {
    let n = 1_000_000;
    let before = rss_bytes();
    let s = filled(n);
    let after = rss_bytes();
    match (before, after) {
        (Some(b), Some(a)) => println!(
            "memory: {} deliveries in flight, resident set grew by {:.1} MiB = {:.1} bytes per in-flight delivery",
            s.in_flight(),
            (a.saturating_sub(b)) as f64 / (1024.0 * 1024.0),
            (a.saturating_sub(b)) as f64 / n as f64
        ),
        _ => println!("memory: /proc/self/statm is not readable here"),
    }
    drop(black_box(s));
}

/// A state holding `n` pending schedules due over one week, as Schedule markers make them.
fn scheduled(n: i64) -> PartitionState {
    let mut s = PartitionState::at("orders.markers", 0);
    let week = 7 * 24 * 3600 * 1000;
    for i in 0..n {
        let m = Marker::Schedule {
            not_before_ms: 0,
            delay_ms: ((i * week) / n.max(1)) as u64,
            record: Box::new(ScheduledRecord::to("orders").key(format!("k-{i}"))),
        };
        s.on_marker(i, 0, &m);
    }
    s
}

fn memory_per_schedule() {
    let n = 1_000_000;
    let before = rss_bytes();
    let mut s = scheduled(n);
    let after = rss_bytes();
    if let (Some(b), Some(a)) = (before, after) {
        println!(
            "memory: {} schedules pending, resident set grew by {:.1} MiB = {:.1} bytes per pending schedule",
            s.summary(n, 0).scheduled,
            (a.saturating_sub(b)) as f64 / (1024.0 * 1024.0),
            (a.saturating_sub(b)) as f64 / n as f64
        );
    }
    drop(black_box(s));
}

/// One schedule due in 30 days, then 30 days of steady traffic (a Start and its End every
/// second of partition time) behind it: memory must follow what is in flight (two items at
/// most), not how long the oldest has waited.
fn memory_with_an_old_schedule() {
    let month_s: i64 = 30 * 24 * 3600;
    let before = rss_bytes();
    let mut s = PartitionState::at("orders.markers", 0);
    let m = Marker::Schedule {
        not_before_ms: month_s * 1_000,
        delay_ms: 0,
        record: Box::new(ScheduledRecord::to("orders").key("later")),
    };
    s.on_marker(0, 0, &m);
    for i in 0..month_s {
        let src = source(i);
        let start = Marker::Start {
            source: src.clone(),
            timeout_ms: 30_000,
            attempt: 1,
        };
        s.on_marker(1 + 2 * i, i * 1_000, &start);
        s.on_marker(2 + 2 * i, i * 1_000 + 10, &Marker::End { source: src });
        if i % 60 == 0 {
            // The tracker summarises once per commit interval; that is where samples are pruned.
            black_box(s.summary(3 + 2 * i, i * 1_000));
        }
    }
    let after = rss_bytes();
    if let (Some(b), Some(a)) = (before, after) {
        println!(
            "memory: one schedule pending for 30 days under {month_s} Start/End pairs: {} in flight, resident set grew by {:.2} MiB",
            s.in_flight(),
            (a.saturating_sub(b)) as f64 / (1024.0 * 1024.0),
        );
    }
    drop(black_box(s));
}

fn main() {
    // Each memory figure needs a fresh process: memory freed by the first would be reused by
    // the second without growing the resident set.
    if std::env::var_os("KR_BENCH_SCHEDULES").is_some() {
        memory_per_schedule();
        return;
    }
    if std::env::var_os("KR_BENCH_AGED").is_some() {
        memory_with_an_old_schedule();
        return;
    }
    if std::env::var_os("KR_BENCH_BATCHED").is_some() {
        memory_per_batched_delivery();
        return;
    }
    if let Ok(me) = std::env::current_exe() {
        for case in ["KR_BENCH_SCHEDULES", "KR_BENCH_AGED", "KR_BENCH_BATCHED"] {
            let _ = std::process::Command::new(&me).env(case, "1").status();
        }
    }
    memory_per_delivery();
    let mut c = Criterion::default()
        .measurement_time(Duration::from_secs(5))
        .configure_from_args();
    start_end(&mut c);
    batched(&mut c);
    expiry(&mut c);
    c.final_summary();
}
