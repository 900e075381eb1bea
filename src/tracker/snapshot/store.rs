//! Where snapshots live: the snapshots topic, and a pointer in the committed markers offset.
//!
//! Snapshot chunks of markers partition `p` go to partition `p` of the snapshots topic, a
//! compacted topic, keyed `p/<epoch parity>/<chunk index>`. The *pointer* (epoch, the chunks'
//! offset range, the markers offset covered) is committed as the metadata of the markers
//! offset commit, so the committed offset and the snapshot it relies on change in one atomic
//! step. Keys alternate between two sets by epoch parity, so compaction can only remove a
//! chunk once the next-but-one snapshot reuses its key, and a new snapshot is begun only after
//! the previous one is committed: the committed pointer always names chunks that exist.

use std::time::{Duration, Instant};

use crate::kafka::producer::{DeliveryFuture, QuietProducer};
use rdkafka::consumer::Consumer;
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::producer::FutureRecord;
use rdkafka::{Offset, TopicPartitionList};

use crate::tracker::config::TrackerConfig;
use crate::tracker::core::state::Exported;
use crate::tracker::metrics::Metrics;
use crate::tracker::redeliver::source_reader::reader_consumer;
use crate::tracker::snapshot::format::{self, Chunk, ChunkHeader};

/// Give up reading a snapshot when nothing arrives for this long (retried later).
const STALL: Duration = Duration::from_secs(30);

/// Where a committed snapshot is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pointer {
    /// The snapshot's epoch.
    pub epoch: u64,
    /// Offset of its first chunk in the snapshots partition.
    pub first: i64,
    /// Offset of its last chunk.
    pub last: i64,
    /// Markers before this offset are in the snapshot.
    pub covers: i64,
}

const PREFIX: &str = "kr-snapshot/1";

impl Pointer {
    /// The commit metadata that carries this pointer.
    pub fn to_metadata(self) -> String {
        format!(
            "{PREFIX} epoch={} first={} last={} covers={}",
            self.epoch, self.first, self.last, self.covers
        )
    }

    /// The pointer in commit metadata, if it holds one (other metadata is not ours).
    pub fn parse(metadata: &str) -> Option<Pointer> {
        let mut fields = metadata.split(' ');
        if fields.next()? != PREFIX {
            return None;
        }
        let mut get = |name: &str| -> Option<i64> {
            let (k, v) = fields.next()?.split_once('=')?;
            (k == name).then(|| v.parse().ok()).flatten()
        };
        let epoch = u64::try_from(get("epoch")?).ok()?;
        let (first, last, covers) = (get("first")?, get("last")?, get("covers")?);
        (first >= 0 && last >= first && covers >= 0).then_some(Pointer {
            epoch,
            first,
            last,
            covers,
        })
    }
}

/// A snapshot being written: its chunks are queued, not yet durable.
pub struct InFlight {
    /// Its epoch.
    pub epoch: u64,
    /// The markers offset it covers.
    pub covers: i64,
    /// One per chunk not yet durable.
    pub chunks: Vec<DeliveryFuture>,
    /// Offsets of the chunks already durable.
    pub offsets: Vec<i64>,
    /// When it was begun.
    pub started: Instant,
}

impl std::fmt::Debug for InFlight {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InFlight")
            .field("epoch", &self.epoch)
            .field("covers", &self.covers)
            .field("chunks_waiting", &self.chunks.len())
            .field("offsets", &self.offsets)
            .finish()
    }
}

/// Queues the chunks of a snapshot of markers partition `partition`.
pub fn write(
    producer: &QuietProducer,
    topic: &str,
    partition: i32,
    epoch: u64,
    covers: i64,
    state: &Exported,
) -> Result<InFlight, KafkaError> {
    let encoded = format::encode(partition, epoch, covers, state);
    let mut chunks = Vec::with_capacity(encoded.len());
    for (i, bytes) in encoded.iter().enumerate() {
        let key = format!("{partition}/{}/{i}", epoch % 2);
        let record = FutureRecord::to(topic)
            .partition(partition)
            .key(&key)
            .payload(bytes);
        chunks.push(producer.send_result(record).map_err(|(e, _)| e)?);
    }
    Ok(InFlight {
        epoch,
        covers,
        offsets: Vec::with_capacity(chunks.len()),
        chunks,
        started: Instant::now(),
    })
}

/// Reads the snapshot `pointer` names from partition `partition` of `topic`.
///
/// Gives up (an error) when nothing arrives for 30 s, or at once when `stop` is set.
pub fn read(
    config: &TrackerConfig,
    metrics: &Metrics,
    topic: &str,
    partition: i32,
    pointer: Pointer,
    stop: &std::sync::atomic::AtomicBool,
) -> Result<(ChunkHeader, Exported), String> {
    let consumer = reader_consumer(config, metrics).map_err(|e| e.to_string())?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, partition, Offset::Offset(pointer.first))
        .map_err(|e| e.to_string())?;
    consumer.assign(&tpl).map_err(|e| e.to_string())?;
    let mut chunks: Vec<Chunk> = Vec::new();
    let mut quiet_since = Instant::now();
    loop {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("stopping".into());
        }
        let Some(result) = consumer.poll(Duration::from_millis(200)) else {
            if quiet_since.elapsed() > STALL {
                return Err(format!(
                    "nothing read from {topic}/{partition} for {STALL:?} (wanted offsets {}..={})",
                    pointer.first, pointer.last
                ));
            }
            continue;
        };
        quiet_since = Instant::now();
        let m = match result {
            Ok(m) => m,
            Err(KafkaError::PartitionEOF(_)) => {
                return Err(format!(
                    "{topic}/{partition} ends before offset {}",
                    pointer.last
                ))
            }
            Err(e) => return Err(e.to_string()),
        };
        // A chunk that does not decode belongs to no snapshot we wrote; `assemble` reports
        // the gap if it was one of ours.
        if let Some(Ok(chunk)) = m.payload().map(format::decode_chunk) {
            chunks.push(chunk);
        }
        if m.offset() >= pointer.last {
            break;
        }
    }
    let (header, state) =
        format::assemble(partition, pointer.epoch, chunks).map_err(|e| e.to_string())?;
    if header.covers_until != pointer.covers {
        return Err(format!(
            "the snapshot covers offset {} but the commit says {}",
            header.covers_until, pointer.covers
        ));
    }
    Ok((header, state))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointers_round_trip_through_commit_metadata() {
        let p = Pointer {
            epoch: 7,
            first: 100,
            last: 104,
            covers: 9_000,
        };
        assert_eq!(Pointer::parse(&p.to_metadata()), Some(p));
        for other in [
            "",
            "something else",
            "kr-snapshot/1 epoch=1",
            "kr-snapshot/1 epoch=1 first=5 last=4 covers=0",
            "kr-snapshot/2 epoch=1 first=1 last=1 covers=1",
            "kr-snapshot/1 epoch=x first=1 last=1 covers=1",
        ] {
            assert_eq!(Pointer::parse(other), None, "{other:?}");
        }
    }
}
