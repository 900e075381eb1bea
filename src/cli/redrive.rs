//! `redelivery-tracker dlq redrive`: moves dead-lettered records back to be processed again,
//! like SQS's dead-letter redrive.
//!
//! At-least-once: the redrive reads the dead-letter topic in a consumer group and commits a
//! record's offset only after its copy is durable, so a redrive that is interrupted can simply
//! be run again; at worst a few records are sent twice. Each group keeps its own position: a
//! record that a filter skipped is not revisited by the same group, so redrive other records
//! with another `--group-id`.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use crate::kafka::producer::QuietProducer;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::headers::{self, HeaderList};

use super::args::RedriveArgs;

/// Why a redrive stopped early.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RedriveError {
    /// A Kafka call failed.
    #[error("kafka {what}: {source}")]
    Kafka {
        /// What was being done.
        what: &'static str,
        /// The error.
        #[source]
        source: rdkafka::error::KafkaError,
    },
}

fn kafka(what: &'static str) -> impl FnOnce(rdkafka::error::KafkaError) -> RedriveError {
    move |source| RedriveError::Kafka { what, source }
}

/// What a redrive did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    /// Dead-lettered records read.
    pub read: u64,
    /// Records sent back (or that would be, with `--dry-run`).
    pub redriven: u64,
    /// Records left alone by the filters.
    pub skipped: u64,
}

/// Where a dead-lettered record goes, if the filters let it through.
pub fn target(args: &RedriveArgs, headers: &HeaderList) -> Option<(String, Option<i32>)> {
    let reason = headers::text(headers, headers::DLQ_REASON).unwrap_or("");
    if !args.reason.is_empty() && !args.reason.iter().any(|r| r == reason) {
        return None;
    }
    let original = headers::text(headers, headers::ORIGINAL_TOPIC);
    if !args.source_topic.is_empty()
        && !args
            .source_topic
            .iter()
            .any(|t| Some(t.as_str()) == original)
    {
        return None;
    }
    match &args.to {
        Some(to) => Some((to.clone(), None)),
        None => {
            let partition =
                headers::text(headers, headers::ORIGINAL_PARTITION).and_then(|p| p.parse().ok());
            original.map(|t| (t.to_string(), partition))
        }
    }
}

/// The headers of a redriven record: the dead-letter and attempt headers go (it starts again at
/// attempt 1), the original coordinates stay, and `kr-redriven-from` says where it came from.
pub fn redriven_headers(headers: &HeaderList, from: &str) -> HeaderList {
    let mut out: HeaderList = headers
        .iter()
        .filter(|(k, _)| {
            ![
                headers::ATTEMPT,
                headers::DLQ_REASON,
                headers::DLQ_DETAIL,
                headers::DLQ_SOURCE,
                headers::REDRIVEN_FROM,
            ]
            .iter()
            .any(|n| k == *n)
        })
        .cloned()
        .collect();
    out.push((
        headers::REDRIVEN_FROM.into(),
        Some(from.as_bytes().to_vec()),
    ));
    out
}

/// Runs the redrive until the end offsets seen at its start, or `--max` records.
pub async fn run(args: &RedriveArgs) -> Result<Report, RedriveError> {
    let (consumer, producer) = clients(args)?;
    let ends = end_offsets(&consumer, &args.dlq_topic)?;
    let total: i64 = ends.values().sum();
    let mut position = start_positions(&consumer, &args.dlq_topic, &ends)?;
    let mut report = Report::default();
    let mut last_progress = Instant::now();
    let done = |position: &HashMap<i32, i64>| {
        ends.iter()
            .all(|(p, end)| position.get(p).copied().unwrap_or(0) >= *end)
    };
    while !done(&position) && args.max.is_none_or(|m| report.redriven < m) {
        let Some(result) = consumer.poll(Duration::from_secs(1)) else {
            continue;
        };
        let m = result
            .map_err(kafka("reading the dead-letter topic"))?
            .detach();
        report.read += 1;
        if redrive_one(args, &producer, &m).await? {
            report.redriven += 1;
        } else {
            report.skipped += 1;
        }
        position.insert(m.partition(), m.offset() + 1);
        if !args.dry_run {
            commit(&consumer, &args.dlq_topic, m.partition(), m.offset() + 1)?;
        }
        if last_progress.elapsed() > Duration::from_millis(200) {
            progress(&report, total);
            last_progress = Instant::now();
        }
    }
    progress(&report, total);
    eprintln!();
    Ok(report)
}

/// The consumer of the dead-letter topic (its own group, committing by hand) and a durable
/// producer for the records sent back.
fn clients(args: &RedriveArgs) -> Result<(BaseConsumer, QuietProducer), RedriveError> {
    let group = args
        .group_id
        .clone()
        .unwrap_or_else(|| format!("redelivery-redrive.{}", args.dlq_topic));
    let consumer: BaseConsumer = crate::kafka::client_config(
        &args.brokers,
        &[
            ("group.id", &group),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "earliest"),
        ],
        &args.rdkafka,
    )
    .create()
    .map_err(kafka("creating the consumer"))?;
    let producer: QuietProducer = crate::kafka::client_config(
        &args.brokers,
        &crate::kafka::DURABLE_PRODUCER,
        &args.rdkafka,
    )
    .create()
    .map_err(kafka("creating the producer"))?;
    Ok((consumer, producer))
}

/// Assigns every partition of `topic` and returns where the redrive stands in each: its
/// committed offset, or 0.
fn start_positions(
    consumer: &BaseConsumer,
    topic: &str,
    ends: &HashMap<i32, i64>,
) -> Result<HashMap<i32, i64>, RedriveError> {
    let mut tpl = TopicPartitionList::new();
    for p in ends.keys() {
        tpl.add_partition(topic, *p);
    }
    consumer
        .assign(&tpl)
        .map_err(kafka("assigning the dead-letter topic"))?;
    let committed = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .map_err(kafka("reading the redrive position"))?;
    Ok(committed
        .elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => (e.partition(), o),
            _ => (e.partition(), 0),
        })
        .collect())
}

/// Sends one record back; returns whether it passed the filters.
async fn redrive_one(
    args: &RedriveArgs,
    producer: &QuietProducer,
    m: &OwnedMessage,
) -> Result<bool, RedriveError> {
    let hs = headers::from_kafka(m.headers());
    let Some((topic, partition)) = target(args, &hs) else {
        return Ok(false);
    };
    if args.dry_run {
        return Ok(true);
    }
    let from = format!("{}/{}@{}", m.topic(), m.partition(), m.offset());
    let kafka_headers = headers::to_kafka(&redriven_headers(&hs, &from));
    let mut record = FutureRecord::to(&topic).headers(kafka_headers);
    if let Some(p) = partition {
        record = record.partition(p);
    }
    if let Some(k) = m.key() {
        record = record.key(k);
    }
    if let Some(v) = m.payload() {
        record = record.payload(v);
    }
    producer
        .send(record, Duration::from_secs(30))
        .await
        .map_err(kafka("producing a redriven record"))?;
    Ok(true)
}

fn commit(
    consumer: &BaseConsumer,
    topic: &str,
    partition: i32,
    next: i64,
) -> Result<(), RedriveError> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(next))
        .map_err(kafka("building the commit"))?;
    consumer
        .commit(&tpl, CommitMode::Sync)
        .map_err(kafka("committing the redrive position"))
}

/// The high watermark of every partition of `topic`, read once at the start.
fn end_offsets(consumer: &BaseConsumer, topic: &str) -> Result<HashMap<i32, i64>, RedriveError> {
    let md = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .map_err(kafka("reading metadata"))?;
    let mut out = HashMap::new();
    for t in md.topics().iter().filter(|t| t.name() == topic) {
        for p in t.partitions() {
            let (_, high) = consumer
                .fetch_watermarks(topic, p.id(), Duration::from_secs(10))
                .map_err(kafka("reading end offsets"))?;
            out.insert(p.id(), high);
        }
    }
    Ok(out)
}

fn progress(report: &Report, total: i64) {
    eprint!(
        "\rredrive: {} of at most {total} read, {} redriven, {} skipped",
        report.read, report.redriven, report.skipped
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(reason: &[&str], source: &[&str], to: Option<&str>) -> RedriveArgs {
        RedriveArgs {
            brokers: String::new(),
            dlq_topic: "orders.dlq".into(),
            to: to.map(String::from),
            reason: reason.iter().map(|s| s.to_string()).collect(),
            source_topic: source.iter().map(|s| s.to_string()).collect(),
            max: None,
            dry_run: false,
            group_id: None,
            rdkafka: vec![],
        }
    }

    fn dlq_headers(reason: &str, topic: &str) -> HeaderList {
        [
            (headers::DLQ_REASON, reason),
            (headers::ORIGINAL_TOPIC, topic),
            (headers::ORIGINAL_PARTITION, "2"),
            (headers::ORIGINAL_OFFSET, "9"),
            (headers::ATTEMPT, "5"),
            ("trace", "t"),
        ]
        .iter()
        .map(|(k, v)| ((*k).into(), Some(v.as_bytes().to_vec())))
        .collect()
    }

    #[test]
    fn filters_by_reason_and_source_topic() {
        let h = dlq_headers("rejected", "orders");
        assert_eq!(
            target(&args(&[], &[], None), &h),
            Some(("orders".into(), Some(2)))
        );
        assert_eq!(target(&args(&["max-deliveries"], &[], None), &h), None);
        assert_eq!(target(&args(&["rejected"], &["payments"], None), &h), None);
        assert_eq!(
            target(&args(&["rejected"], &["orders"], Some("retry")), &h),
            Some(("retry".into(), None))
        );
    }

    #[test]
    fn redriven_records_start_again_at_attempt_one() {
        let out = redriven_headers(&dlq_headers("rejected", "orders"), "orders.dlq/0@4");
        assert_eq!(headers::text(&out, headers::ATTEMPT), None);
        assert_eq!(headers::text(&out, headers::DLQ_REASON), None);
        assert_eq!(headers::text(&out, headers::ORIGINAL_OFFSET), Some("9"));
        assert_eq!(headers::text(&out, "trace"), Some("t"));
        assert_eq!(
            headers::text(&out, headers::REDRIVEN_FROM),
            Some("orders.dlq/0@4")
        );
    }
}
