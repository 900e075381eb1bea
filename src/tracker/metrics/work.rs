//! Events of the redelivery worker: copies, dead letters, and what goes wrong on the way.

use std::fmt::Display;
use std::time::Duration;

use super::{Emit, Metrics};
use crate::events::{Event, EventKind};
use crate::marker::SourceRef;
use crate::tracker::core::action::DlqReason;
use crate::tracker::core::group_hold::{AfterHold, CopiedAfterHold};

/// A copy reached its source topic.
pub(crate) struct Redelivered<'a> {
    pub source: &'a SourceRef,
    pub cause: &'a str,
    pub attempt: u32,
}

impl Emit for Redelivered<'_> {
    fn emit(self, m: &Metrics) {
        let Redelivered {
            source,
            cause,
            attempt,
        } = self;
        tracing::debug!(%source, cause, attempt, "redelivered");
        m.work
            .redelivered
            .with_label_values(&[&source.topic, cause])
            .inc();
        m.events
            .emit(|| Event::new(EventKind::Retried, source.clone(), attempt).detail(cause));
    }
}

/// Due deliveries held back for the source group (`--source-group`): `held` for the first
/// time, since the group had not committed past their records; `copied_after_hold` copied
/// after all, counted by why (the wait ran out, no answer about the group's offset, no offset
/// left, or handed out after all).
pub(crate) struct HeldForGroup {
    pub held: u64,
    pub copied_after_hold: CopiedAfterHold,
}

impl Emit for HeldForGroup {
    fn emit(self, m: &Metrics) {
        let HeldForGroup {
            held,
            copied_after_hold: copied,
        } = self;
        if copied.total() > 0 {
            // Rare (a group that did not come back in time), and worth a line each pass.
            tracing::info!(
                waited = copied.get(AfterHold::Waited),
                no_answer = copied.get(AfterHold::NoAnswer),
                no_offset = copied.get(AfterHold::NoOffset),
                handed_out = copied.get(AfterHold::HandedOut),
                "copies made after holding them for the source group"
            );
        }
        tracing::debug!(held, "held back for the source group");
        let holds = &m.work.group_holds;
        holds.with_label_values(&["held"]).inc_by(held);
        for why in AfterHold::ALL {
            holds
                .with_label_values(&[why.outcome()])
                .inc_by(copied.get(why));
        }
    }
}

/// A copy reached a dead-letter topic.
pub(crate) struct DeadLettered<'a> {
    pub source: &'a SourceRef,
    pub attempt: u32,
    pub dlq: &'a str,
    pub reason: DlqReason,
    pub detail: &'a str,
}

impl Emit for DeadLettered<'_> {
    fn emit(self, m: &Metrics) {
        let DeadLettered {
            source,
            attempt,
            dlq,
            reason,
            detail,
        } = self;
        tracing::info!(%source, dlq, reason = reason.name(), detail, "dead-lettered");
        m.work
            .dead_lettered
            .with_label_values(&[&source.topic, reason.name()])
            .inc();
        m.events.emit(|| {
            Event::new(EventKind::DeadLettered, source.clone(), attempt)
                .detail(format!("{}: {detail}", reason.name()))
        });
    }
}

/// How late a copy was made durable after its deadline, in partition time.
pub(crate) struct DeadlineLag {
    pub seconds: f64,
}

impl Emit for DeadlineLag {
    fn emit(self, m: &Metrics) {
        m.work.deadline_lag.observe(self.seconds.max(0.0));
    }
}

/// The worker dropped `n` due deliveries (`stage`: queued, read or parked) because their
/// markers partition was revoked; its new owner redelivers them.
pub(crate) struct Fenced {
    pub n: usize,
    pub stage: &'static str,
}

impl Emit for Fenced {
    fn emit(self, m: &Metrics) {
        m.work
            .fenced
            .with_label_values(&[self.stage])
            .inc_by(u64::try_from(self.n).unwrap_or(u64::MAX));
        tracing::info!(
            n = self.n,
            stage = self.stage,
            "work of a revoked markers partition dropped; its new owner takes it"
        );
    }
}

/// Source records read ahead of their deadline (see `redeliver/read_ahead.rs`), by outcome.
pub(crate) struct ReadAhead {
    pub n: usize,
    pub outcome: &'static str,
}

impl Emit for ReadAhead {
    fn emit(self, m: &Metrics) {
        if self.n > 0 {
            m.work
                .read_ahead
                .with_label_values(&[self.outcome])
                .inc_by(u64::try_from(self.n).unwrap_or(u64::MAX));
        }
    }
}

/// Reading a source record back failed in a way that may pass (a broker away fails every
/// read); retried.
pub(crate) struct SourceReadFailed<'a> {
    pub source: &'a SourceRef,
    pub error: &'a dyn Display,
}

impl Emit for SourceReadFailed<'_> {
    fn emit(self, m: &Metrics) {
        if let Some(held_back) = m.may_log("source_read_error") {
            tracing::warn!(source = %self.source, error = %self.error, held_back, "could not read the source record; will retry");
        }
        m.work
            .source_read_errors
            .with_label_values(&[&self.source.topic])
            .inc();
    }
}

/// A produce failed and will be retried.
pub(crate) struct ProduceFailed<'a> {
    pub what: &'a str,
    pub target: &'a str,
    pub error: &'a dyn Display,
}

impl Emit for ProduceFailed<'_> {
    fn emit(self, m: &Metrics) {
        if let Some(held_back) = m.may_log("produce_error") {
            tracing::warn!(what = self.what, target = self.target, error = %self.error, held_back, "produce failed; will retry");
        }
        m.work.produce_errors.with_label_values(&[self.what]).inc();
    }
}

/// The broker refused a record for good; the caller sends it elsewhere or parks it.
pub(crate) struct ProduceRefused<'a> {
    pub what: &'a str,
    pub target: &'a str,
    pub error: &'a dyn Display,
}

impl Emit for ProduceRefused<'_> {
    fn emit(self, m: &Metrics) {
        tracing::error!(what = self.what, target = self.target, error = %self.error, "the broker refused the record; it will not be retried as is");
        m.work.produce_errors.with_label_values(&[self.what]).inc();
    }
}

/// A due delivery could be placed nowhere (the source and the dead-letter topic refused its
/// copy); it stays in flight and is tried again later.
pub(crate) struct DeliveryParked<'a> {
    pub source: &'a SourceRef,
    pub why: &'a str,
    pub retry_in: Duration,
}

impl Emit for DeliveryParked<'_> {
    fn emit(self, m: &Metrics) {
        tracing::error!(
            topic = %self.source.topic,
            partition = self.source.partition,
            offset = self.source.offset,
            why = self.why,
            retry_in = ?self.retry_in,
            "delivery parked: its copy was refused by the source and the dead-letter topic; it stays in flight"
        );
        m.work.parks.inc();
    }
}
