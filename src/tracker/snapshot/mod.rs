//! Bounded replay: snapshots of a partition's state, so a restart need not replay from the
//! oldest item in flight (ARCHITECTURE.md, "Bounded replay").
//!
//! - [`format`](mod@format): a state as chunks of bytes, with a total decoder.
//! - `store`: where chunks live (the compacted snapshots topic) and the pointer in the
//!   committed markers offset's metadata.
//! - `policy`: when the markers thread takes a snapshot, and what restoring one means.
//! - `restorer`: the thread that reads a newly assigned partition's snapshot.

pub mod format;
pub(crate) mod metadata_check;
pub(crate) mod policy;
pub(crate) mod restorer;
pub(crate) mod store;
