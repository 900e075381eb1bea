//! The tracker's Prometheus metrics, and the events that move them.
//!
//! Each thing the tracker reports is one event type (in `intake`, `work`, `progress` and
//! `problem`) whose `Emit::emit` both logs it, with structured fields, and counts it, so a log
//! line and its counter can never disagree; an event that can repeat per record logs at most
//! once per kind per 10 s and says how many lines it held back, but always counts. Call sites
//! say `metrics.emit(SomeEvent { .. })`. Labels are partitions, topics and kinds, never keys or
//! offsets, so series stay few.
//!
//! What the tracker *holds* (sizes, readiness) are gauges, set by the methods on [`Metrics`].

use std::time::Instant;

use prometheus::Registry;

use crate::events::EventBus;
use crate::marker::DecodeError;
use crate::tracker::core::state::Oddity;

mod families;
pub(crate) mod intake;
pub(crate) mod problem;
pub(crate) mod progress;
pub(crate) mod work;

use families::{Gauges, Intake, Progress, Work};
pub(crate) use problem::Problem;

/// Something the tracker reports: one place that logs it and counts it.
pub(crate) trait Emit {
    /// Logs and counts the event.
    fn emit(self, metrics: &Metrics);
}

/// All tracker metrics, registered in their own [`Registry`], in four groups by what they
/// describe.
#[derive(Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Where the same events are announced to in-process subscribers.
    pub events: EventBus,
    /// Per-record problems are logged once per kind per interval.
    log_limit: std::sync::Arc<crate::log_limit::LogLimit>,
    intake: Intake,
    work: Work,
    gauges: Gauges,
    progress: Progress,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let registry = Registry::new();
        let metrics = Metrics {
            intake: Intake::new(&registry),
            work: Work::new(&registry),
            gauges: Gauges::new(&registry),
            progress: Progress::new(&registry),
            registry,
            events: EventBus::default(),
            log_limit: Default::default(),
        };
        metrics.init_known_labels();
        metrics
    }

    /// Reports `event`: logs it and counts it.
    pub(crate) fn emit(&self, event: impl Emit) {
        event.emit(self);
    }

    /// Whether a per-record event of `kind` may log now; `Some(n)` with the number of lines
    /// held back since the last one.
    fn may_log(&self, kind: &'static str) -> Option<u64> {
        self.log_limit.allow(kind, Instant::now())
    }

    /// Creates every series whose labels are known up front at zero, so dashboards and alerts
    /// see a 0 instead of no data before the first event.
    fn init_known_labels(&self) {
        for kind in DecodeError::KINDS.iter().chain(&["tombstone"]) {
            self.intake.marker_errors.with_label_values(&[kind]);
        }
        for kind in Oddity::ALL {
            self.intake.odd_markers.with_label_values(&[kind.name()]);
        }
        for what in ["copy", "dead_letter", "scheduled", "end", "tick"] {
            self.work.produce_errors.with_label_values(&[what]);
        }
        for kind in Problem::KINDS {
            self.work.problems.with_label_values(&[kind]);
        }
    }

    /// Renders the Prometheus text format.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let encoder = prometheus::TextEncoder::new();
        if let Err(e) = encoder.encode_utf8(&self.registry.gather(), &mut out) {
            tracing::error!(error = %e, "could not render metrics");
        }
        out
    }

    /// Sets the number of parked deliveries.
    pub(crate) fn parked(&self, n: usize) {
        self.work.parked.set(gauge_value(n));
    }

    /// Publishes the size of one partition's state.
    pub(crate) fn partition_gauges(
        &self,
        partition: i32,
        in_flight: usize,
        scheduled: usize,
        oldest_age_ms: i64,
        ready: bool,
    ) {
        let p = [partition.to_string()];
        let g = &self.gauges;
        g.scheduled
            .with_label_values(&p)
            .set(gauge_value(scheduled));
        g.in_flight
            .with_label_values(&p)
            .set(gauge_value(in_flight));
        g.oldest_age.with_label_values(&p).set(oldest_age_ms / 1000);
        g.partition_ready
            .with_label_values(&p)
            .set(i64::from(ready));
    }

    /// Publishes the markers lag of one partition.
    pub(crate) fn markers_lag(&self, partition: i32, lag: i64) {
        self.gauges
            .markers_lag
            .with_label_values(&[&partition.to_string()])
            .set(lag);
    }

    /// Drops the series of a partition this tracker no longer owns.
    pub(crate) fn forget_partition(&self, partition: i32) {
        let p = [partition.to_string()];
        let g = &self.gauges;
        for family in [
            &g.in_flight,
            &g.scheduled,
            &g.oldest_age,
            &g.partition_ready,
            &g.markers_lag,
        ] {
            let _ = family.remove_label_values(&p);
        }
    }

    /// Publishes overall readiness and the number of assigned partitions.
    pub(crate) fn readiness(&self, ready: bool, assigned: usize) {
        self.gauges.ready.set(i64::from(ready));
        self.gauges.assigned.set(gauge_value(assigned));
    }
}

fn gauge_value(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests;
