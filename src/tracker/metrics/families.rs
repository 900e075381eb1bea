//! The metric families, in four groups by what they describe, and the one way a metric is
//! registered.
//!
//! Metric definitions are static: creating or registering one can only fail on a programming
//! error (a bad name, a duplicate), which the unit tests would hit, so `expect` is used for them.
#![allow(clippy::expect_used)]

use crate::tracker::core::group_hold::AfterHold;
use prometheus::{
    Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry,
};

/// What the markers consumer reads.
#[derive(Clone)]
pub(super) struct Intake {
    pub(super) markers: IntCounterVec,
    pub(super) batched_records: IntCounterVec,
    pub(super) marker_errors: IntCounterVec,
    pub(super) odd_markers: IntCounterVec,
    pub(super) clock_jumps: IntCounterVec,
    pub(super) consume_errors: IntCounter,
}

/// What the redelivery worker does, and what goes wrong.
#[derive(Clone)]
pub(super) struct Work {
    pub(super) redelivered: IntCounterVec,
    pub(super) group_holds: IntCounterVec,
    pub(super) dead_lettered: IntCounterVec,
    pub(super) deadline_lag: Histogram,
    pub(super) fenced: IntCounterVec,
    pub(super) parked: IntGauge,
    pub(super) parks: IntCounter,
    pub(super) source_read_errors: IntCounterVec,
    pub(super) read_ahead: IntCounterVec,
    pub(super) produce_errors: IntCounterVec,
    pub(super) problems: IntCounterVec,
}

/// The size and readiness of what the tracker holds.
#[derive(Clone)]
pub(super) struct Gauges {
    pub(super) in_flight: IntGaugeVec,
    pub(super) oldest_age: IntGaugeVec,
    pub(super) partition_ready: IntGaugeVec,
    pub(super) markers_lag: IntGaugeVec,
    pub(super) scheduled: IntGaugeVec,
    pub(super) ready: IntGauge,
    pub(super) assigned: IntGauge,
}

/// Commits, snapshots and schedules: how work becomes durable.
#[derive(Clone)]
pub(super) struct Progress {
    pub(super) commits: IntCounter,
    pub(super) commit_failures: IntCounter,
    pub(super) snapshots: IntCounter,
    pub(super) snapshot_failures: IntCounter,
    pub(super) published: IntCounterVec,
    pub(super) cancelled: IntCounter,
    pub(super) already_published: IntCounter,
}

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

impl Intake {
    pub(super) fn new(r: &Registry) -> Self {
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
    pub(super) fn new(r: &Registry) -> Self {
        let lag = HistogramOpts::new(
            "redelivery_deadline_lag_seconds",
            "Time from a delivery's deadline to its copy being durable, in partition time",
        )
        // Fine below 25 ms, where a healthy tracker works, so that a p99 of "between 10 and
        // 25 ms" can be told apart from 12 or 24 (issue 14's target is 10 ms).
        .buckets(vec![
            0.001, 0.002, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5,
            1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ]);
        let topic_and = |name, help, label| counters(r, name, help, &["topic", label]);
        let group_holds = counters(
            r,
            "redelivery_group_holds_total",
            "Due deliveries held back because the source group (--source-group) had not \
             committed past their record and reads it again itself (outcome=held, once per \
             delivery), and those copied after all, by why: the wait ran out \
             (copied_after_wait), the group's offset stayed unknown (copied_no_answer), the \
             group has no offset there (copied_no_offset), or it had been handed out after all \
             (copied_handed_out)",
            &["outcome"],
        );
        // Every series from the start, at zero: a rate over them is 0, not "no data", on a
        // tracker that holds nothing (or runs without the option).
        group_holds.with_label_values(&["held"]);
        for why in AfterHold::ALL {
            group_holds.with_label_values(&[why.outcome()]);
        }
        Work {
            redelivered: topic_and(
                "redelivery_redelivered_total",
                "Copies produced to their source topic, by cause (timeout, nacked)",
                "cause",
            ),
            group_holds,
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
            parks: counter(
                r,
                "redelivery_parks_total",
                "Times a due delivery was parked because every target refused its copy for good",
            ),
            source_read_errors: counters(
                r,
                "redelivery_source_read_errors_total",
                "Transient failures reading a source record back (retried)",
                &["topic"],
            ),
            read_ahead: counters(
                r,
                "redelivery_read_ahead_records_total",
                "Source records read ahead of their deadline, by outcome: read, used (by a \
                 redelivery pass), unused (settled in time, or kept too long) and skipped (the \
                 read-ahead queue or memory was full; read when due instead)",
                &["outcome"],
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
                "Problems logged that have no counter of their own, by kind (see Problem in \
                 src/tracker/metrics/problem.rs)",
                &["kind"],
            ),
        }
    }
}

impl Gauges {
    pub(super) fn new(r: &Registry) -> Self {
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
    pub(super) fn new(r: &Registry) -> Self {
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
