//! The marker format: what the client library and the tracker write to the markers topic.
//!
//! This module does no I/O. It turns [`Marker`] values into bytes and back, and picks the
//! markers partition for a source partition. The byte layout is specified, with test vectors, in
//! `docs/markers.md`; the tests in this module check those vectors.
//!
//! The decoder is total: every byte string gives either a marker or a [`DecodeError`], never a
//! panic. An unknown version or type is an error the tracker counts and skips, which is how
//! older trackers survive markers from newer clients.

mod batch;
mod decode;
mod decode_v2;
mod encode;
mod partition;

pub use batch::{Offsets, Settle, StartBatch, MAX_BATCH_RECORDS};
pub(crate) use decode::Reader;
pub use decode::{decode, DecodeError};
pub use encode::encode;
pub(crate) use encode::put_str;
pub use partition::markers_partition;

use std::sync::Arc;

/// Format version 1: one marker per record (`docs/markers.md`). Schedules and Ticks are always
/// written in this version.
pub const VERSION: u8 = 1;

/// Format version 2: one marker per poll batch and per window of settlements of one source
/// partition ([`Marker::StartBatch`], [`Marker::Settle`]). The decoder reads both versions,
/// mixed; any other version is [`DecodeError::UnknownVersion`].
pub const VERSION_2: u8 = 2;

/// Longest reject reason kept on the wire, in bytes. Longer reasons are cut at a character
/// boundary when encoded, so a marker can never grow past what a markers topic accepts.
pub const MAX_REASON_BYTES: usize = 4096;

/// Where a record lives: its topic, partition and offset.
///
/// Markers name the record they are about by these coordinates, and the tracker keys its state
/// by them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SourceRef {
    /// Topic of the record. Shared, not owned: the client hands out every record of a poll
    /// batch with the same name, and a copy per record (an allocation, a free, and a string
    /// compare wherever records are grouped by partition) showed in the client's profile.
    pub topic: Arc<str>,
    /// Partition of the record.
    pub partition: i32,
    /// Offset of the record in its partition.
    pub offset: i64,
}

impl SourceRef {
    /// Builds a reference from its three coordinates.
    pub fn new(topic: impl Into<Arc<str>>, partition: i32, offset: i64) -> Self {
        SourceRef {
            topic: topic.into(),
            partition,
            offset,
        }
    }
}

impl std::fmt::Display for SourceRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}@{}", self.topic, self.partition, self.offset)
    }
}

/// One marker on the markers topic.
///
/// Every delivery marker names its source record. `Tick` is the tracker's own clock probe: it
/// names no record and only tells the tracker the broker's current time (see ARCHITECTURE.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// A delivery began: the record was handed to a consumer. Its deadline is the marker's
    /// timestamp plus `timeout_ms`.
    Start {
        /// The record being delivered.
        source: SourceRef,
        /// How long the consumer has before the record is redelivered, in milliseconds.
        timeout_ms: u32,
        /// Which delivery this is: 1 for the first, 2 for the first redelivery, and so on.
        attempt: u32,
    },
    /// The consumer is still working: the deadline becomes this marker's timestamp plus
    /// `timeout_ms`.
    KeepAlive {
        /// The record being delivered.
        source: SourceRef,
        /// New time allowance from this marker on, in milliseconds.
        timeout_ms: u32,
    },
    /// The delivery is settled (acked, or redelivered by the tracker): forget it.
    End {
        /// The settled record.
        source: SourceRef,
    },
    /// The consumer gives the record back: redeliver it after `delay_ms`.
    Nack {
        /// The record given back.
        source: SourceRef,
        /// How long to wait before redelivering, in milliseconds. Zero means now.
        delay_ms: u64,
    },
    /// The consumer refuses the record: send it to the dead-letter topic now.
    Reject {
        /// The refused record.
        source: SourceRef,
        /// Why, in the application's words; copied into the dead-letter headers.
        reason: String,
    },
    /// A record to deliver later. The marker is its own identity: the tracker tracks it by
    /// the marker's coordinates (markers topic, partition, offset), and an End for those
    /// coordinates settles it, whether the tracker wrote it after delivering or a producer
    /// wrote it to cancel.
    Schedule {
        /// Earliest delivery time, Unix epoch milliseconds on the broker's clock; 0 for none.
        not_before_ms: i64,
        /// Earliest delivery counted from this marker's own timestamp, in milliseconds.
        /// The record is due at the later of the two.
        delay_ms: u64,
        /// What to deliver, and where.
        record: Box<ScheduledRecord>,
    },
    /// A tracker's clock probe. `nonce` lets the tracker that wrote it recognise it.
    Tick {
        /// Random value chosen by the writing tracker.
        nonce: u64,
    },
    /// Version 2: deliveries of many records of one source partition began (one per poll batch).
    StartBatch(Box<StartBatch>),
    /// Version 2: many records of one source partition settled or kept alive.
    Settle(Box<Settle>),
}

/// The record a [`Marker::Schedule`] carries: everything needed to produce it when due.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScheduledRecord {
    /// Topic to deliver to.
    pub topic: String,
    /// Partition to deliver to; `None` lets the tracker's producer choose by key.
    pub partition: Option<i32>,
    /// Record key.
    pub key: Option<Vec<u8>>,
    /// Record value.
    pub payload: Option<Vec<u8>>,
    /// Record headers, in order.
    pub headers: crate::headers::HeaderList,
}

/// The kind of each marker. [`MarkerType::wire`] gives its version and type bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum MarkerType {
    /// [`Marker::Start`]
    Start = 0x01,
    /// [`Marker::KeepAlive`]
    KeepAlive = 0x02,
    /// [`Marker::End`]
    End = 0x03,
    /// [`Marker::Nack`]
    Nack = 0x04,
    /// [`Marker::Reject`]
    Reject = 0x05,
    /// [`Marker::Schedule`]
    Schedule = 0x06,
    /// [`Marker::Tick`]
    Tick = 0x10,
    /// [`Marker::StartBatch`] (version 2, type `0x01`)
    StartBatch = 0x81,
    /// [`Marker::Settle`] (version 2, type `0x02`)
    Settle = 0x82,
}

impl MarkerType {
    /// The type for a version and type byte, if this build knows it. `None` when the version
    /// is known but the type is not.
    pub fn from_wire(version: u8, byte: u8) -> Option<Self> {
        Some(match (version, byte) {
            (VERSION, 0x01) => MarkerType::Start,
            (VERSION, 0x02) => MarkerType::KeepAlive,
            (VERSION, 0x03) => MarkerType::End,
            (VERSION, 0x04) => MarkerType::Nack,
            (VERSION, 0x05) => MarkerType::Reject,
            (VERSION, 0x06) => MarkerType::Schedule,
            (VERSION, 0x10) => MarkerType::Tick,
            (VERSION_2, 0x01) => MarkerType::StartBatch,
            (VERSION_2, 0x02) => MarkerType::Settle,
            _ => return None,
        })
    }

    /// The version and type bytes that begin a marker of this kind.
    pub fn wire(self) -> (u8, u8) {
        match self {
            MarkerType::StartBatch => (VERSION_2, 0x01),
            MarkerType::Settle => (VERSION_2, 0x02),
            v1 => (VERSION, v1 as u8),
        }
    }

    /// Lower-case name, used as a metric label and in logs.
    pub fn name(self) -> &'static str {
        match self {
            MarkerType::Start => "start",
            MarkerType::KeepAlive => "keep_alive",
            MarkerType::End => "end",
            MarkerType::Nack => "nack",
            MarkerType::Reject => "reject",
            MarkerType::Schedule => "schedule",
            MarkerType::Tick => "tick",
            MarkerType::StartBatch => "start_batch",
            MarkerType::Settle => "settle",
        }
    }
}

impl Marker {
    /// The wire type of this marker.
    pub fn marker_type(&self) -> MarkerType {
        match self {
            Marker::Start { .. } => MarkerType::Start,
            Marker::KeepAlive { .. } => MarkerType::KeepAlive,
            Marker::End { .. } => MarkerType::End,
            Marker::Nack { .. } => MarkerType::Nack,
            Marker::Reject { .. } => MarkerType::Reject,
            Marker::Schedule { .. } => MarkerType::Schedule,
            Marker::Tick { .. } => MarkerType::Tick,
            Marker::StartBatch(_) => MarkerType::StartBatch,
            Marker::Settle(_) => MarkerType::Settle,
        }
    }

    /// The record this marker is about; `None` for a `Tick`, for a `Schedule`, which is
    /// about itself, and for the version 2 markers, which are about many records (see
    /// [`Marker::source_partition`]).
    pub fn source(&self) -> Option<&SourceRef> {
        match self {
            Marker::Start { source, .. }
            | Marker::KeepAlive { source, .. }
            | Marker::End { source }
            | Marker::Nack { source, .. }
            | Marker::Reject { source, .. } => Some(source),
            Marker::Schedule { .. }
            | Marker::Tick { .. }
            | Marker::StartBatch(_)
            | Marker::Settle(_) => None,
        }
    }

    /// The source (topic, partition) this marker is about, whichever its version; `None` for
    /// a `Tick` and a `Schedule`. This is what picks its markers partition.
    pub fn source_partition(&self) -> Option<(&str, i32)> {
        match self {
            Marker::StartBatch(b) => Some((&b.topic, b.partition)),
            Marker::Settle(s) => Some((&s.topic, s.partition)),
            other => other.source().map(|s| (&*s.topic, s.partition)),
        }
    }
}

/// Converts a duration to whole milliseconds for a `u32` wire field, saturating at about 49
/// days rather than wrapping.
pub fn duration_to_ms_u32(d: std::time::Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

#[cfg(test)]
mod tests;
