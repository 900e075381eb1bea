//! Produces N records with unique keys, a header and a payload of a chosen size.
//!
//! ```text
//! cargo run --example producer -- --brokers 127.0.0.1:39092 --topic orders --count 10000 --size 100
//! ```
//!
//! Keys are `{prefix}-{i}`; each record carries the header `seq` = i and, with `--timeout`, the
//! `kr-timeout-ms` header that overrides the consumer's delivery timeout for that record.

use std::time::{Duration, Instant};

use clap::Parser;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::ClientConfig;

#[derive(Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long, env = "REDELIVERY_BROKERS", default_value = "localhost:9092")]
    brokers: String,
    /// Topic to produce to.
    #[arg(long)]
    topic: String,
    /// Number of records.
    #[arg(long, default_value_t = 1000)]
    count: usize,
    /// Payload size in bytes.
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Key prefix; keys are `{prefix}-{i}`.
    #[arg(long, default_value = "msg")]
    prefix: String,
    /// Per-record delivery timeout to put in the `kr-timeout-ms` header.
    #[arg(long, value_parser = humantime::parse_duration)]
    timeout: Option<Duration>,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.brokers)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()?;
    let started = Instant::now();
    let payload = vec![b'x'; args.size];
    let timeout_ms = args.timeout.map(|t| t.as_millis().to_string());
    let mut pending = Vec::with_capacity(1024);
    for i in 0..args.count {
        let key = format!("{}-{i}", args.prefix);
        let seq = i.to_string();
        let mut headers = OwnedHeaders::new().insert(Header {
            key: "seq",
            value: Some(seq.as_bytes()),
        });
        if let Some(t) = &timeout_ms {
            headers = headers.insert(Header {
                key: "kr-timeout-ms",
                value: Some(t.as_bytes()),
            });
        }
        let mut record = FutureRecord::to(&args.topic)
            .key(&key)
            .payload(&payload)
            .headers(headers);
        loop {
            match producer.send_result(record) {
                Ok(delivery) => {
                    pending.push(delivery);
                    break;
                }
                // librdkafka's queue is full: wait for what is in flight, then try again.
                Err((e, r)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                    record = r;
                    settle(&mut pending).await?;
                }
                Err((e, _)) => return Err(e.into()),
            }
        }
        if pending.len() >= 10_000 {
            settle(&mut pending).await?;
        }
    }
    settle(&mut pending).await?;
    eprintln!(
        "produced {} records to {} in {:.2}s",
        args.count,
        args.topic,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

async fn settle(pending: &mut Vec<DeliveryFuture>) -> Result<(), Box<dyn std::error::Error>> {
    for r in futures::future::join_all(pending.drain(..)).await {
        r?.map_err(|(e, _)| e)?;
    }
    Ok(())
}
