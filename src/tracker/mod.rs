//! The RedeliveryTracker: consumes the markers topic and redelivers what times out.
//!
//! - [`state`]: the pure per-partition state (deadline heap, in-flight map, commit offset).
//! - [`clock`]: partition time, from marker timestamps.
//! - [`partition`]: one owned markers partition and its catch-up.
//! - [`action`] and [`copy`]: what to do with a due delivery, and the copy's headers.
//! - `consumer`, `redeliver`, `source_reader`: the threads and clients that do the I/O.
//! - `scheduled`, `published_check`: a due Schedule marker back into its record, and the
//!   check that a previous owner did not publish it already.
//! - [`inspect`]: the read-only view behind `/inspect`.
//! - [`service`]: [`Tracker`], which wires them together and stops gracefully.

pub mod action;
pub mod clock;
mod config;
mod consumer;
pub mod copy;
mod error;
mod fence;
pub mod inspect;
mod interner;
pub mod metrics;
mod outgoing;
pub mod partition;
mod published_check;
mod redeliver;
mod restorer;
mod scheduled;
pub mod service;
pub mod snapshot;
mod snapshot_store;
mod snapshotting;
mod source_reader;
pub mod state;

pub use config::TrackerConfig;
pub use error::TrackerError;
pub use metrics::Metrics;
pub use service::Tracker;
