//! Reading a markers partition to learn what became of a schedule, for
//! [`super::Scheduler::cancel`].
//!
//! A schedule is settled by the first End for its coordinates after its Schedule marker, so
//! the answer is in the log: read the marker at the id, then every marker after it up to a
//! bound. Blocking (librdkafka's consumer); callers run it off the async runtime.

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use crate::marker::{decode, Marker, SourceRef};

use super::error::ClientError;
use super::scheduler::{ScheduleId, SchedulerConfig};

/// How long one scan may go without reading anything before it gives up.
const STALL: Duration = Duration::from_secs(30);

/// How far a scan reads.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Until {
    /// To the end of the partition as it was when the scan began.
    HighWatermark,
    /// To this offset, inclusive.
    Offset(i64),
}

/// What the log says about a schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Settled {
    /// There is no Schedule marker at the id.
    NotASchedule,
    /// No End follows it within the scan.
    Pending {
        /// When it is due, broker time in Unix epoch ms.
        due_ms: i64,
    },
    /// The first End for it.
    EndedAt {
        /// Offset of that End.
        offset: i64,
        /// Its broker timestamp.
        timestamp_ms: i64,
        /// When the schedule was due.
        due_ms: i64,
    },
}

fn scan_error(what: &str, e: impl std::fmt::Display) -> ClientError {
    ClientError::Scan(format!("{what}: {e}"))
}

fn reader(
    config: &SchedulerConfig,
    id: ScheduleId,
    from: i64,
) -> Result<BaseConsumer, ClientError> {
    let consumer: BaseConsumer = config
        .client_config(&[
            // Assigned, never subscribed: the group id is required but never joined.
            ("group.id", "kafka-redelivery-schedule-scan"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "false"),
        ])
        .create()
        .map_err(|e| scan_error("creating the markers reader", e))?;
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&config.markers_topic, id.partition, Offset::Offset(from))
        .map_err(|e| scan_error("choosing the start offset", e))?;
    consumer
        .assign(&tpl)
        .map_err(|e| scan_error("assigning the markers partition", e))?;
    Ok(consumer)
}

/// Reads the Schedule marker at `id` and the markers after it, up to `until`.
pub(crate) fn find(
    config: &SchedulerConfig,
    id: ScheduleId,
    until: Until,
) -> Result<Settled, ClientError> {
    let consumer = reader(config, id, id.offset)?;
    let (low, high) = consumer
        .fetch_watermarks(&config.markers_topic, id.partition, Duration::from_secs(10))
        .map_err(|e| scan_error("reading the markers partition's offsets", e))?;
    if id.offset < low || id.offset >= high {
        return Ok(Settled::NotASchedule);
    }
    let last = match until {
        Until::HighWatermark => high - 1,
        Until::Offset(o) => o,
    };
    let me = SourceRef::new(config.markers_topic.as_str(), id.partition, id.offset);
    let mut due_ms = None;
    let mut quiet_since = Instant::now();
    loop {
        let Some(result) = consumer.poll(Duration::from_millis(200)) else {
            if quiet_since.elapsed() > STALL {
                return Err(scan_error(
                    "reading the markers partition",
                    format!("nothing read for {STALL:?} before offset {last}"),
                ));
            }
            continue;
        };
        quiet_since = Instant::now();
        let m = result.map_err(|e| scan_error("reading the markers partition", e))?;
        let timestamp_ms = m.timestamp().to_millis().unwrap_or(0);
        let marker = m.payload().map(decode);
        match due_ms {
            None => {
                // The first record read must be the schedule itself.
                let Some(due) = marker
                    .filter(|_| m.offset() == id.offset)
                    .and_then(|marker| due_at(marker.ok()?, timestamp_ms))
                else {
                    return Ok(Settled::NotASchedule);
                };
                due_ms = Some(due);
            }
            Some(due_ms) => {
                if let Some(Ok(Marker::End { source })) = marker {
                    if source == me {
                        return Ok(Settled::EndedAt {
                            offset: m.offset(),
                            timestamp_ms,
                            due_ms,
                        });
                    }
                }
            }
        }
        if m.offset() >= last {
            return Ok(match due_ms {
                Some(due_ms) => Settled::Pending { due_ms },
                None => Settled::NotASchedule,
            });
        }
    }
}

/// When a Schedule marker appended at `timestamp_ms` is due; `None` for any other marker.
fn due_at(marker: Marker, timestamp_ms: i64) -> Option<i64> {
    let Marker::Schedule {
        not_before_ms,
        delay_ms,
        ..
    } = marker
    else {
        return None;
    };
    let delay = i64::try_from(delay_ms).unwrap_or(i64::MAX);
    Some(timestamp_ms.saturating_add(delay).max(not_before_ms))
}

/// Whether another End for `id` is appended after offset `after` within the config's settle
/// wait.
pub(crate) fn end_after(
    config: &SchedulerConfig,
    id: ScheduleId,
    after: i64,
) -> Result<bool, ClientError> {
    let consumer = reader(config, id, after + 1)?;
    let me = SourceRef::new(config.markers_topic.as_str(), id.partition, id.offset);
    let deadline = Instant::now() + config.settle_wait;
    while Instant::now() < deadline {
        let Some(result) = consumer.poll(Duration::from_millis(100)) else {
            continue;
        };
        let m = result.map_err(|e| scan_error("reading the markers partition", e))?;
        if let Some(Ok(Marker::End { source })) = m.payload().map(decode) {
            if source == me {
                return Ok(true);
            }
        }
    }
    Ok(false)
}
