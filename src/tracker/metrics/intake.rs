//! Events of the markers consumer: what it reads, and what it skips.

use rdkafka::error::KafkaError;

use super::{Emit, Metrics};
use crate::events::{Event, EventKind};
use crate::marker::{DecodeError, MarkerType, SourceRef};
use crate::tracker::core::state::Oddity;

/// A marker was read and decoded.
pub(crate) struct MarkerRead {
    pub kind: MarkerType,
}

impl Emit for MarkerRead {
    fn emit(self, m: &Metrics) {
        m.intake
            .markers
            .with_label_values(&[self.kind.name()])
            .inc();
    }
}

/// A version 2 marker named `records` records.
pub(crate) struct BatchedRecords {
    pub kind: MarkerType,
    pub records: u64,
}

impl Emit for BatchedRecords {
    fn emit(self, m: &Metrics) {
        m.intake
            .batched_records
            .with_label_values(&[self.kind.name()])
            .inc_by(self.records);
    }
}

/// A Schedule marker was read and is now tracked until it is due (the gauge
/// `redelivery_schedules_pending` counts what is held; this tells subscribers).
pub(crate) struct ScheduleTracked<'a> {
    pub id: &'a SourceRef,
}

impl Emit for ScheduleTracked<'_> {
    fn emit(self, m: &Metrics) {
        m.events
            .emit(|| Event::new(EventKind::Scheduled, self.id.clone(), 0));
    }
}

/// A markers record could not be decoded and was skipped.
pub(crate) struct MarkerUndecodable<'a> {
    pub partition: i32,
    pub offset: i64,
    pub error: &'a DecodeError,
}

impl Emit for MarkerUndecodable<'_> {
    fn emit(self, m: &Metrics) {
        let kind = self.error.kind();
        m.intake.marker_errors.with_label_values(&[kind]).inc();
        if let Some(held_back) = m.may_log(kind) {
            tracing::warn!(partition = self.partition, offset = self.offset, kind, error = %self.error, held_back, "skipping undecodable marker");
        }
    }
}

/// A markers record had no value.
pub(crate) struct Tombstone {
    pub partition: i32,
    pub offset: i64,
}

impl Emit for Tombstone {
    fn emit(self, m: &Metrics) {
        m.intake
            .marker_errors
            .with_label_values(&["tombstone"])
            .inc();
        if let Some(held_back) = m.may_log("tombstone") {
            tracing::warn!(
                partition = self.partition,
                offset = self.offset,
                held_back,
                "skipping tombstone on the markers topic"
            );
        }
    }
}

/// A marker contradicted the state (an End for nothing, a duplicate Start, ...) and was
/// skipped. Logged at debug level: a rebalance or a replay makes these by the thousand, and
/// the counter says how many.
pub(crate) struct OddMarker<'a> {
    pub partition: i32,
    pub offset: i64,
    pub oddity: Oddity,
    pub source: Option<&'a SourceRef>,
}

impl Emit for OddMarker<'_> {
    fn emit(self, m: &Metrics) {
        let source = self.source.map(ToString::to_string).unwrap_or_default();
        tracing::debug!(partition = self.partition, offset = self.offset, kind = self.oddity.name(), %source, "marker does not match the state");
        m.intake
            .odd_markers
            .with_label_values(&[self.oddity.name()])
            .inc();
    }
}

/// A marker timestamp too far ahead of partition time: it did not move the clock and the
/// marker was applied at partition time.
pub(crate) struct ClockOutlier {
    pub partition: i32,
    pub offset: i64,
    pub ahead_ms: i64,
}

impl Emit for ClockOutlier {
    fn emit(self, m: &Metrics) {
        m.intake.clock_jumps.with_label_values(&["outlier"]).inc();
        if let Some(held_back) = m.may_log("clock_outlier") {
            tracing::warn!(
                partition = self.partition,
                offset = self.offset,
                ahead_ms = self.ahead_ms,
                held_back,
                "marker timestamp far ahead of partition time (broker clock step? CreateTime?); \
                 not moving the clock"
            );
        }
    }
}

/// Marker timestamps stayed far ahead long enough to be believed: partition time jumped.
pub(crate) struct ClockMoved {
    pub partition: i32,
    pub offset: i64,
    pub from_ms: i64,
    pub to_ms: i64,
}

impl Emit for ClockMoved {
    fn emit(self, m: &Metrics) {
        m.intake.clock_jumps.with_label_values(&["moved"]).inc();
        tracing::warn!(
            partition = self.partition,
            offset = self.offset,
            from_ms = self.from_ms,
            to_ms = self.to_ms,
            "marker timestamps stayed ahead for a minute: partition time moves forward to them"
        );
    }
}

/// Consuming the markers topic returned an error.
pub(crate) struct ConsumeFailed<'a> {
    pub error: &'a KafkaError,
}

impl Emit for ConsumeFailed<'_> {
    fn emit(self, m: &Metrics) {
        m.intake.consume_errors.inc();
        if let Some(held_back) = m.may_log("consume_error") {
            tracing::warn!(error = %self.error, held_back, "error consuming the markers topic");
        }
    }
}
