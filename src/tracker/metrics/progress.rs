//! Events of commits, snapshots and schedules: how work becomes durable.

use std::time::Duration;

use rdkafka::error::KafkaError;

use super::{Emit, Metrics};
use crate::events::{Event, EventKind};
use crate::marker::SourceRef;

/// A commit of markers offsets finished (failed ones are retried on the next interval).
pub(crate) struct CommitFinished<'a> {
    pub result: &'a Result<(), KafkaError>,
}

impl Emit for CommitFinished<'_> {
    fn emit(self, m: &Metrics) {
        match self.result {
            Ok(()) => m.progress.commits.inc(),
            Err(error) => {
                tracing::warn!(%error, "committing markers offsets failed");
                m.progress.commit_failures.inc();
            }
        }
    }
}

/// A snapshot is durable; the next commit names it.
pub(crate) struct SnapshotWritten {
    pub partition: i32,
    pub covers: i64,
    pub took: Duration,
}

impl Emit for SnapshotWritten {
    fn emit(self, m: &Metrics) {
        tracing::info!(partition = self.partition, covers = self.covers, took = ?self.took, "snapshot written");
        m.progress.snapshots.inc();
    }
}

/// A snapshot could not be written; the partition keeps its older one (or none).
pub(crate) struct SnapshotFailed<'a> {
    pub partition: i32,
    pub why: &'a str,
}

impl Emit for SnapshotFailed<'_> {
    fn emit(self, m: &Metrics) {
        tracing::warn!(
            partition = self.partition,
            why = self.why,
            "snapshot not written; will try again later"
        );
        m.progress.snapshot_failures.inc();
    }
}

/// A partition could not be restored from its snapshot yet; it stays paused.
pub(crate) struct RestoreFailed<'a> {
    pub partition: i32,
    pub why: &'a str,
}

impl Emit for RestoreFailed<'_> {
    fn emit(self, m: &Metrics) {
        tracing::error!(
            partition = self.partition,
            why = self.why,
            "cannot restore the partition's snapshot; it stays paused and unready, retrying"
        );
        m.progress.snapshot_failures.inc();
    }
}

/// A due schedule's record reached its target topic.
pub(crate) struct Published<'a> {
    pub id: &'a SourceRef,
    pub target: &'a str,
}

impl Emit for Published<'_> {
    fn emit(self, m: &Metrics) {
        let Published { id, target } = self;
        tracing::debug!(schedule = %id, target, "scheduled record published");
        m.progress.published.with_label_values(&[target]).inc();
        m.events
            .emit(|| Event::new(EventKind::Ready, id.clone(), 0).detail(target));
    }
}

/// A due schedule was found already published by the partition's previous owner.
pub(crate) struct AlreadyPublished<'a> {
    pub id: &'a SourceRef,
    pub target: &'a str,
}

impl Emit for AlreadyPublished<'_> {
    fn emit(self, m: &Metrics) {
        tracing::info!(schedule = %self.id, target = self.target, "already published by the previous owner; not publishing again");
        m.progress.already_published.inc();
    }
}

/// A schedule was cancelled before it was due.
pub(crate) struct Cancelled<'a> {
    pub id: &'a SourceRef,
}

impl Emit for Cancelled<'_> {
    fn emit(self, m: &Metrics) {
        tracing::debug!(schedule = %self.id, "schedule cancelled");
        m.progress.cancelled.inc();
        m.events
            .emit(|| Event::new(EventKind::Cancelled, self.id.clone(), 0));
    }
}
