//! A plain librdkafka consumer (no markers, no tracker) that only stays in its group: the
//! control for `scripts/group-stall`, which asks whether a group's members keep up with their
//! target assignment through coordinator stalls. Using none of this crate's code, it tells a
//! librdkafka or broker problem from one of ours.
//!
//! ```text
//! cargo run --example group_member -- --brokers 127.0.0.1:9092 --group g --topic t \
//!     --protocol consumer
//! ```

use std::time::Duration;

use clap::Parser;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};

#[derive(Parser)]
struct Args {
    /// Kafka bootstrap servers.
    #[arg(long)]
    brokers: String,
    /// Consumer group.
    #[arg(long)]
    group: String,
    /// Topic to subscribe to.
    #[arg(long)]
    topic: String,
    /// `consumer` (KIP-848) or `classic` (then with cooperative-sticky assignment).
    #[arg(long, default_value = "consumer")]
    protocol: String,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &args.brokers)
        .set("group.id", &args.group)
        .set("group.protocol", &args.protocol)
        .set("auto.offset.reset", "earliest");
    if args.protocol == "classic" {
        // The fault suite's worker settings (tests/faults/fleet.rs).
        config
            .set("partition.assignment.strategy", "cooperative-sticky")
            .set("session.timeout.ms", "10000")
            .set("heartbeat.interval.ms", "1000");
    }
    let consumer: BaseConsumer = config.create()?;
    consumer.subscribe(&[&args.topic])?;
    loop {
        // Polling serves the rebalances; the records themselves do not matter here.
        if let Some(Err(e)) = consumer.poll(Duration::from_millis(100)) {
            eprintln!("group_member: {e}");
        }
    }
}
