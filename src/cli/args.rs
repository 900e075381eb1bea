//! Command-line arguments. Every flag also reads an environment variable (`REDELIVERY_*`),
//! durations are humantime ("30s", "7d"), and `-X key=value` passes settings to librdkafka.

use std::net::SocketAddr;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

/// Individual acks and timeout redelivery on top of plain Kafka.
#[derive(Debug, Parser)]
#[command(name = "redelivery-tracker", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the RedeliveryTracker until SIGINT or SIGTERM.
    Run(RunArgs),
    /// Manage the markers and dead-letter topics.
    Topics {
        /// What to do with them.
        #[command(subcommand)]
        command: TopicsCommand,
    },
    /// Run producer, worker and tracker on an in-process mock Kafka cluster; no broker needed.
    Demo(DemoArgs),
    /// Show what a running tracker holds, per partition, from its admin endpoint.
    Inspect(InspectArgs),
    /// Work with dead-letter topics.
    Dlq {
        /// What to do.
        #[command(subcommand)]
        command: DlqCommand,
    },
}

/// `dlq` subcommands.
#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Send dead-lettered records back to their source topic (or `--to`), at least once.
    Redrive(RedriveArgs),
}

/// `dlq redrive` arguments.
#[derive(Debug, Clone, Args)]
pub struct RedriveArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "REDELIVERY_BROKERS", default_value = "localhost:9092")]
    pub brokers: String,
    /// The dead-letter topic to read.
    #[arg(long, env = "REDELIVERY_REDRIVE_DLQ_TOPIC")]
    pub dlq_topic: String,
    /// Send every record here instead of to its original topic.
    #[arg(long)]
    pub to: Option<String>,
    /// Only records dead-lettered for this reason (repeatable): rejected, max-deliveries,
    /// source-unreadable, copy-rejected.
    #[arg(long)]
    pub reason: Vec<String>,
    /// Only records whose original topic is this one (repeatable).
    #[arg(long)]
    pub source_topic: Vec<String>,
    /// Stop after this many records are sent back.
    #[arg(long)]
    pub max: Option<u64>,
    /// Count what would be sent back; send and commit nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Consumer group that keeps the redrive position (default `redelivery-redrive.<dlq>`).
    #[arg(long)]
    pub group_id: Option<String>,
    /// librdkafka setting passed through as is (repeatable).
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_key_value)]
    pub rdkafka: Vec<(String, String)>,
}

/// `inspect` arguments.
#[derive(Debug, Clone, Args)]
pub struct InspectArgs {
    /// The tracker's admin address (`host:port`).
    #[arg(
        long,
        env = "REDELIVERY_INSPECT_ADMIN",
        default_value = "127.0.0.1:9464"
    )]
    pub admin: String,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// `topics` subcommands.
#[derive(Debug, Subcommand)]
pub enum TopicsCommand {
    /// Create the markers topic (and dead-letter topics) with the settings the tracker needs.
    Create(TopicsArgs),
}

/// Connection settings shared by every command that talks to Kafka.
#[derive(Debug, Clone, Args)]
pub struct KafkaArgs {
    /// Kafka bootstrap servers.
    #[arg(long, env = "REDELIVERY_BROKERS", default_value = "localhost:9092")]
    pub brokers: String,
    /// The markers topic.
    #[arg(long, env = "REDELIVERY_MARKERS_TOPIC")]
    pub markers_topic: String,
    /// Dead-letter topic name; `{topic}` stands for the source topic.
    #[arg(long, env = "REDELIVERY_DLQ_TOPIC", default_value = "{topic}.dlq")]
    pub dlq_topic: String,
    /// Compacted topic holding partition snapshots [default: MARKERS_TOPIC.snapshots].
    #[arg(long, env = "REDELIVERY_SNAPSHOTS_TOPIC")]
    pub snapshots_topic: Option<String>,
    /// librdkafka setting passed through as is (repeatable), e.g. `-X security.protocol=ssl`.
    /// In the environment, separate several with `;`.
    // Values from the environment are never shown by `--help`: they may hold passwords.
    #[arg(short = 'X', value_name = "KEY=VALUE", value_parser = parse_key_value,
          env = "REDELIVERY_RDKAFKA", value_delimiter = ';', hide_env_values = true)]
    pub rdkafka: Vec<(String, String)>,
}

impl KafkaArgs {
    /// The snapshots topic: the one given, or the markers topic's name plus `.snapshots`.
    pub fn snapshots_topic(&self) -> String {
        self.snapshots_topic
            .clone()
            .unwrap_or_else(|| format!("{}.snapshots", self.markers_topic))
    }
}

/// `run` arguments.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Kafka connection.
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Consumer group shared by all tracker replicas.
    #[arg(
        long,
        env = "REDELIVERY_GROUP_ID",
        default_value = "redelivery-tracker"
    )]
    pub group_id: String,
    /// Address of the admin HTTP server (/metrics, /healthz, /readyz).
    #[arg(long, env = "REDELIVERY_ADMIN_LISTEN", default_value = "0.0.0.0:9464")]
    pub admin_listen: SocketAddr,
    /// Once the admin server listens, write its address to this file (so --admin-listen may
    /// use port 0, and a supervisor or test reads the port back).
    #[arg(long, env = "REDELIVERY_ADMIN_ADDRESS_FILE")]
    pub admin_address_file: Option<std::path::PathBuf>,
    /// Deliveries allowed per record before it goes to the dead-letter topic (1 to 8191, the
    /// most attempts the tracker counts).
    #[arg(long, env = "REDELIVERY_MAX_DELIVERIES", default_value_t = 5,
          value_parser = clap::value_parser!(u32).range(1..=8191))]
    pub max_deliveries: u32,
    /// How often to commit markers offsets.
    #[arg(long, env = "REDELIVERY_COMMIT_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub commit_interval: Duration,
    /// Read the records of deliveries still in flight this long before their deadline, so a
    /// redelivery only has to produce the copy (0s: off; read when due).
    #[arg(long, env = "REDELIVERY_READ_AHEAD", default_value = "100ms", value_parser = parse_duration)]
    pub read_ahead: Duration,
    /// The consumer group of the source topics. When set, a delivery whose deadline passes
    /// while this group has not committed past its record is not copied: its worker stopped
    /// before handing it out, and the group's next reader delivers it again. The copy is made
    /// only if the group does not take it over within --source-group-wait. Needs Describe on
    /// the group; without it every delivery is copied at its deadline.
    #[arg(long, env = "REDELIVERY_SOURCE_GROUP", value_parser = parse_group)]
    pub source_group: Option<String>,
    /// Longest a copy is held back for --source-group (then made anyway: nothing is lost).
    #[arg(long, env = "REDELIVERY_SOURCE_GROUP_WAIT", default_value = "2m", value_parser = parse_duration)]
    pub source_group_wait: Duration,
    /// Snapshot a markers partition when a restart would replay at least this many markers
    /// (0: never; a restart then replays from the oldest item in flight).
    #[arg(
        long,
        env = "REDELIVERY_SNAPSHOT_AFTER_MARKERS",
        default_value_t = 100_000
    )]
    pub snapshot_after_markers: u64,
    /// Least time between two snapshots of one markers partition.
    #[arg(long, env = "REDELIVERY_SNAPSHOT_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub snapshot_interval: Duration,
    /// Refuse to start (instead of warning) when the markers topic has the wrong settings.
    #[arg(long, env = "REDELIVERY_STRICT_TOPIC_CHECK")]
    pub strict_topic_check: bool,
    /// Start on a markers topic with message.timestamp.type=CreateTime (refused otherwise):
    /// deadlines then follow the clocks of the hosts that write markers.
    #[arg(long, env = "REDELIVERY_ALLOW_CREATE_TIME")]
    pub allow_create_time: bool,
    /// Shortest markers retention accepted without a warning.
    #[arg(long, env = "REDELIVERY_MIN_RETENTION", default_value = "1d", value_parser = parse_duration)]
    pub min_retention: Duration,
    /// Log format.
    #[arg(long, env = "REDELIVERY_LOG_FORMAT", value_enum, default_value_t = LogFormat::Pretty)]
    pub log_format: LogFormat,
}

/// `topics create` arguments.
#[derive(Debug, Clone, Args)]
pub struct TopicsArgs {
    /// Kafka connection.
    #[command(flatten)]
    pub kafka: KafkaArgs,
    /// Partitions of the markers topic. Fixed for good: it decides where each source's markers go.
    /// One by default: a client writes one Start per markers partition that a poll batch's
    /// records map to, librdkafka sends each partition in a produce request of its own, and the
    /// batch waits for the slowest of them, so every extra partition costs broker CPU and
    /// handout latency (BENCHMARKS.md, "How many markers partitions"). One tracker applies
    /// millions of version 2 records a second; more partitions only let more replicas work.
    #[arg(long, env = "REDELIVERY_MARKERS_PARTITIONS", default_value_t = 1,
          value_parser = clap::value_parser!(i32).range(1..))]
    pub partitions: i32,
    /// Replication factor of the created topics (-1: the broker's default).
    #[arg(long, env = "REDELIVERY_REPLICATION_FACTOR", default_value_t = -1, allow_negative_numbers = true)]
    pub replication_factor: i32,
    /// Retention of the markers topic: longer than the longest processing time and delay.
    #[arg(long, env = "REDELIVERY_MARKERS_RETENTION", default_value = "7d", value_parser = parse_duration)]
    pub retention: Duration,
    /// Source topics whose dead-letter topics to create too (repeatable or comma-separated).
    #[arg(
        long = "source-topic",
        env = "REDELIVERY_SOURCE_TOPICS",
        value_delimiter = ','
    )]
    pub source_topics: Vec<String>,
}

/// `demo` arguments.
#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Records to produce.
    #[arg(long, default_value_t = 2_000)]
    pub messages: usize,
    /// Share of records the worker fails (0.0 to 1.0) by rejecting, nacking or abandoning them.
    #[arg(long, default_value_t = 0.2, value_parser = parse_fraction)]
    pub fail_rate: f64,
    /// Print a JSON summary as the last line.
    #[arg(long)]
    pub json: bool,
    /// Give up waiting for every record to settle after this long.
    #[arg(long, default_value = "120s", value_parser = parse_duration)]
    pub deadline: Duration,
}

/// How logs are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Pretty,
    /// One JSON object per line.
    Json,
}

/// Parses `key=value`.
pub fn parse_key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.to_string())),
        _ => Err(format!("expected KEY=VALUE, got `{s}`")),
    }
}

/// Parses a humantime duration such as `30s` or `1h 30m`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("`{s}` is not a duration like 30s or 5m: {e}"))
}

/// A consumer group name: anything but empty or blank (Kafka refuses those).
fn parse_group(s: &str) -> Result<String, String> {
    if s.trim().is_empty() {
        Err("a group name cannot be empty".into())
    } else {
        Ok(s.to_string())
    }
}

fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("`{s}` is not a number between 0 and 1")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_values_split_at_the_first_equals() {
        assert_eq!(parse_key_value("a=b=c"), Ok(("a".into(), "b=c".into())));
        assert!(parse_key_value("novalue").is_err());
        assert!(parse_key_value("=x").is_err());
    }

    #[test]
    fn a_source_group_is_not_blank() {
        assert_eq!(parse_group("workers"), Ok("workers".into()));
        assert!(parse_group(" ").is_err());
    }

    #[test]
    fn durations_are_humantime() {
        assert_eq!(parse_duration("1m 30s"), Ok(Duration::from_secs(90)));
        assert!(parse_duration("soon").is_err());
    }
}
