//! A worker built on the client library, with switches to misbehave on purpose.
//!
//! ```text
//! cargo run --example worker -- --brokers 127.0.0.1:39092 --topic orders \
//!     --markers-topic orders.markers --unsettled-rate 0.1 --nack-rate 0.05 --reject-rate 0.01
//! ```
//!
//! It writes one JSON line per settled delivery to stdout:
//! `{"topic":..,"partition":..,"offset":..,"attempt":..,"key":..,"outcome":"ack"}` where outcome
//! is `ack`, `nack`, `reject` or `unsettled` (abandoned, left to time out). With
//! `--log-received` it also writes a line with outcome `received` when a delivery arrives and
//! one with outcome `acking` just before an ack. Every line carries `at_ms`, the wall clock: for
//! `ack`, `nack` and `reject`, when the settlement was durable, so that a checker can tell a
//! delivery still held when its worker was stopped (its End written after) from one settled
//! before.
//! `--crash-after N` aborts the process after N deliveries, with deliveries in hand.

use std::io::Write;
use std::time::Duration;

use clap::Parser;
use kafka_redelivery::client::{
    ConsumerConfig, Delivery, MarkerFormat, RedeliveryConsumer, RetryPolicy,
};
use rand::Rng;

#[derive(Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "REDELIVERY_BROKERS", default_value = "localhost:9092")]
    brokers: String,
    /// Source topic (repeatable).
    #[arg(long, required = true)]
    topic: Vec<String>,
    /// Markers topic.
    #[arg(long)]
    markers_topic: String,
    /// Consumer group.
    #[arg(long, default_value = "example-worker")]
    group: String,
    /// Delivery timeout.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Bound on unsettled deliveries.
    #[arg(long, default_value_t = 100)]
    max_unsettled: usize,
    /// Simulated processing time per delivery.
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    process_time: Duration,
    /// Share of deliveries left unsettled (abandoned; redelivered after the timeout).
    #[arg(long, default_value_t = 0.0)]
    unsettled_rate: f64,
    /// Share of deliveries nacked.
    #[arg(long, default_value_t = 0.0)]
    nack_rate: f64,
    /// Delay of those nacks (with `--nack-backoff exponential`, the delay after the first
    /// delivery).
    #[arg(long, default_value = "0s", value_parser = humantime::parse_duration)]
    nack_delay: Duration,
    /// How the nack delay grows from one delivery of a record to the next: `fixed` (always
    /// `--nack-delay`) or `exponential` (the client's retry policy: doubling from
    /// `--nack-delay` up to `--nack-max-delay`, with 20 % jitter).
    #[arg(long, default_value = "fixed", value_parser = ["fixed", "exponential"])]
    nack_backoff: String,
    /// The cap of the exponential back-off.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    nack_max_delay: Duration,
    /// Share of deliveries rejected to the dead-letter topic.
    #[arg(long, default_value_t = 0.0)]
    reject_rate: f64,
    /// Abort the process (no clean-up) after this many deliveries.
    #[arg(long)]
    crash_after: Option<u64>,
    /// Also print a line when a delivery arrives.
    #[arg(long)]
    log_received: bool,
    /// Marker format to write: v2 (batched, the default) or v1 (for a tracker older than 0.3).
    #[arg(long, default_value = "v2", value_parser = marker_format)]
    marker_format: MarkerFormat,
    /// librdkafka setting passed through as is (repeatable), e.g. for SASL_SSL.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = key_value)]
    rdkafka: Vec<(String, String)>,
}

fn marker_format(s: &str) -> Result<MarkerFormat, String> {
    match s {
        "v1" => Ok(MarkerFormat::V1),
        "v2" => Ok(MarkerFormat::V2),
        other => Err(format!("`{other}` is not a marker format (v1 or v2)")),
    }
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("`{s}` is not KEY=VALUE"))
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    // Logs on stderr (RUST_LOG, default info), so a test can see why a worker stalls.
    kafka_redelivery::cli::logging::init(kafka_redelivery::cli::args::LogFormat::Pretty);
    let mut config = ConsumerConfig::new(
        &args.brokers,
        &args.group,
        args.topic.clone(),
        &args.markers_topic,
    )
    .timeout(args.timeout)
    .max_unsettled(args.max_unsettled)
    .marker_format(args.marker_format);
    if args.nack_backoff == "exponential" {
        config = config.retry(RetryPolicy::exponential(
            args.nack_delay,
            args.nack_max_delay,
        ));
    }
    for (k, v) in &args.rdkafka {
        config = config.set(k, v);
    }
    let mut consumer = RedeliveryConsumer::new(config).await?;
    let args = std::sync::Arc::new(args);
    let mut received = 0u64;
    while let Some(d) = consumer.recv().await {
        received += 1;
        if args.log_received {
            emit(&d, "received");
        }
        if args.crash_after.is_some_and(|n| received >= n) {
            eprintln!("worker: crashing on purpose after {received} deliveries");
            std::process::abort();
        }
        let args = args.clone();
        tokio::spawn(async move { settle(d, &args).await });
    }
    // The consumer stops on its own only if its poll thread died: exit with the reason rather
    // than 0, so a supervisor restarts the worker and the logs say what happened.
    if let Err(e) = consumer.close().await {
        eprintln!("worker: {e}");
        std::process::exit(1);
    }
    Ok(())
}

async fn settle(d: Delivery, args: &Args) {
    tokio::time::sleep(args.process_time).await;
    let roll: f64 = rand::thread_rng().gen();
    let (outcome, result) = if roll < args.unsettled_rate {
        emit(&d, "unsettled");
        d.abandon();
        return;
    } else if roll < args.unsettled_rate + args.nack_rate {
        (
            "nack",
            settle_with(d, |d| async move {
                if args.nack_backoff == "exponential" {
                    d.nack().await
                } else {
                    d.nack_after(args.nack_delay).await
                }
            })
            .await,
        )
    } else if roll < args.unsettled_rate + args.nack_rate + args.reject_rate {
        (
            "reject",
            settle_with(d, |d| async move {
                d.reject("worker: rejected on purpose").await
            })
            .await,
        )
    } else {
        if args.log_received {
            // Printed before the ack, so a checker can tell an ack whose line was lost with a
            // killed process (its End is in the markers topic) from one never made.
            emit(&d, "acking");
        }
        (
            "ack",
            settle_with(d, |d| async move { d.ack().await }).await,
        )
    };
    match result {
        Ok(line) => {
            print_line(&line.replace("\"outcome\":\"\"", &format!("\"outcome\":\"{outcome}\"")))
        }
        Err(e) => eprintln!("worker: settling failed: {e}"),
    }
}

/// Settles `d` with `f` and returns its JSON line (outcome filled in by the caller), stamped
/// when the settlement was durable.
async fn settle_with<F, Fut>(
    d: Delivery,
    f: F,
) -> Result<String, kafka_redelivery::client::ClientError>
where
    F: FnOnce(Delivery) -> Fut,
    Fut: std::future::Future<Output = Result<(), kafka_redelivery::client::ClientError>>,
{
    let mut line = fields(&d, "");
    f(d).await.map(|()| {
        line["at_ms"] = now_ms().into();
        line.to_string()
    })
}

fn json(d: &Delivery, outcome: &str) -> String {
    fields(d, outcome).to_string()
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |t| t.as_millis() as u64)
}

fn fields(d: &Delivery, outcome: &str) -> serde_json::Value {
    serde_json::json!({
        "topic": d.topic(),
        "partition": d.partition(),
        "offset": d.offset(),
        "attempt": d.attempt(),
        "key": d.key().map(|k| String::from_utf8_lossy(k).into_owned()),
        "original": d.original().map(|o| o.to_string()),
        "outcome": outcome,
        "at_ms": now_ms(),
    })
}

fn emit(d: &Delivery, outcome: &str) {
    print_line(&json(d, outcome));
}

fn print_line(line: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}");
    let _ = out.flush();
}
