//! `redelivery-tracker demo`: the whole system on librdkafka's in-process mock cluster.
//!
//! A producer writes N records; a worker (the client library) fails a share of them on purpose,
//! by rejecting, nacking or abandoning them; a tracker redelivers and dead-letters. The demo
//! reads the dead-letter topic back and checks that every record ended acked or dead-lettered.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::kafka::producer::QuietProducer;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::FutureRecord;
use rdkafka::ClientConfig;

use crate::client::{ConsumerConfig, Delivery, RedeliveryConsumer};
use crate::marker::markers_partition;
use crate::tracker::{Tracker, TrackerConfig};

use super::args::DemoArgs;

const SOURCE: &str = "demo.orders";
const MARKERS: &str = "demo.markers";
const DLQ: &str = "demo.orders.dlq";
const MAX_DELIVERIES: u32 = 3;

/// What the demo worker does with one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Ack it.
    Ack,
    /// Nack it for a short delay.
    Nack,
    /// Reject it to the dead-letter topic.
    Reject,
    /// Abandon it, so it times out.
    Abandon,
}

/// The worker's plan for `key` at `attempt`. A share `fail_rate` of keys misbehave, split in
/// four ways: rejected at once; abandoned until they run out of deliveries; nacked once;
/// abandoned once. Deterministic, so a run can be reasoned about.
pub fn plan(key: &str, attempt: u32, fail_rate: f64) -> Plan {
    let h = markers_partition(key, 0, 1_000_003) as u64;
    if (h % 10_000) as f64 >= fail_rate * 10_000.0 {
        return Plan::Ack;
    }
    match (h / 10_000 % 4, attempt) {
        (0, _) => Plan::Reject,
        (1, _) => Plan::Abandon,
        (2, 1) => Plan::Nack,
        (3, 1) => Plan::Abandon,
        _ => Plan::Ack,
    }
}

#[derive(Default)]
struct Tally {
    acked: HashSet<String>,
    dead_lettered: HashSet<String>,
    redelivered: u64,
    deliveries: u64,
}

/// Runs the demo and prints a summary; exits 0 only if nothing was lost.
pub async fn run(args: DemoArgs) -> ExitCode {
    // The demo prints its own progress; logs only say when something is wrong.
    super::logging::init_with_default(super::args::LogFormat::Pretty, "warn");
    match demo(&args).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: demo failed: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn demo(args: &DemoArgs) -> Result<bool, Box<dyn std::error::Error>> {
    let mock = MockCluster::new(1)?;
    mock.create_topic(SOURCE, 4, 1)?;
    mock.create_topic(MARKERS, 4, 1)?;
    mock.create_topic(DLQ, 1, 1)?;
    let brokers = mock.bootstrap_servers();
    eprintln!(
        "demo: mock cluster at {brokers}; {} records, fail rate {}",
        args.messages, args.fail_rate
    );

    let tracker = Tracker::new(TrackerConfig {
        max_deliveries: MAX_DELIVERIES,
        commit_interval: Duration::from_millis(500),
        ..TrackerConfig::new(&brokers, MARKERS)
    });
    let (stop_tracker, stopped) = tokio::sync::oneshot::channel::<()>();
    let tracker_task = tokio::spawn(tracker.run(async {
        let _ = stopped.await;
    }));

    let consumer = RedeliveryConsumer::new(
        ConsumerConfig::new(&brokers, "demo-worker", [SOURCE], MARKERS)
            .timeout(Duration::from_secs(1))
            .max_unsettled(200),
    )
    .await?;
    produce(&brokers, args.messages).await?;

    let tally = Arc::new(Mutex::new(Tally::default()));
    let worker = tokio::spawn(work(consumer, tally.clone(), args.fail_rate));
    let dlq = dlq_reader(&brokers)?;
    let started = Instant::now();
    let mut last_print = Instant::now();
    loop {
        read_dlq(&dlq, &tally);
        let (done, line) = progress(&tally, args.messages);
        if last_print.elapsed() >= Duration::from_millis(500) || done {
            eprintln!("demo: {line} ({:.1}s)", started.elapsed().as_secs_f64());
            last_print = Instant::now();
        }
        if done || started.elapsed() > args.deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.abort();
    let _ = stop_tracker.send(());
    let _ = tracker_task.await;
    Ok(summary(&tally, args))
}

async fn produce(brokers: &str, n: usize) -> Result<(), rdkafka::error::KafkaError> {
    let producer: QuietProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()?;
    let sends = (0..n).map(|i| {
        let key = format!("order-{i}");
        let payload = format!("{{\"order\":{i}}}");
        let producer = &producer;
        async move {
            producer
                .send(
                    FutureRecord::to(SOURCE).key(&key).payload(&payload),
                    Duration::from_secs(10),
                )
                .await
        }
    });
    for r in futures::future::join_all(sends).await {
        r?;
    }
    Ok(())
}

async fn work(mut consumer: RedeliveryConsumer, tally: Arc<Mutex<Tally>>, fail_rate: f64) {
    while let Some(d) = consumer.recv().await {
        let key = String::from_utf8_lossy(d.key().unwrap_or_default()).into_owned();
        {
            let mut t = tally.lock().unwrap_or_else(|e| e.into_inner());
            t.deliveries += 1;
            t.redelivered += u64::from(d.attempt() > 1);
        }
        let tally = tally.clone();
        tokio::spawn(async move { settle(d, key, fail_rate, tally).await });
    }
}

async fn settle(d: Delivery, key: String, fail_rate: f64, tally: Arc<Mutex<Tally>>) {
    let result = match plan(&key, d.attempt(), fail_rate) {
        Plan::Ack => {
            let r = d.ack().await;
            if r.is_ok() {
                tally
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .acked
                    .insert(key);
            }
            r
        }
        Plan::Nack => d.nack_after(Duration::from_millis(100)).await,
        Plan::Reject => d.reject("demo: refused on purpose").await,
        Plan::Abandon => {
            d.abandon();
            Ok(())
        }
    };
    if let Err(e) = result {
        tracing::warn!(error = %e, "demo worker could not settle a delivery");
    }
}

fn dlq_reader(brokers: &str) -> Result<BaseConsumer, rdkafka::error::KafkaError> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("group.id", "demo-dlq-reader")
        .set("auto.offset.reset", "earliest")
        .create()?;
    c.subscribe(&[DLQ])?;
    Ok(c)
}

fn read_dlq(dlq: &BaseConsumer, tally: &Mutex<Tally>) {
    while let Some(Ok(m)) = dlq.poll(Duration::ZERO) {
        if let Some(k) = m.key() {
            let key = String::from_utf8_lossy(k).into_owned();
            tally
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .dead_lettered
                .insert(key);
        }
    }
}

fn progress(tally: &Mutex<Tally>, produced: usize) -> (bool, String) {
    let t = tally.lock().unwrap_or_else(|e| e.into_inner());
    let settled = t.acked.union(&t.dead_lettered).count();
    let line = format!(
        "produced {produced}, deliveries {}, acked {}, redelivered {}, dead-lettered {}, unsettled {}",
        t.deliveries,
        t.acked.len(),
        t.redelivered,
        t.dead_lettered.len(),
        produced.saturating_sub(settled)
    );
    (settled >= produced, line)
}

fn summary(tally: &Mutex<Tally>, args: &DemoArgs) -> bool {
    let t = tally.lock().unwrap_or_else(|e| e.into_inner());
    let settled = t.acked.union(&t.dead_lettered).count();
    let lost = args.messages.saturating_sub(settled);
    eprintln!(
        "demo: done. {} produced, {} acked, {} redelivered, {} dead-lettered, {} lost",
        args.messages,
        t.acked.len(),
        t.redelivered,
        t.dead_lettered.len(),
        lost
    );
    if args.json {
        println!(
            "{}",
            serde_json::json!({
                "produced": args.messages,
                "acked": t.acked.len(),
                "redelivered": t.redelivered,
                "dead_lettered": t.dead_lettered.len(),
                "deliveries": t.deliveries,
                "lost": lost,
            })
        );
    }
    lost == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_rate_zero_acks_everything() {
        assert!((0..1000).all(|i| plan(&format!("k{i}"), 1, 0.0) == Plan::Ack));
    }

    fn plans(attempt: u32) -> HashSet<String> {
        (0..1000)
            .map(|i| format!("{:?}", plan(&format!("k{i}"), attempt, 1.0)))
            .collect()
    }

    #[test]
    fn fail_rate_one_fails_every_first_delivery_and_some_for_good() {
        let first: HashSet<String> = ["Reject", "Abandon", "Nack"].map(String::from).into();
        assert_eq!(plans(1), first);
        let second: HashSet<String> = ["Reject", "Abandon", "Ack"].map(String::from).into();
        assert_eq!(
            plans(2),
            second,
            "nacked and once-abandoned keys succeed the second time"
        );
    }

    #[test]
    fn failing_share_is_close_to_the_rate() {
        let failing = (0..10_000)
            .filter(|i| plan(&format!("k{i}"), 1, 0.3) != Plan::Ack)
            .count();
        assert!((2_500..3_500).contains(&failing), "{failing}");
    }
}
