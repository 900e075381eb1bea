//! Problems that have no counter of their own: each is one variant, logged with its context and
//! counted in `redelivery_problems_total{kind}`, so an alert can see what a log line says.

use std::time::Duration;

use rdkafka::error::KafkaError;

use super::{Emit, Metrics};

/// A problem the tracker logs and counts by kind.
pub(crate) enum Problem<'a> {
    /// A revocation waited for a redelivery pass for the revoked partitions, and it did not end
    /// in time: its copies may duplicate the new owner's.
    PassOutlivedRevocation {
        partitions: &'a [i32],
        wait: Duration,
    },
    /// Newly assigned partitions could not be paused while their snapshot is looked up.
    PauseFailed { error: &'a KafkaError },
    /// Restored partitions could not be resumed.
    ResumeFailed { error: &'a KafkaError },
    /// The restore thread is gone: partitions waiting for it stay paused and unready.
    RestoreThreadGone,
    /// librdkafka reported an error during a rebalance.
    RebalanceError { error: &'a KafkaError },
    /// A marker arrived for a partition whose snapshot is not restored yet; it is rewound.
    ReadBeforeRestore { partition: i32, offset: i64 },
    /// That rewind failed: the tracker stops so the partition is replayed by its next owner.
    RewindFailed {
        partition: i32,
        error: &'a KafkaError,
    },
    /// The redelivery worker is gone: due deliveries stay in flight (the tracker stops).
    WorkerGone,
    /// Whether a previous owner already published some schedules could not be checked; they
    /// are published (a duplicate is possible, a loss is not).
    PublishedCheckFailed {
        target: &'a str,
        schedules: usize,
        why: &'a str,
    },
    /// A restored snapshot named topics its own table did not hold; those entries were skipped.
    SnapshotEntriesSkipped { partition: i32, skipped: usize },
    /// librdkafka reported an error to a reader of source records, snapshots or schedules
    /// (the read itself fails, is counted and retried where it happens).
    SourceReaderError {
        error: &'a KafkaError,
        reason: &'a str,
    },
    /// Markers read from this partition carry the writer's timestamp (`CreateTime`), not the
    /// broker's: the topic allows it (`--allow-create-time`), or the broker ignores
    /// `LogAppendTime` (Tansu 0.6 does). Said once per partition and assignment.
    MarkersNotBrokerStamped { partition: i32 },
    /// A replaying partition read nothing, not even its own Tick, for this long since the Tick
    /// was written: its Tick is written again, and the partition resumed and sought to where it
    /// should fetch (`markers/restart.rs`). It stays unready, and so does the tracker, until it
    /// reads.
    ReplayStalled { partition: i32, silent: Duration },
    /// Deliveries of this partition have been due by the clock for this long, but nothing
    /// stamped at or after their deadlines has been read from it (its leader stopped or cut
    /// off, or the tracker's Ticks not written): they are held, since Ends written in time may
    /// still be stuck behind the outage, and a read-through Tick is written again every second.
    RedeliveriesHeld { partition: i32, held: Duration },
}

impl Problem<'_> {
    /// Every `kind` label, initialised at 0 so alerts see a series before the first problem.
    pub(crate) const KINDS: [&'static str; 14] = [
        "pass_outlived_revocation",
        "pause_failed",
        "resume_failed",
        "restore_thread_gone",
        "rebalance_error",
        "read_before_restore",
        "rewind_failed",
        "worker_gone",
        "published_check_failed",
        "snapshot_entries_skipped",
        "source_reader_error",
        "markers_not_broker_stamped",
        "replay_stalled",
        "redeliveries_held",
    ];

    /// The `kind` label.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Problem::PassOutlivedRevocation { .. } => "pass_outlived_revocation",
            Problem::PauseFailed { .. } => "pause_failed",
            Problem::ResumeFailed { .. } => "resume_failed",
            Problem::RestoreThreadGone => "restore_thread_gone",
            Problem::RebalanceError { .. } => "rebalance_error",
            Problem::ReadBeforeRestore { .. } => "read_before_restore",
            Problem::RewindFailed { .. } => "rewind_failed",
            Problem::WorkerGone => "worker_gone",
            Problem::PublishedCheckFailed { .. } => "published_check_failed",
            Problem::SnapshotEntriesSkipped { .. } => "snapshot_entries_skipped",
            Problem::SourceReaderError { .. } => "source_reader_error",
            Problem::MarkersNotBrokerStamped { .. } => "markers_not_broker_stamped",
            Problem::ReplayStalled { .. } => "replay_stalled",
            Problem::RedeliveriesHeld { .. } => "redeliveries_held",
        }
    }

    fn log(&self, held_back: u64) {
        match self {
            Problem::PassOutlivedRevocation { partitions, wait } => tracing::warn!(
                ?partitions,
                ?wait,
                "a redelivery pass for revoked partitions is still running; its copies may \
                 duplicate the new owner's"
            ),
            Problem::PauseFailed { error } => {
                tracing::error!(%error, "could not pause partitions waiting for their snapshot")
            }
            Problem::ResumeFailed { error } => {
                tracing::error!(%error, "could not resume restored partitions")
            }
            Problem::RestoreThreadGone => tracing::error!(
                "the restore thread is gone; partitions waiting for a snapshot stay paused and unready"
            ),
            Problem::RebalanceError { error } => tracing::warn!(%error, "rebalance error"),
            Problem::ReadBeforeRestore { partition, offset } => tracing::warn!(
                partition,
                offset,
                "marker read before the snapshot was restored; rewinding"
            ),
            Problem::RewindFailed { partition, error } => tracing::error!(
                partition,
                %error,
                "rewind failed; stopping so the partition is replayed by the next owner"
            ),
            Problem::WorkerGone => {
                tracing::error!("redelivery worker is gone; due deliveries stay in flight")
            }
            Problem::PublishedCheckFailed {
                target,
                schedules,
                why,
            } => tracing::warn!(
                target,
                schedules,
                why,
                "cannot tell whether the previous owner already published these schedules; \
                 publishing them (a duplicate is possible)"
            ),
            Problem::SnapshotEntriesSkipped { partition, skipped } => tracing::warn!(
                partition,
                skipped,
                "snapshot entries with an unknown topic skipped"
            ),
            Problem::SourceReaderError { error, reason } => {
                tracing::warn!(%error, reason, held_back, "source reader error")
            }
            Problem::MarkersNotBrokerStamped { partition } => tracing::warn!(
                partition,
                "markers carry the writers' timestamps (CreateTime), not the broker's, although \
                 the topic may say LogAppendTime: deadlines follow the clocks of the hosts that \
                 write markers, so keep those in sync"
            ),
            Problem::ReplayStalled { partition, silent } => tracing::warn!(
                partition,
                ?silent,
                "replaying partition has read nothing since its Tick was written, not even the \
                 Tick; writing it again, resuming the partition and seeking it to where it \
                 should fetch (is the markers topic's leader reachable and readable?)"
            ),
            Problem::RedeliveriesHeld { partition, held } => tracing::warn!(
                partition,
                ?held,
                held_back,
                "deliveries are due but nothing written after their deadlines has been read \
                 from this markers partition; holding their redelivery until it is (is the \
                 markers topic's leader reachable, and can the tracker write to it?)"
            ),
        }
    }

    /// Whether one occurrence can stand for many (a broker away makes every reader report),
    /// so its log lines are limited.
    fn repeats(&self) -> bool {
        matches!(
            self,
            Problem::SourceReaderError { .. } | Problem::RedeliveriesHeld { .. }
        )
    }
}

impl Emit for Problem<'_> {
    fn emit(self, m: &Metrics) {
        let kind = self.kind();
        m.work.problems.with_label_values(&[kind]).inc();
        if !self.repeats() {
            self.log(0);
        } else if let Some(held_back) = m.may_log(kind) {
            self.log(held_back);
        }
    }
}
