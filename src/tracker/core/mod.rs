//! The tracker's decisions, with no Kafka in them (no `rdkafka` import below this folder):
//! everything here is tested with plain values and an injected time.
//!
//! - [`state`]: the per-partition state: deliveries and schedules in flight, their deadlines,
//!   the commit offset.
//! - [`clock`]: partition time from marker timestamps, guarded against jumps.
//! - [`action`]: what a due delivery becomes (a copy, a dead letter, a published schedule).
//! - [`copy`]: the headers of that copy.
//! - `fence`: which markers partitions this tracker still owns, as the redelivery worker sees
//!   it.
//! - `group_hold`: holding back the copy of a record the source group will read again.
//! - `interner`: topic names as small numbers, for the state's 32-byte slots.

pub mod action;
pub mod clock;
pub mod copy;
pub(crate) mod fence;
pub(crate) mod group_hold;
pub(crate) mod interner;
pub mod state;
