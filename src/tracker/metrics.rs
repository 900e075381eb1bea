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

/// What the markers consumer reads.
#[derive(Clone)]
struct Intake {
    markers: IntCounterVec,
    batched_records: IntCounterVec,
    marker_errors: IntCounterVec,
    odd_markers: IntCounterVec,
    clock_jumps: IntCounterVec,
    consume_errors: IntCounter,
}

/// What the redelivery worker does, and what goes wrong.
#[derive(Clone)]
struct Work {
    redelivered: IntCounterVec,
    dead_lettered: IntCounterVec,
    deadline_lag: Histogram,
    fenced: IntCounterVec,
    parked: IntGauge,
    source_read_errors: IntCounterVec,
    produce_errors: IntCounterVec,
    problems: IntCounterVec,
}

/// The size and readiness of what the tracker holds.
#[derive(Clone)]
struct Gauges {
    in_flight: IntGaugeVec,
    oldest_age: IntGaugeVec,
    partition_ready: IntGaugeVec,
    markers_lag: IntGaugeVec,
    scheduled: IntGaugeVec,
    ready: IntGauge,
    assigned: IntGauge,
}

/// Commits, snapshots and schedules: how work becomes durable.
#[derive(Clone)]
struct Progress {
    commits: IntCounter,
    commit_failures: IntCounter,
    snapshots: IntCounter,
    snapshot_failures: IntCounter,
    published: IntCounterVec,
    cancelled: IntCounter,
    already_published: IntCounter,
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

/// Registers `metric` and returns it: the one way a metric gets into the registry.
fn register<M: prometheus::core::Collector + Clone + 'static>(r: &Registry, metric: M) -> M {
    r.register(Box::new(metric.clone()))
        .expect("unique metric name");
    metric
}

fn counters(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    register(r, c)
}

fn counter(r: &Registry, name: &str, help: &str) -> IntCounter {
    register(
        r,
        IntCounter::new(name, help).expect("static metric definition"),
    )
}

fn gauges(r: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let g = IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition");
    register(r, g)
}

fn gauge(r: &Registry, name: &str, help: &str) -> IntGauge {
    register(
        r,
        IntGauge::new(name, help).expect("static metric definition"),
    )
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Intake {
    fn new(r: &Registry) -> Self {
        Intake {
            markers: counters(
                r,
                "redelivery_markers_total",
                "Markers read, by type",
                &["type"],
            ),
            batched_records: counters(
                r,
                "redelivery_batched_records_total",
                "Records named by version 2 markers (batch Starts and Settles), by marker type",
                &["type"],
            ),
            marker_errors: counters(
                r,
                "redelivery_marker_errors_total",
                "Markers records skipped because they could not be decoded, by kind",
                &["kind"],
            ),
            odd_markers: counters(
                r,
                "redelivery_odd_markers_total",
                "Markers skipped because they contradict the state, by kind",
                &["kind"],
            ),
            clock_jumps: counters(
                r,
                "redelivery_clock_jumps_total",
                "Marker timestamps far ahead of partition time: kind=outlier (ignored, the marker \
                 applied at partition time) or moved (believed after a minute of them)",
                &["kind"],
            ),
            consume_errors: counter(
                r,
                "redelivery_consume_errors_total",
                "Errors returned while consuming the markers topic",
            ),
        }
    }
}

impl Work {
    fn new(r: &Registry) -> Self {
        let lag = HistogramOpts::new(
            "redelivery_deadline_lag_seconds",
            "Time from a delivery's deadline to its copy being durable, in partition time",
        )
        .buckets(vec![
            0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
            60.0,
        ]);
        let topic_and = |name, help, label| counters(r, name, help, &["topic", label]);
        Work {
            redelivered: topic_and(
                "redelivery_redelivered_total",
                "Copies produced to their source topic, by cause (timeout, nacked)",
                "cause",
            ),
            dead_lettered: topic_and(
                "redelivery_dead_lettered_total",
                "Copies produced to a dead-letter topic, by reason",
                "reason",
            ),
            deadline_lag: register(r, Histogram::with_opts(lag).expect("static metric definition")),
            fenced: counters(
                r,
                "redelivery_fenced_deliveries_total",
                "Due deliveries the redelivery worker dropped because their markers partition was \
                 revoked (stage=queued, read or parked); the new owner redelivers them",
                &["stage"],
            ),
            parked: gauge(
                r,
                "redelivery_parked_deliveries",
                "Due deliveries whose copy every target refused for good; kept in flight and retried",
            ),
            source_read_errors: counters(
                r,
                "redelivery_source_read_errors_total",
                "Transient failures reading a source record back (retried)",
                &["topic"],
            ),
            produce_errors: counters(
                r,
                "redelivery_produce_errors_total",
                "Failed produce attempts, by what was produced (copy, dead_letter, scheduled, end, tick)",
                &["what"],
            ),
            problems: counters(
                r,
                "redelivery_problems_total",
                "Problems logged that have no counter of their own, by kind (see PROBLEMS in \
                 src/tracker/metrics.rs)",
                &["kind"],
            ),
        }
    }
}

impl Gauges {
    fn new(r: &Registry) -> Self {
        let per_partition = |name, help| gauges(r, name, help, &["partition"]);
        Gauges {
            in_flight: per_partition("redelivery_in_flight", "Deliveries in flight"),
            oldest_age: per_partition(
                "redelivery_oldest_in_flight_age_seconds",
                "Age of the oldest delivery in flight",
            ),
            partition_ready: per_partition(
                "redelivery_partition_ready",
                "1 once the partition's state has been rebuilt by replay",
            ),
            markers_lag: per_partition(
                "redelivery_markers_lag",
                "Markers written but not yet read by this tracker (from librdkafka statistics)",
            ),
            scheduled: per_partition(
                "redelivery_schedules_pending",
                "Schedules waiting for their due time",
            ),
            ready: gauge(
                r,
                "redelivery_ready",
                "1 when every assigned partition has caught up",
            ),
            assigned: gauge(
                r,
                "redelivery_assigned_partitions",
                "Markers partitions assigned to this tracker",
            ),
        }
    }
}

impl Progress {
    fn new(r: &Registry) -> Self {
        Progress {
            commits: counter(r, "redelivery_commits_total", "Markers offset commits that succeeded"),
            commit_failures: counter(
                r,
                "redelivery_commit_failures_total",
                "Markers offset commits that failed (retried on the next interval)",
            ),
            snapshots: counter(
                r,
                "redelivery_snapshots_total",
                "Partition snapshots written and made durable",
            ),
            snapshot_failures: counter(
                r,
                "redelivery_snapshot_failures_total",
                "Snapshots not written, or not restored on assignment (retried)",
            ),
            published: counters(
                r,
                "redelivery_schedules_published_total",
                "Scheduled records produced to their target topic",
                &["topic"],
            ),
            cancelled: counter(
                r,
                "redelivery_schedules_cancelled_total",
                "Schedules cancelled (an End read before they were due)",
            ),
            already_published: counter(
                r,
                "redelivery_schedules_already_published_total",
                "Due schedules found already published by a previous owner after a takeover, and not published again",
            ),
        }
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

    /// Creates every series whose labels are known up front at zero, so dashboards and alerts
    /// see a 0 instead of no data before the first event.
    fn init_known_labels(&self) {
        for kind in crate::marker::DecodeError::KINDS
            .iter()
            .chain(&["tombstone"])
        {
            self.intake.marker_errors.with_label_values(&[kind]);
        }
        for kind in Oddity::ALL {
            self.intake.odd_markers.with_label_values(&[kind.name()]);
        }
        for what in ["copy", "dead_letter", "scheduled", "end", "tick"] {
            self.work.produce_errors.with_label_values(&[what]);
        }
        for kind in PROBLEMS {
            self.work.problems.with_label_values(&[kind]);
        }
    }

    /// Counts a problem whose log line the caller writes (`kind`: one of [`PROBLEMS`]).
    pub fn problem(&self, kind: &'static str) {
        debug_assert!(PROBLEMS.contains(&kind), "unknown problem kind {kind}");
        self.work.problems.with_label_values(&[kind]).inc();
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
        self.intake.markers.with_label_values(&[kind.name()]).inc();
    }

    /// A version 2 marker named `records` records.
    pub fn batched_records(&self, kind: MarkerType, records: u64) {
        self.intake
            .batched_records
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
        self.intake
            .marker_errors
            .with_label_values(&[error.kind()])
            .inc();
        if let Some(held_back) = self.log_limit.allow(error.kind(), Instant::now()) {
            tracing::warn!(partition, offset, kind = error.kind(), %error, held_back, "skipping undecodable marker");
        }
    }

    /// A markers record had no value. Logged at most once per 10 s, always counted.
    pub fn tombstone(&self, partition: i32, offset: i64) {
        self.intake
            .marker_errors
            .with_label_values(&["tombstone"])
            .inc();
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
        self.intake
            .odd_markers
            .with_label_values(&[oddity.name()])
            .inc();
    }

    /// A marker timestamp too far ahead of partition time: it did not move the clock and the
    /// marker was applied at partition time. Logged at most once per 10 s, always counted.
    pub fn clock_outlier(&self, partition: i32, offset: i64, ahead_ms: i64) {
        self.intake
            .clock_jumps
            .with_label_values(&["outlier"])
            .inc();
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
        self.intake.clock_jumps.with_label_values(&["moved"]).inc();
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
        self.work
            .fenced
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
        self.intake.consume_errors.inc();
        if let Some(held_back) = self.log_limit.allow("consume_error", Instant::now()) {
            tracing::warn!(%error, held_back, "error consuming the markers topic");
        }
    }

    /// A copy reached its source topic.
    pub fn redelivered(&self, source: &SourceRef, cause: &str, attempt: u32) {
        tracing::debug!(%source, cause, attempt, "redelivered");
        self.work
            .redelivered
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
        self.work
            .dead_lettered
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
        self.progress.published.with_label_values(&[target]).inc();
        self.events
            .emit(|| Event::new(EventKind::Ready, id.clone(), 0).detail(target));
    }

    /// A due schedule was found already published by the partition's previous owner.
    pub fn already_published(&self, id: &SourceRef, target: &str) {
        tracing::info!(schedule = %id, target, "already published by the previous owner; not publishing again");
        self.progress.already_published.inc();
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
        self.progress.snapshot_failures.inc();
    }

    /// A snapshot is durable; the next commit names it.
    pub fn snapshot_written(&self, partition: i32, covers: i64, took: std::time::Duration) {
        tracing::info!(partition, covers, took = ?took, "snapshot written");
        self.progress.snapshots.inc();
    }

    /// A partition could not be restored from its snapshot yet; it stays paused.
    pub fn restore_failed(&self, partition: i32, why: &str) {
        tracing::error!(
            partition,
            why,
            "cannot restore the partition's snapshot; it stays paused and unready, retrying"
        );
        self.progress.snapshot_failures.inc();
    }

    /// A schedule was cancelled before it was due.
    pub fn cancelled(&self, id: &SourceRef) {
        tracing::debug!(schedule = %id, "schedule cancelled");
        self.progress.cancelled.inc();
        self.events
            .emit(|| Event::new(EventKind::Cancelled, id.clone(), 0));
    }

    /// How late, in seconds, a copy was made durable after its deadline.
    pub fn deadline_lag(&self, seconds: f64) {
        self.work.deadline_lag.observe(seconds.max(0.0));
    }

    /// Reading a source record failed in a way that may pass.
    /// Logged at most once per 10 s (a broker away fails every read), always counted.
    pub fn source_read_error(&self, source: &SourceRef, error: &dyn std::fmt::Display) {
        if let Some(held_back) = self.log_limit.allow("source_read_error", Instant::now()) {
            tracing::warn!(%source, %error, held_back, "could not read the source record; will retry");
        }
        self.work
            .source_read_errors
            .with_label_values(&[&source.topic])
            .inc();
    }

    /// A produce failed and will be retried. Logged at most once per 10 s, always counted.
    pub fn produce_error(&self, what: &str, target: &str, error: &dyn std::fmt::Display) {
        if let Some(held_back) = self.log_limit.allow("produce_error", Instant::now()) {
            tracing::warn!(what, target, %error, held_back, "produce failed; will retry");
        }
        self.work.produce_errors.with_label_values(&[what]).inc();
    }

    /// The broker refused a record for good; the caller sends it elsewhere or parks it.
    pub fn produce_refused(&self, what: &str, target: &str, error: &dyn std::fmt::Display) {
        tracing::error!(what, target, %error, "the broker refused the record; it will not be retried as is");
        self.work.produce_errors.with_label_values(&[what]).inc();
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
        self.work.parked.set(n as i64);
    }

    /// A commit of markers offsets finished.
    pub fn commit(&self, result: &Result<(), rdkafka::error::KafkaError>) {
        match result {
            Ok(()) => self.progress.commits.inc(),
            Err(error) => {
                tracing::warn!(%error, "committing markers offsets failed");
                self.progress.commit_failures.inc();
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
        self.gauges
            .scheduled
            .with_label_values(&[&p])
            .set(scheduled as i64);
        self.gauges
            .in_flight
            .with_label_values(&[&p])
            .set(in_flight as i64);
        self.gauges
            .oldest_age
            .with_label_values(&[&p])
            .set(oldest_age_ms / 1000);
        self.gauges
            .partition_ready
            .with_label_values(&[&p])
            .set(i64::from(ready));
    }

    /// Publishes the markers lag of one partition.
    pub fn markers_lag(&self, partition: i32, lag: i64) {
        self.gauges
            .markers_lag
            .with_label_values(&[&partition.to_string()])
            .set(lag);
    }

    /// Drops the series of a partition this tracker no longer owns.
    pub fn forget_partition(&self, partition: i32) {
        let p = partition.to_string();
        let _ = self.gauges.in_flight.remove_label_values(&[&p]);
        let _ = self.gauges.scheduled.remove_label_values(&[&p]);
        let _ = self.gauges.oldest_age.remove_label_values(&[&p]);
        let _ = self.gauges.partition_ready.remove_label_values(&[&p]);
        let _ = self.gauges.markers_lag.remove_label_values(&[&p]);
    }

    /// Publishes overall readiness and the number of assigned partitions.
    pub fn readiness(&self, ready: bool, assigned: usize) {
        self.gauges.ready.set(i64::from(ready));
        self.gauges.assigned.set(assigned as i64);
    }
}
