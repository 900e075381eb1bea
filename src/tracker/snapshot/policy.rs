//! How the markers consumer uses snapshots: restore a partition's state when it is assigned,
//! take a snapshot when a restart would replay too much, and commit its pointer once durable.
//!
//! The invariant changes from "the committed offset never passes the oldest Start in flight"
//! to "... unless a durable snapshot covering everything before the committed offset is named
//! in the commit's metadata". Restoring therefore needs the committed metadata: a partition
//! whose lookup or snapshot read fails stays paused and unready, and is retried, because
//! replaying from the committed offset without its snapshot would forget what it holds.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::kafka::producer::QuietProducer;
use futures::FutureExt;
use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

use crate::tracker::config::TrackerConfig;
use crate::tracker::core::state::PartitionState;
use crate::tracker::markers::partition::OwnedPartition;
use crate::tracker::metrics::progress::{SnapshotFailed, SnapshotWritten};
use crate::tracker::metrics::{Metrics, Problem};
use crate::tracker::snapshot::store::{self, Pointer};

/// Wait between tries to restore a partition.
pub const RESTORE_RETRY: Duration = Duration::from_secs(5);
/// A snapshot whose chunks are not all durable after this long is given up (and retried).
const WRITE_TIMEOUT: Duration = Duration::from_secs(60);

/// What a newly assigned partition starts from.
pub enum Restored {
    /// No snapshot applies: replay from the committed offset, as without snapshots.
    Nothing,
    /// The state from this snapshot; replay from the offset it covers.
    State(Pointer, Box<PartitionState>),
}

/// Looks up the committed pointer of each partition in `ids` and loads its snapshot from
/// `snapshots_topic`. An error for a partition means it cannot be started safely yet.
///
/// Done whether or not this tracker takes snapshots itself: the committed offset of a
/// partition may have moved past items that only a snapshot holds (a schedule due next week),
/// and a tracker that replayed from it without the snapshot would lose them for good.
pub fn restore<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    config: &TrackerConfig,
    metrics: &Metrics,
    snapshots_topic: Option<&str>,
    ids: &[i32],
    stop: &std::sync::atomic::AtomicBool,
) -> BTreeMap<i32, Result<Restored, String>> {
    let mut tpl = TopicPartitionList::new();
    for id in ids {
        tpl.add_partition(&config.markers_topic, *id);
    }
    let committed = match consumer.committed_offsets(tpl, Duration::from_secs(10)) {
        Ok(c) => c,
        Err(e) => {
            let why = format!("looking up committed offsets: {e}");
            return ids.iter().map(|id| (*id, Err(why.clone()))).collect();
        }
    };
    committed
        .elements()
        .iter()
        .map(|e| {
            let id = e.partition();
            let pointer = Pointer::parse(e.metadata());
            tracing::debug!(partition = id, committed = ?e.offset(), metadata = e.metadata(), "committed offset looked up for restore");
            if let Err(err) = e.error() {
                // Not "nothing committed": the answer for this partition is unknown.
                return (id, Err(format!("looking up the committed offset: {err}")));
            }
            let result = match (pointer, e.offset()) {
                // The commit that named this snapshot set the offset to what it covers; a
                // later commit past it relies on the snapshot no more.
                (Some(p), Offset::Offset(c)) if c <= p.covers => match snapshots_topic {
                    None => Err(format!(
                        "the committed offset {c} relies on snapshot epoch {} and no snapshots \
                         topic is configured (--snapshots-topic)",
                        p.epoch
                    )),
                    Some(topic) => {
                        store::read(config, metrics, topic, id, p, stop).map(|(_, data)| {
                            let (state, skipped) =
                                PartitionState::import(&config.markers_topic, id, data);
                            if skipped > 0 {
                                metrics.emit(Problem::SnapshotEntriesSkipped {
                                    partition: id,
                                    skipped,
                                });
                            }
                            Restored::State(p, Box::new(state))
                        })
                    }
                },
                _ => Ok(Restored::Nothing),
            };
            (id, result)
        })
        .collect()
}

/// Begins a snapshot of `p` if a restart would replay at least `snapshot_after_markers`
/// markers and the last one is old enough. Only a ready partition with no snapshot being
/// written, whose latest snapshot has been committed, is snapshotted (compaction safety: see
/// [`OwnedPartition::committed_epoch`]).
pub fn maybe_start(
    p: &mut OwnedPartition,
    config: &TrackerConfig,
    snapshots_topic: &str,
    producer: &QuietProducer,
    metrics: &Metrics,
    now: Instant,
    oldest: i64,
) {
    if config.snapshot_after_markers == 0
        || !p.is_ready()
        || p.snapshots.in_flight.is_some()
        || !p.snapshot_committed()
        || p.snapshots
            .last_begun_at
            .is_some_and(|t| now.duration_since(t) < config.snapshot_min_interval)
    {
        return;
    }
    let Some(next) = p.next_offset else { return };
    let (commit, _) = p.commit_point_from(oldest);
    let replay = u64::try_from(next - commit).unwrap_or(0);
    if replay < config.snapshot_after_markers {
        return;
    }
    let epoch = p.snapshots.latest.map_or(1, |s| s.epoch + 1);
    let data = p.state.export();
    match store::write(producer, snapshots_topic, p.id, epoch, next, &data) {
        Ok(in_flight) => {
            tracing::info!(
                partition = p.id,
                epoch,
                covers = next,
                entries = data.entries.len(),
                replay_before = replay,
                "writing a snapshot"
            );
            p.snapshots.in_flight = Some(in_flight);
        }
        Err(e) => metrics.emit(SnapshotFailed {
            partition: p.id,
            why: &e.to_string(),
        }),
    }
    p.snapshots.last_begun_at = Some(now);
}

/// Checks the snapshot being written for `p`: once every chunk is durable, it becomes the
/// partition's pointer and the next commit names it.
pub fn poll_in_flight(p: &mut OwnedPartition, metrics: &Metrics) {
    let Some(in_flight) = p.snapshots.in_flight.as_mut() else {
        return;
    };
    let mut failed = None;
    in_flight
        .chunks
        .retain_mut(|chunk| match chunk.now_or_never() {
            None => true,
            Some(Ok(Ok(delivery))) => {
                in_flight.offsets.push(delivery.offset);
                false
            }
            Some(Ok(Err((e, _)))) => {
                failed = Some(e.to_string());
                false
            }
            Some(Err(_)) => {
                failed = Some("the producer was dropped".to_string());
                false
            }
        });
    if failed.is_none()
        && !in_flight.chunks.is_empty()
        && in_flight.started.elapsed() > WRITE_TIMEOUT
    {
        failed = Some("chunks not durable in time".to_string());
    }
    if let Some(why) = failed {
        metrics.emit(SnapshotFailed {
            partition: p.id,
            why: &why,
        });
        p.snapshots.in_flight = None;
        return;
    }
    if !in_flight.chunks.is_empty() {
        return;
    }
    let (Some(&first), Some(&last)) = (
        in_flight.offsets.iter().min(),
        in_flight.offsets.iter().max(),
    ) else {
        p.snapshots.in_flight = None;
        return;
    };
    let pointer = Pointer {
        epoch: in_flight.epoch,
        first,
        last,
        covers: in_flight.covers,
    };
    metrics.emit(SnapshotWritten {
        partition: p.id,
        covers: pointer.covers,
        took: in_flight.started.elapsed(),
    });
    p.snapshots.latest = Some(pointer);
    p.snapshots.in_flight = None;
}
