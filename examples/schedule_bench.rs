//! Benchmarks of delayed delivery on a real broker: scheduling precision, and restart-to-ready
//! with many schedules pending, without and with a snapshot. Results are one JSON line each;
//! BENCHMARKS.md explains the method and keeps the numbers.
//!
//! ```text
//! scripts/kafka start
//! cargo run --release --example schedule_bench -- precision --messages 10000 --span 60s
//! cargo run --release --example schedule_bench -- restart --pending 1000000
//! ```
//!
//! Every run creates its own topics (unique names), so runs never see each other's records.

use std::collections::HashSet;
use std::time::{Duration, Instant, UNIX_EPOCH};

use clap::{Parser, Subcommand};
use kafka_redelivery::client::{ScheduledRecord, Scheduler, SchedulerConfig};
use kafka_redelivery::marker::{encode, Marker};
use kafka_redelivery::tracker::{Tracker, TrackerConfig};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

use redelivery_testkit::clock::now_ms;
use redelivery_testkit::kafka::{client, create_topic};
use redelivery_testkit::metrics::{metric_sum, metric_value as metric};
use redelivery_testkit::names::unique;

type Error = Box<dyn std::error::Error + Send + Sync>;

#[derive(Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "REDELIVERY_BROKERS", default_value = "127.0.0.1:39092")]
    brokers: String,
    #[command(subcommand)]
    what: What,
}

#[derive(Subcommand)]
enum What {
    /// Records due at random times over a span: how late does each reach its target?
    Precision {
        /// Records to schedule.
        #[arg(long, default_value_t = 10_000)]
        messages: usize,
        /// Due times are spread uniformly over this span, starting 5 s after sending begins.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        span: Duration,
        /// Markers partitions (and target partitions).
        #[arg(long, default_value_t = 4)]
        partitions: i32,
    },
    /// Restart-to-ready with this many schedules pending: replaying them all, then from a
    /// snapshot.
    Restart {
        /// Pending schedules.
        #[arg(long, default_value_t = 1_000_000)]
        pending: usize,
        /// Markers partitions.
        #[arg(long, default_value_t = 4)]
        partitions: i32,
    },
}

#[tokio::main]
async fn main() -> Result<(), Error> {
    let args = Args::parse();
    match args.what {
        What::Precision {
            messages,
            span,
            partitions,
        } => precision(&args.brokers, messages, span, partitions).await,
        What::Restart {
            pending,
            partitions,
        } => restart(&args.brokers, pending, partitions).await,
    }
}

/// A new topic named `{prefix}-{random}` whose timestamps are the broker's append times.
async fn append_time_topic(brokers: &str, prefix: &str, partitions: i32) -> Result<String, Error> {
    let name = unique(prefix);
    create_topic(
        &client(brokers),
        &name,
        partitions,
        &[("message.timestamp.type", "LogAppendTime")],
    )
    .await?;
    Ok(name)
}

fn tracker_config(brokers: &str, markers: &str) -> TrackerConfig {
    TrackerConfig {
        group_id: unique("bench-tracker"),
        commit_interval: Duration::from_millis(500),
        snapshots_topic: None,
        ..TrackerConfig::new(brokers, markers)
    }
}

/// Starts a tracker in this process; returns its stop handle, task and when it became ready.
async fn start_tracker(
    config: TrackerConfig,
) -> Result<
    (
        tokio::sync::oneshot::Sender<()>,
        tokio::task::JoinHandle<()>,
        Duration,
        kafka_redelivery::tracker::Metrics,
    ),
    Error,
> {
    let tracker = Tracker::new(config);
    let ready = tracker.readiness();
    let metrics = tracker.metrics();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let started = Instant::now();
    let task = tokio::spawn(async move {
        if let Err(e) = tracker
            .run(async {
                let _ = stopped.await;
            })
            .await
        {
            eprintln!("tracker failed: {e}");
        }
    });
    while !ready.is_ready() {
        if started.elapsed() > Duration::from_secs(600) {
            return Err("tracker not ready after 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok((stop, task, started.elapsed(), metrics))
}

fn percentile(sorted: &[i64], p: f64) -> i64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

async fn precision(brokers: &str, n: usize, span: Duration, partitions: i32) -> Result<(), Error> {
    let markers = append_time_topic(brokers, "bench.markers", partitions).await?;
    // The target's timestamps are its append times: lateness is measured where it lands.
    let target = append_time_topic(brokers, "bench.target", partitions).await?;
    let (stop, task, _, metrics) = start_tracker(tracker_config(brokers, &markers)).await?;
    let scheduler = Scheduler::new(SchedulerConfig::new(brokers, &markers)).await?;

    let first_due = now_ms() + 5_000;
    let span_ms = span.as_millis() as i64;
    let sending = Instant::now();
    for batch in (0..n).collect::<Vec<_>>().chunks(1_000) {
        let sends = batch.iter().map(|&i| {
            let due = first_due + rand::random::<i64>().rem_euclid(span_ms.max(1));
            let record = ScheduledRecord::to(&target)
                .key(format!("s-{i}"))
                .payload(due.to_string());
            let at = UNIX_EPOCH + Duration::from_millis(due as u64);
            let s = scheduler.clone();
            async move { s.send_at(record, at).await }
        });
        for r in futures::future::join_all(sends).await {
            r?;
        }
    }
    let sent_in = sending.elapsed();
    if now_ms() > first_due {
        eprintln!("warning: sending took {sent_in:?}, past the first due time");
    }

    let reader: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", unique("bench-reader"))
        .set("enable.auto.commit", "false")
        .create()?;
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(&target, p, Offset::Beginning)?;
    }
    reader.assign(&tpl)?;
    let mut lateness = Vec::with_capacity(n);
    let mut seen = HashSet::with_capacity(n);
    let deadline = Instant::now() + span + Duration::from_secs(120);
    while seen.len() < n && Instant::now() < deadline {
        let Some(m) = reader.poll(Duration::from_millis(200)) else {
            continue;
        };
        let m = m?;
        let due: i64 = std::str::from_utf8(m.payload().unwrap_or_default())?.parse()?;
        let appended = m.timestamp().to_millis().ok_or("no timestamp")?;
        if seen.insert(m.key().unwrap_or_default().to_vec()) {
            lateness.push(appended - due);
        }
    }
    let text = metrics.render();
    let lag_mean_ms = 1000.0 * metric(&text, "redelivery_deadline_lag_seconds_sum")
        / metric(&text, "redelivery_deadline_lag_seconds_count").max(1.0);
    let _ = stop.send(());
    task.await?;
    lateness.sort_unstable();
    println!(
        "{}",
        serde_json::json!({
            "bench": "schedule_precision",
            "messages": n,
            "arrived": seen.len(),
            "span_s": span.as_secs(),
            "partitions": partitions,
            "sent_in_ms": sent_in.as_millis() as u64,
            "lateness_ms": {
                "min": lateness.first().copied().unwrap_or(0),
                "p50": percentile(&lateness, 0.50),
                "p90": percentile(&lateness, 0.90),
                "p95": percentile(&lateness, 0.95),
                "p99": percentile(&lateness, 0.99),
                "max": lateness.last().copied().unwrap_or(0),
            },
            "early": lateness.iter().filter(|&&l| l < 0).count(),
            "tracker_deadline_to_durable_mean_ms": lag_mean_ms,
        })
    );
    Ok(())
}

async fn restart(brokers: &str, pending: usize, partitions: i32) -> Result<(), Error> {
    let markers = append_time_topic(brokers, "bench.markers", partitions).await?;
    let snapshots = format!("{markers}.snapshots");
    create_topic(
        &client(brokers),
        &snapshots,
        partitions,
        &[
            ("cleanup.policy", "compact"),
            ("max.message.bytes", "2097152"),
        ],
    )
    .await?;

    // Schedules for an hour from now, written straight to the markers topic.
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "20")
        .set("batch.num.messages", "10000")
        .create()?;
    let writing = Instant::now();
    let due = now_ms() + 3_600_000;
    for batch in (0..pending).collect::<Vec<_>>().chunks(20_000) {
        let sends: Vec<_> = batch
            .iter()
            .map(|&i| {
                let bytes = encode(&Marker::Schedule {
                    not_before_ms: due,
                    delay_ms: 0,
                    record: Box::new(ScheduledRecord::to("nowhere").key(format!("k-{i}"))),
                });
                producer
                    .send_result(
                        FutureRecord::<(), _>::to(&markers)
                            .partition((i % partitions as usize) as i32)
                            .payload(&bytes),
                    )
                    .map_err(|(e, _)| e)
            })
            .collect::<Result<_, _>>()?;
        for r in futures::future::join_all(sends).await {
            r?.map_err(|(e, _)| e)?;
        }
    }
    let written_in = writing.elapsed();

    // Without snapshots: the whole log is replayed.
    let memory_before = resident_bytes();
    let config = tracker_config(brokers, &markers);
    let (stop, task, replay_ready, metrics) = start_tracker(config).await?;
    let memory_after = resident_bytes();
    let replayed = metric(
        &metrics.render(),
        "redelivery_markers_total{type=\"schedule\"}",
    );
    let _ = stop.send(());
    task.await?;

    // With snapshots: a first tracker replays and writes a snapshot; the next one restores it.
    let group = unique("bench-snap");
    let snap_config = TrackerConfig {
        group_id: group.clone(),
        snapshots_topic: Some(snapshots.clone()),
        snapshot_after_markers: 1_000,
        snapshot_min_interval: Duration::ZERO,
        ..tracker_config(brokers, &markers)
    };
    let (stop, task, _, metrics) = start_tracker(snap_config.clone()).await?;
    let wrote = Instant::now();
    while metric(&metrics.render(), "redelivery_snapshots_total") < partitions as f64 {
        if wrote.elapsed() > Duration::from_secs(600) {
            return Err("no snapshot written in 10 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let snapshot_in = wrote.elapsed();
    // Two more commit intervals, so the commit names the snapshot.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let _ = stop.send(());
    task.await?;
    let (stop, task, restore_ready, metrics) = start_tracker(snap_config).await?;
    let replayed_after = metric(
        &metrics.render(),
        "redelivery_markers_total{type=\"schedule\"}",
    );
    let pending_after: f64 = metric_sum(&metrics.render(), "redelivery_schedules_pending");
    let _ = stop.send(());
    task.await?;

    println!(
        "{}",
        serde_json::json!({
            "bench": "restart_with_pending_schedules",
            "pending": pending,
            "partitions": partitions,
            "written_in_ms": written_in.as_millis() as u64,
            "without_snapshot": {
                "ready_ms": replay_ready.as_millis() as u64,
                "schedule_markers_replayed": replayed,
                "resident_growth_bytes_per_pending": (memory_after.saturating_sub(memory_before)) as f64 / pending as f64,
            },
            "snapshot_written_in_ms": snapshot_in.as_millis() as u64,
            "with_snapshot": {
                "ready_ms": restore_ready.as_millis() as u64,
                "schedule_markers_replayed": replayed_after,
                "pending_restored": pending_after,
            },
        })
    );
    Ok(())
}

/// Resident set size of this process.
fn resident_bytes() -> usize {
    usize::try_from(redelivery_testkit::process::resident_bytes(
        std::process::id(),
    ))
    .unwrap_or(usize::MAX)
}
