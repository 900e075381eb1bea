//! The RedeliveryTracker: consumes the markers topic and redelivers what times out.
//!
//! Grouped by concern:
//! - `core`: the decisions, with no Kafka in them: the per-partition `state` (deadline
//!   heap, in-flight map, commit offset; public with the `fuzzing` feature), the partition
//!   `clock`, what to do with a due delivery (`action`) and its copy's headers (`copy`), and
//!   the ownership fence between the two threads.
//! - `markers`: the markers consumer thread (poll, apply, wake at the next deadline,
//!   dispatch, commit, rebalance callbacks) and one owned markers `partition` with its
//!   catch-up.
//! - `redeliver`: the redelivery worker thread: reading originals back, producing copies and
//!   Ends, scheduled records, the after-takeover published check.
//! - `snapshot`: bounded replay: the snapshot format, where it is stored, when it is taken,
//!   and the restore thread.
//! - [`inspect`]: the read-only view behind `/inspect`; [`metrics`]: every metric, and one
//!   event type per thing the tracker reports (it logs and counts).
//! - [`service`]: [`Tracker`], which wires them together and stops gracefully; `memory`
//!   gives a replay's freed memory back to the system once it is over.

pub(crate) mod core;
pub(crate) mod markers;
pub(crate) mod redeliver;
pub(crate) mod snapshot;

mod config;
mod error;
pub mod inspect;
pub(crate) mod memory;
pub mod metrics;
mod readiness;
pub mod service;

// Internals stay inside the crate; the state alone is public with the `fuzzing` feature,
// for the benchmarks and fuzz targets that drive it directly.
#[cfg(feature = "fuzzing")]
pub use self::core::state;

pub use config::TrackerConfig;
pub use error::TrackerError;
pub use metrics::Metrics;
pub use readiness::Readiness;
pub use service::Tracker;
