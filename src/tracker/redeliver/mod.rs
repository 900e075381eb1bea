//! The redelivery worker: the thread that turns due deliveries into copies and Ends.
//!
//! - `worker`: one pass over the due deliveries of owned partitions: read, copy, then End.
//! - `source_reader`: reading original records back by offset, telling "gone" from "try again".
//! - `read_ahead`: a thread that reads the records falling due soon, so a pass only copies.
//! - `producers`: the few producers those records go through, one per target partition.
//! - `outgoing`: producing the tracker's records, and which broker errors are worth a retry.
//! - `scheduled`: a due Schedule marker back into the record it carries.
//! - `published_check`: after a takeover, whether the previous owner already published a
//!   schedule.

pub(crate) mod ender;
pub(crate) mod outgoing;
pub(crate) mod producers;
pub(crate) mod published_check;
pub(crate) mod read_ahead;
pub(crate) mod scheduled;
pub(crate) mod source_reader;
pub(crate) mod worker;
