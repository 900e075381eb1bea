//! The tracker's Prometheus metrics, and the events that move them.
//!
//! Each notable event is one method here that both logs (with structured fields) and counts, so
//! a log line and its counter can never disagree. Labels are partitions, topics and kinds, never
//! keys or offsets, so series stay few.
//!
//! Metric definitions are static: creating or registering one can only fail on a programming
//! error (a bad name, a duplicate), which the unit tests would hit, so `expect` is used for them.
#![allow(clippy::expect_used)]

use std::time::Instant;

use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

use crate::events::{Event, EventBus, EventKind};
use crate::marker::{DecodeError, MarkerType, SourceRef};

use crate::tracker::core::action::DlqReason;
use crate::tracker::core::state::Oddity;

/// All tracker metrics, registered in their own [`Registry`].
#[derive(Clone)]
pub struct Metrics {
    /// The registry `/metrics` renders.
    pub registry: Registry,
    /// Where the same events are announced to in-process subscribers.
    pub events: EventBus,
    /// Per-record problems are logged once per kind per interval.
    log_limit: std::sync::Arc<crate::log_limit::LogLimit>,
    markers: IntCounterVec,
    batched_records: IntCounterVec,
    marker_errors: IntCounterVec,
    odd_markers: IntCounterVec,
    clock_jumps: IntCounterVec,
    fenced: IntCounterVec,
    in_flight: IntGaugeVec,
    oldest_age: IntGaugeVec,
    partition_ready: IntGaugeVec,
    markers_lag: IntGaugeVec,
    ready: IntGauge,
    assigned: IntGauge,
    redelivered: IntCounterVec,
    dead_lettered: IntCounterVec,
    deadline_lag: Histogram,
    commits: IntCounter,
    commit_failures: IntCounter,
    source_read_errors: IntCounterVec,
    produce_errors: IntCounterVec,
    consume_errors: IntCounter,
    parked: IntGauge,
    scheduled: IntGaugeVec,
    published: IntCounterVec,
    cancelled: IntCounter,
    already_published: IntCounter,
    snapshots: IntCounter,
    snapshot_failures: IntCounter,
    problems: IntCounterVec,
}

/// Problems that have no counter of their own, by the `kind` label of
/// `redelivery_problems_total`: each is logged where it happens and counted here, so an alert
/// can see what a log line says.
pub const PROBLEMS: [&str; 9] = [
    "pass_outlived_revocation",
    "pause_failed",
    "resume_failed",
    "restore_thread_gone",
    "rebalance_error",
    "read_before_restore",
    "rewind_failed",
    "worker_gone",
    "published_check_failed",
];

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric name");
    c
}

fn gauge(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(g.clone()))
        .expect("unique metric name");
    g
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let r = Registry::new();
        let single = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("static metric definition");
            r.register(Box::new(g.clone())).expect("unique metric name");
            g
        };
        let ready = single(
            "redelivery_ready",
            "1 when every assigned partition has caught up",
        );
        let assigned = single(
            "redelivery_assigned_partitions",
            "Markers partitions assigned to this tracker",
        );
        let single_counter = |name: &str, help: &str| {
            let c = IntCounter::new(name, help).expect("static metric definition");
            r.register(Box::new(c.clone())).expect("unique metric name");
            c
        };
        let parked = single(
            "redelivery_parked_deliveries",
            "Due deliveries whose copy every target refused for good; kept in flight and retried",
        );
        let cancelled = single_counter(
            "redelivery_schedules_cancelled_total",
            "Schedules cancelled (an End read before they were due)",
        );
        let already_published = single_counter(
            "redelivery_schedules_already_published_total",
            "Due schedules found already published by a previous owner after a takeover, and not published again",
        );
        let snapshots = single_counter(
            "redelivery_snapshots_total",
            "Partition snapshots written and made durable",
        );
        let snapshot_failures = single_counter(
            "redelivery_snapshot_failures_total",
            "Snapshots not written, or not restored on assignment (retried)",
        );
        let commits = single_counter(
            "redelivery_commits_total",
            "Markers offset commits that succeeded",
        );
        let commit_failures = single_counter(
            "redelivery_commit_failures_total",
            "Markers offset commits that failed (retried on the next interval)",
        );
        let consume_errors = single_counter(
            "redelivery_consume_errors_total",
            "Errors returned while consuming the markers topic",
        );
        let deadline_lag = Histogram::with_opts(
            HistogramOpts::new(
                "redelivery_deadline_lag_seconds",
                "Time from a delivery's deadline to its copy being durable, in partition time",
            )
            .buckets(vec![
                0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
                60.0,
            ]),
        )
        .expect("static metric definition");
        r.register(Box::new(deadline_lag.clone()))
            .expect("unique metric name");
        let metrics = Metrics {
            markers: counter(
                &r,
                "redelivery_markers_total",
                "Markers read, by type",
                &["type"],
            ),
            batched_records: counter(
                &r,
                "redelivery_batched_records_total",
                "Records named by version 2 markers (batch Starts and Settles), by marker type",
                &["type"],
            ),
            marker_errors: counter(
                &r,
                "redelivery_marker_errors_total",
                "Markers records skipped because they could not be decoded, by kind",
                &["kind"],
            ),
            odd_markers: counter(
                &r,
                "redelivery_odd_markers_total",
                "Markers skipped because they contradict the state, by kind",
                &["kind"],
            ),
            in_flight: gauge(
                &r,
                "redelivery_in_flight",
                "Deliveries in flight",
                &["partition"],
            ),
            oldest_age: gauge(
                &r,
                "redelivery_oldest_in_flight_age_seconds",
                "Age of the oldest delivery in flight",
                &["partition"],
            ),
            partition_ready: gauge(
                &r,
                "redelivery_partition_ready",
                "1 once the partition's state has been rebuilt by replay",
                &["partition"],
            ),
            markers_lag: gauge(
                &r,
                "redelivery_markers_lag",
                "Markers written but not yet read by this tracker (from librdkafka statistics)",
                &["partition"],
            ),
            redelivered: counter(
                &r,
                "redelivery_redelivered_total",
                "Copies produced to their source topic, by cause (timeout, nacked)",
                &["topic", "cause"],
            ),
            dead_lettered: counter(
                &r,
                "redelivery_dead_lettered_total",
                "Copies produced to a dead-letter topic, by reason",
                &["topic", "reason"],
            ),
            source_read_errors: counter(
                &r,
                "redelivery_source_read_errors_total",
                "Transient failures reading a source record back (retried)",
                &["topic"],
            ),
            produce_errors: counter(
                &r,
                "redelivery_produce_errors_total",
                "Failed produce attempts, by what was produced (copy, dead_letter, scheduled, end, tick)",
                &["what"],
            ),
            scheduled: gauge(
                &r,
                "redelivery_schedules_pending",
                "Schedules waiting for their due time",
                &["partition"],
            ),
            clock_jumps: counter(
                &r,
                "redelivery_clock_jumps_total",
                "Marker timestamps far ahead of partition time: kind=outlier (ignored, the marker \
                 applied at partition time) or moved (believed after a minute of them)",
                &["kind"],
            ),
            fenced: counter(
                &r,
                "redelivery_fenced_deliveries_total",
                "Due deliveries the redelivery worker dropped because their markers partition was \
                 revoked (stage=queued, read or parked); the new owner redelivers them",
                &["stage"],
            ),
            published: counter(
                &r,
                "redelivery_schedules_published_total",
                "Scheduled records produced to their target topic",
                &["topic"],
            ),
            problems: counter(
                &r,
                "redelivery_problems_total",
                "Problems logged that have no counter of their own, by kind (see PROBLEMS in \
                 src/tracker/metrics.rs)",
                &["kind"],
            ),
            registry: r,
            events: EventBus::default(),
            log_limit: Default::default(),
            cancelled,
            already_published,
            snapshots,
            snapshot_failures,
            ready,
            assigned,
            deadline_lag,
            commits,
            commit_failures,
            consume_errors,
            parked,
        };
        metrics.init_known_labels();
        metrics
    }

    /// Creates every series whose labels are known up front at zero, so dashboards and alerts
    /// see a 0 instead of no data before the first event.
    fn init_known_labels(&self) {
        for kind in crate::marker::DecodeError::KINDS
            .iter()
            .chain(&["tombstone"])
        {
            self.marker_errors.with_label_values(&[kind]);
        }
        for kind in Oddity::ALL {
            self.odd_markers.with_label_values(&[kind.name()]);
        }
        for what in ["copy", "dead_letter", "scheduled", "end", "tick"] {
            self.produce_errors.with_label_values(&[what]);
        }
        for kind in PROBLEMS {
            self.problems.with_label_values(&[kind]);
        }
    }

    /// Counts a problem whose log line the caller writes (`kind`: one of [`PROBLEMS`]).
    pub fn problem(&self, kind: &'static str) {
        debug_assert!(PROBLEMS.contains(&kind), "unknown problem kind {kind}");
        self.problems.with_label_values(&[kind]).inc();
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

    /// A marker was read and decoded.
    pub fn marker(&self, kind: MarkerType) {
        self.markers.with_label_values(&[kind.name()]).inc();
    }

    /// A version 2 marker named `records` records.
    pub fn batched_records(&self, kind: MarkerType, records: u64) {
        self.batched_records
            .with_label_values(&[kind.name()])
            .inc_by(records);
    }

    /// A Schedule marker was read and is now tracked until it is due.
    pub fn scheduled(&self, id: &SourceRef) {
        self.events
            .emit(|| Event::new(EventKind::Scheduled, id.clone(), 0));
    }

    /// A markers record could not be decoded and was skipped. Logged at most once per kind
    /// per 10 s (with the number held back), always counted.
    pub fn marker_error(&self, partition: i32, offset: i64, error: &DecodeError) {
        self.marker_errors.with_label_values(&[error.kind()]).inc();
        if let Some(held_back) = self.log_limit.allow(error.kind(), Instant::now()) {
            tracing::warn!(partition, offset, kind = error.kind(), %error, held_back, "skipping undecodable marker");
        }
    }

    /// A markers record had no value. Logged at most once per 10 s, always counted.
    pub fn tombstone(&self, partition: i32, offset: i64) {
        self.marker_errors.with_label_values(&["tombstone"]).inc();
        if let Some(held_back) = self.log_limit.allow("tombstone", Instant::now()) {
            tracing::warn!(
                partition,
                offset,
                held_back,
                "skipping tombstone on the markers topic"
            );
        }
    }

    /// A marker contradicted the state and was skipped.
    pub fn odd_marker(
        &self,
        partition: i32,
        offset: i64,
        oddity: Oddity,
        source: Option<&SourceRef>,
    ) {
        let source = source.map(ToString::to_string).unwrap_or_default();
        tracing::debug!(partition, offset, kind = oddity.name(), %source, "marker does not match the state");
        self.odd_markers.with_label_values(&[oddity.name()]).inc();
    }

    /// A marker timestamp too far ahead of partition time: it did not move the clock and the
    /// marker was applied at partition time. Logged at most once per 10 s, always counted.
    pub fn clock_outlier(&self, partition: i32, offset: i64, ahead_ms: i64) {
        self.clock_jumps.with_label_values(&["outlier"]).inc();
        if let Some(held_back) = self.log_limit.allow("clock_outlier", Instant::now()) {
            tracing::warn!(
                partition,
                offset,
                ahead_ms,
                held_back,
                "marker timestamp far ahead of partition time (broker clock step? CreateTime?); \
                 not moving the clock"
            );
        }
    }

    /// Marker timestamps stayed far ahead long enough to be believed: partition time jumped.
    pub fn clock_moved(&self, partition: i32, offset: i64, from_ms: i64, to_ms: i64) {
        self.clock_jumps.with_label_values(&["moved"]).inc();
        tracing::warn!(
            partition,
            offset,
            from_ms,
            to_ms,
            "marker timestamps stayed ahead for a minute: partition time moves forward to them"
        );
    }

    /// The redelivery worker dropped `n` due deliveries (`stage`: queued, read or parked)
    /// because their markers partition was revoked; its new owner redelivers them.
    pub fn fenced(&self, n: usize, stage: &'static str) {
        self.fenced
            .with_label_values(&[stage])
            .inc_by(u64::try_from(n).unwrap_or(u64::MAX));
        tracing::info!(
            n,
            stage,
            "work of a revoked markers partition dropped; its new owner takes it"
        );
    }

    /// Consuming the markers topic returned an error. Logged at most once per 10 s.
    pub fn consume_error(&self, error: &rdkafka::error::KafkaError) {
        self.consume_errors.inc();
        if let Some(held_back) = self.log_limit.allow("consume_error", Instant::now()) {
            tracing::warn!(%error, held_back, "error consuming the markers topic");
        }
    }

    /// A copy reached its source topic.
    pub fn redelivered(&self, source: &SourceRef, cause: &str, attempt: u32) {
        tracing::debug!(%source, cause, attempt, "redelivered");
        self.redelivered
            .with_label_values(&[&source.topic, cause])
            .inc();
        self.events
            .emit(|| Event::new(EventKind::Retried, source.clone(), attempt).detail(cause));
    }

    /// A copy reached a dead-letter topic.
    pub fn dead_lettered(
        &self,
        source: &SourceRef,
        attempt: u32,
        dlq: &str,
        reason: DlqReason,
        detail: &str,
    ) {
        tracing::info!(%source, dlq, reason = reason.name(), detail, "dead-lettered");
        self.dead_lettered
            .with_label_values(&[&source.topic, reason.name()])
            .inc();
        self.events.emit(|| {
            Event::new(EventKind::DeadLettered, source.clone(), attempt)
                .detail(format!("{}: {detail}", reason.name()))
        });
    }

    /// A due schedule's record reached its target topic.
    pub fn published(&self, id: &SourceRef, target: &str) {
        tracing::debug!(schedule = %id, target, "scheduled record published");
        self.published.with_label_values(&[target]).inc();
        self.events
            .emit(|| Event::new(EventKind::Ready, id.clone(), 0).detail(target));
    }

    /// A due schedule was found already published by the partition's previous owner.
    pub fn already_published(&self, id: &SourceRef, target: &str) {
        tracing::info!(schedule = %id, target, "already published by the previous owner; not publishing again");
        self.already_published.inc();
    }

    /// Whether a previous owner published some schedules could not be checked.
    pub fn published_check_failed(&self, target: &str, schedules: usize, why: &str) {
        self.problem("published_check_failed");
        tracing::warn!(
            target,
            schedules,
            why,
            "cannot tell whether the previous owner already published these schedules; publishing them (a duplicate is possible)"
        );
    }

    /// A snapshot could not be written; the partition keeps its older one (or none).
    pub fn snapshot_failed(&self, partition: i32, why: &str) {
        tracing::warn!(partition, why, "snapshot not written; will try again later");
        self.snapshot_failures.inc();
    }

    /// A snapshot is durable; the next commit names it.
    pub fn snapshot_written(&self, partition: i32, covers: i64, took: std::time::Duration) {
        tracing::info!(partition, covers, took = ?took, "snapshot written");
        self.snapshots.inc();
    }

    /// A partition could not be restored from its snapshot yet; it stays paused.
    pub fn restore_failed(&self, partition: i32, why: &str) {
        tracing::error!(
            partition,
            why,
            "cannot restore the partition's snapshot; it stays paused and unready, retrying"
        );
        self.snapshot_failures.inc();
    }

    /// A schedule was cancelled before it was due.
    pub fn cancelled(&self, id: &SourceRef) {
        tracing::debug!(schedule = %id, "schedule cancelled");
        self.cancelled.inc();
        self.events
            .emit(|| Event::new(EventKind::Cancelled, id.clone(), 0));
    }

    /// How late, in seconds, a copy was made durable after its deadline.
    pub fn deadline_lag(&self, seconds: f64) {
        self.deadline_lag.observe(seconds.max(0.0));
    }

    /// Reading a source record failed in a way that may pass.
    /// Logged at most once per 10 s (a broker away fails every read), always counted.
    pub fn source_read_error(&self, source: &SourceRef, error: &dyn std::fmt::Display) {
        if let Some(held_back) = self.log_limit.allow("source_read_error", Instant::now()) {
            tracing::warn!(%source, %error, held_back, "could not read the source record; will retry");
        }
        self.source_read_errors
            .with_label_values(&[&source.topic])
            .inc();
    }

    /// A produce failed and will be retried. Logged at most once per 10 s, always counted.
    pub fn produce_error(&self, what: &str, target: &str, error: &dyn std::fmt::Display) {
        if let Some(held_back) = self.log_limit.allow("produce_error", Instant::now()) {
            tracing::warn!(what, target, %error, held_back, "produce failed; will retry");
        }
        self.produce_errors.with_label_values(&[what]).inc();
    }

    /// The broker refused a record for good; the caller sends it elsewhere or parks it.
    pub fn produce_refused(&self, what: &str, target: &str, error: &dyn std::fmt::Display) {
        tracing::error!(what, target, %error, "the broker refused the record; it will not be retried as is");
        self.produce_errors.with_label_values(&[what]).inc();
    }

    /// A due delivery could be placed nowhere; it stays in flight and is tried again later.
    pub fn parked_delivery(&self, source: &SourceRef, why: &str, retry_in: std::time::Duration) {
        tracing::error!(
            topic = %source.topic,
            partition = source.partition,
            offset = source.offset,
            why,
            retry_in = ?retry_in,
            "delivery parked: its copy was refused by the source and the dead-letter topic; it stays in flight"
        );
    }

    /// Sets the number of parked deliveries.
    pub fn parked(&self, n: usize) {
        self.parked.set(n as i64);
    }

    /// A commit of markers offsets finished.
    pub fn commit(&self, result: &Result<(), rdkafka::error::KafkaError>) {
        match result {
            Ok(()) => self.commits.inc(),
            Err(error) => {
                tracing::warn!(%error, "committing markers offsets failed");
                self.commit_failures.inc();
            }
        }
    }

    /// Publishes the size of one partition's state.
    pub fn partition_gauges(
        &self,
        partition: i32,
        in_flight: usize,
        scheduled: usize,
        oldest_age_ms: i64,
        ready: bool,
    ) {
        let p = partition.to_string();
        self.scheduled
            .with_label_values(&[&p])
            .set(scheduled as i64);
        self.in_flight
            .with_label_values(&[&p])
            .set(in_flight as i64);
        self.oldest_age
            .with_label_values(&[&p])
            .set(oldest_age_ms / 1000);
        self.partition_ready
            .with_label_values(&[&p])
            .set(i64::from(ready));
    }

    /// Publishes the markers lag of one partition.
    pub fn markers_lag(&self, partition: i32, lag: i64) {
        self.markers_lag
            .with_label_values(&[&partition.to_string()])
            .set(lag);
    }

    /// Drops the series of a partition this tracker no longer owns.
    pub fn forget_partition(&self, partition: i32) {
        let p = partition.to_string();
        let _ = self.in_flight.remove_label_values(&[&p]);
        let _ = self.scheduled.remove_label_values(&[&p]);
        let _ = self.oldest_age.remove_label_values(&[&p]);
        let _ = self.partition_ready.remove_label_values(&[&p]);
        let _ = self.markers_lag.remove_label_values(&[&p]);
    }

    /// Publishes overall readiness and the number of assigned partitions.
    pub fn readiness(&self, ready: bool, assigned: usize) {
        self.ready.set(i64::from(ready));
        self.assigned.set(assigned as i64);
    }
}
