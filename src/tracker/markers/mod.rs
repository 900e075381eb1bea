//! The markers consumer: the thread that owns the markers partitions.
//!
//! - `consumer`: the poll loop (apply markers, wake at the next deadline, dispatch due
//!   deliveries to the redelivery worker, commit) and its context, where librdkafka's
//!   rebalance callbacks land (grant and fence off partitions, ask for their snapshots).
//! - [`partition`]: one owned markers partition: its state, clock, catch-up (the Tick) and
//!   snapshot progress.
//! - `group_offsets`: the source group's committed offsets, fetched off the loop, for
//!   holding back copies the group makes unnecessary (`--source-group`).
//! - `restart`: resuming and re-seeking a replaying partition that reads nothing.
//! - `refusal`: Kafka refusing the tracker its group or the markers topic, which ends a
//!   tracker that was never ready (exit 77 from `run`).

pub(crate) mod consumer;
pub(crate) mod group_offsets;
pub mod partition;
mod plan;
mod refusal;
mod restart;
