//! Did a previous owner already publish these schedules? Asked once after a takeover, so a
//! schedule is delivered exactly once even when a tracker dies between producing a scheduled
//! record and writing its End.
//!
//! A tracker that takes over a markers partition replays every schedule the previous owner
//! had not ended. Those due before the takeover may have been produced already: the previous
//! owner produces first and writes the End after. Every published record carries its
//! schedule's id in `kr-schedule-id`, so the new owner reads its target topic from a little
//! before the earliest such due time and skips the ones it finds. Only schedules due before
//! the takeover are checked, so a tracker in steady state never pays for this.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::headers;

use crate::tracker::config::TrackerConfig;
use crate::tracker::metrics::Metrics;
use crate::tracker::redeliver::source_reader::{reader_consumer, ReaderContext};

/// How far before the earliest due time to start reading: covers a previous owner whose clock
/// ran ahead of the broker's. A publication is never earlier than its due time otherwise.
const EARLY: Duration = Duration::from_secs(60);
/// Give up when nothing arrives for this long.
const STALL: Duration = Duration::from_secs(30);
/// Give up when a scan takes this long in all: the schedules are then published (a logged
/// possible duplicate) rather than held back behind a huge target topic.
const SCAN_LIMIT: Duration = Duration::from_secs(60);

/// Which of `wanted` (schedule ids as `kr-schedule-id` writes them) are already in `topic` in
/// records appended since `from_ms`. An error means the answer is unknown: so does a scan
/// longer than a minute, or a stop requested meanwhile (`stop`).
pub fn already_published(
    config: &TrackerConfig,
    metrics: &Metrics,
    topic: &str,
    from_ms: i64,
    wanted: &HashSet<String>,
    stop: &AtomicBool,
) -> Result<HashSet<String>, String> {
    let consumer = reader_consumer(config, metrics).map_err(|e| e.to_string())?;
    let timeout = Duration::from_secs(10);
    let metadata = consumer
        .fetch_metadata(Some(topic), timeout)
        .map_err(|e| format!("metadata of {topic}: {e}"))?;
    let partitions: Vec<i32> = metadata
        .topics()
        .iter()
        .filter(|t| t.name() == topic)
        .flat_map(|t| t.partitions().iter().map(|p| p.id()))
        .collect();
    let since = from_ms.saturating_sub(EARLY.as_millis() as i64);
    let mut query = TopicPartitionList::new();
    for &p in &partitions {
        query
            .add_partition_offset(topic, p, Offset::Offset(since))
            .map_err(|e| e.to_string())?;
    }
    let starts = consumer
        .offsets_for_times(query, timeout)
        .map_err(|e| format!("offsets of {topic} since {since} ms: {e}"))?;
    let mut assign = TopicPartitionList::new();
    // Per partition, the last offset to read.
    let mut ends: HashMap<i32, i64> = HashMap::new();
    for e in starts.elements() {
        let Offset::Offset(start) = e.offset() else {
            continue; // nothing appended since then
        };
        let (_, high) = consumer
            .fetch_watermarks(topic, e.partition(), timeout)
            .map_err(|err| format!("offsets of {topic}/{}: {err}", e.partition()))?;
        if start < high {
            assign
                .add_partition_offset(topic, e.partition(), Offset::Offset(start))
                .map_err(|err| err.to_string())?;
            ends.insert(e.partition(), high - 1);
        }
    }
    if ends.is_empty() {
        return Ok(HashSet::new());
    }
    consumer.assign(&assign).map_err(|e| e.to_string())?;
    scan(&consumer, ends, wanted, stop)
}

fn scan(
    consumer: &BaseConsumer<ReaderContext>,
    mut ends: HashMap<i32, i64>,
    wanted: &HashSet<String>,
    stop: &AtomicBool,
) -> Result<HashSet<String>, String> {
    let mut found = HashSet::new();
    let started = Instant::now();
    let mut quiet_since = started;
    while !ends.is_empty() && found.len() < wanted.len() {
        if stop.load(Ordering::Relaxed) {
            return Err("stopping".into());
        }
        if started.elapsed() > SCAN_LIMIT {
            return Err(format!("the scan took longer than {SCAN_LIMIT:?}"));
        }
        let Some(result) = consumer.poll(Duration::from_millis(200)) else {
            if quiet_since.elapsed() > STALL {
                return Err(format!("nothing read for {STALL:?}"));
            }
            continue;
        };
        quiet_since = Instant::now();
        let m = match result {
            Ok(m) => m,
            Err(KafkaError::PartitionEOF(p)) => {
                ends.remove(&p);
                continue;
            }
            Err(e) => return Err(e.to_string()),
        };
        // Byte-exact: the target may hold records whose header names are not UTF-8.
        let list = headers::from_kafka(m.headers());
        let id = list
            .iter()
            .filter(|(k, _)| k == headers::SCHEDULE_ID)
            .find_map(|(_, v)| std::str::from_utf8(v.as_deref()?).ok());
        if let Some(id) = id.filter(|id| wanted.contains(*id)) {
            found.insert(id.to_string());
        }
        if ends
            .get(&m.partition())
            .is_some_and(|&end| m.offset() >= end)
        {
            ends.remove(&m.partition());
        }
    }
    Ok(found)
}
