//! Whether the broker keeps the metadata of an offset commit.
//!
//! A tracker with snapshots commits its markers offset past deliveries still in flight, because
//! the commit's metadata names the snapshot that holds them; a restart restores that snapshot
//! before it replays. A broker that accepts the commit but drops its metadata (Tansu 0.6 does)
//! would make the next owner replay from that offset without the snapshot: every delivery the
//! snapshot held would be forgotten, never redelivered. So before snapshots are used, one commit
//! with metadata is made for a group of its own and read back; if the metadata does not come
//! back, snapshots are off (said once at start) and commits stay at the oldest Start in flight.

use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::tracker::config::TrackerConfig;

/// The metadata the check commits and expects back.
const PROBE: &str = "kafka-redelivery metadata check";

const WAIT: Duration = Duration::from_secs(10);

/// False only when the broker answered the commit and the look-up and the metadata was not
/// kept; a check that cannot be made (an error) leaves snapshots on, as before the check.
pub(crate) fn metadata_kept(config: &TrackerConfig) -> bool {
    // A group of its own, so the tracker group's committed offsets are never touched.
    let group = format!("{}-metadata-check", config.group_id);
    let consumer: BaseConsumer = match config
        .client_config(&[("group.id", &group), ("enable.auto.commit", "false")])
        .create()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::debug!(error = %e, "commit metadata check not made");
            return true;
        }
    };
    let mut tpl = TopicPartitionList::new();
    let mut e = tpl.add_partition(&config.markers_topic, 0);
    // Offset 0 is a real offset; only a non-offset is refused.
    let _ = e.set_offset(Offset::Offset(0));
    e.set_metadata(PROBE);
    if let Err(e) = consumer.commit(&tpl, CommitMode::Sync) {
        tracing::debug!(error = %e, "commit metadata check not made");
        return true;
    }
    let read = match consumer.committed_offsets(tpl, WAIT) {
        Ok(read) => read,
        Err(e) => {
            tracing::debug!(error = %e, "commit metadata check not made");
            return true;
        }
    };
    let kept = read
        .find_partition(&config.markers_topic, 0)
        .is_some_and(|e| e.metadata() == PROBE);
    if !kept {
        tracing::warn!(
            group,
            "snapshots off: the broker accepts offset commits but drops their metadata, which \
             names the snapshot a restart restores; a restart replays from the oldest item in \
             flight instead"
        );
    }
    kept
}
