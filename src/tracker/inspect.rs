//! A read-only view of what the tracker holds, refreshed every commit interval, for the admin
//! endpoint `/inspect` and the `redelivery-tracker inspect` command.

use std::sync::{Arc, Mutex};

use serde::{Deserialize, Serialize};

/// One owned markers partition, as `inspect` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionView {
    /// Markers partition number.
    pub partition: i32,
    /// Whether replay has finished.
    pub ready: bool,
    /// The committed offset relies on a snapshot that could not be read yet: the partition
    /// is paused, and retried, rather than replayed without it. `#[serde(default)]`: older
    /// trackers omit it.
    #[serde(default)]
    pub waiting_for_snapshot: bool,
    /// Deliveries in flight.
    pub in_flight: usize,
    /// Schedules waiting for their due time. `#[serde(default)]`: older trackers omit it.
    #[serde(default)]
    pub scheduled: usize,
    /// The oldest delivery or schedule in flight, as `topic/partition@offset`: the one holding the markers
    /// commit back.
    pub oldest: Option<String>,
    /// Age of the oldest delivery in flight, in milliseconds (to within a second).
    pub oldest_age_ms: i64,
    /// How far in the future the next few deadlines are, in milliseconds (negative: overdue).
    pub next_deadlines_in_ms: Vec<i64>,
    /// Deliveries handed to the redelivery worker since this tracker took the partition.
    pub redeliveries: u64,
    /// The markers offset this tracker last committed, if any.
    pub committed_offset: Option<i64>,
}

/// What `/inspect` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TrackerView {
    /// Every assigned partition has caught up.
    pub ready: bool,
    /// The partitions this tracker owns, by number.
    pub partitions: Vec<PartitionView>,
}

/// Shared between the consumer thread, which writes it, and the admin server, which reads it.
pub type SharedView = Arc<Mutex<TrackerView>>;
