//! The source group's committed offsets, for holding back copies it makes unnecessary
//! (`core/group_hold.rs`, `--source-group`).
//!
//! The markers loop must not wait on the broker while it decides what is due, so it only reads
//! what this thread last fetched: asking about a partition the first time answers "unknown"
//! and wakes the thread, which fetches every partition asked about in the last minute
//! (`OffsetFetch` for the group, with a consumer that never joins it) and fetches them again
//! every `REFRESH`. A partition the group has no offset for reads as "nothing": no hold, the
//! copy is made as without the option. A fetch that fails keeps what an earlier one found; a
//! partition no fetch has answered for yet stays unknown through a timeout and reads as
//! nothing once the broker refuses the group (its ACL missing, say).

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{Offset, TopicPartitionList};

use crate::log_limit::LogLimit;
use crate::marker::SourceRef;
use crate::tracker::config::TrackerConfig;
use crate::tracker::core::group_hold::Committed;
use crate::tracker::error::TrackerError;

/// How often the partitions asked about are fetched again.
const REFRESH: Duration = Duration::from_millis(500);
/// A partition not asked about for this long is no longer fetched.
const FORGET_AFTER: Duration = Duration::from_secs(60);
/// Longest one fetch may take.
const FETCH_WAIT: Duration = Duration::from_secs(5);

struct Entry {
    committed: Committed,
    asked_at: Instant,
}

#[derive(Default)]
struct Known {
    partitions: HashMap<(Arc<str>, i32), Entry>,
    /// A partition was asked about for the first time: fetch now, not at the next refresh.
    new: bool,
    stop: bool,
}

struct Shared {
    known: Mutex<Known>,
    wake: Condvar,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Known> {
        // Nothing panics while holding it; the map stays usable if something ever did.
        self.known.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// What the markers loop knows of the source group's committed offsets; the fetching thread
/// stops when this is dropped.
pub(crate) struct GroupOffsets {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl GroupOffsets {
    /// Starts fetching the committed offsets of `group`.
    pub(crate) fn start(config: &TrackerConfig, group: &str) -> Result<Self, TrackerError> {
        let consumer: BaseConsumer = config
            .client_config(&[
                ("group.id", group),
                // Only reads the group's offsets: never commits, never joins.
                ("enable.auto.commit", "false"),
                ("enable.auto.offset.store", "false"),
            ])
            .create()
            .map_err(TrackerError::kafka(
                "creating the source group's offsets reader",
            ))?;
        let shared = Arc::new(Shared {
            known: Mutex::new(Known::default()),
            wake: Condvar::new(),
        });
        let fetching = shared.clone();
        let group = group.to_string();
        let thread = std::thread::Builder::new()
            .name("tracker-group-offsets".into())
            .spawn(move || fetch_loop(&fetching, &consumer, &group))
            .map_err(|e| TrackerError::Thread(format!("starting the group offsets thread: {e}")))?;
        Ok(GroupOffsets {
            shared,
            thread: Some(thread),
        })
    }

    /// The group's committed offset of `source`'s partition as last fetched; `Unknown` the
    /// first time, which has it fetched at once.
    pub(crate) fn committed(&self, source: &SourceRef) -> Committed {
        let mut known = self.shared.lock();
        let now = Instant::now();
        if let Some(e) = known
            .partitions
            .get_mut(&(source.topic.clone(), source.partition))
        {
            e.asked_at = now;
            return e.committed;
        }
        known.partitions.insert(
            (source.topic.clone(), source.partition),
            Entry {
                committed: Committed::Unknown,
                asked_at: now,
            },
        );
        known.new = true;
        self.shared.wake.notify_one();
        Committed::Unknown
    }
}

impl Drop for GroupOffsets {
    fn drop(&mut self) {
        self.shared.lock().stop = true;
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn fetch_loop(shared: &Shared, consumer: &BaseConsumer, group: &str) {
    let log_limit = LogLimit::default();
    loop {
        let wanted = {
            let mut known = shared.lock();
            if !known.new && !known.stop {
                known = shared
                    .wake
                    .wait_timeout(known, REFRESH)
                    .map(|(k, _)| k)
                    .unwrap_or_else(|e| e.into_inner().0);
            }
            if known.stop {
                return;
            }
            known.new = false;
            known
                .partitions
                .retain(|_, e| e.asked_at.elapsed() < FORGET_AFTER);
            known.partitions.keys().cloned().collect::<Vec<_>>()
        };
        // The consumer is never assigned anything, but librdkafka queues its errors and events
        // for a poll: drained here, they cannot pile up over a long broker outage.
        while let Some(event) = consumer.poll(Duration::ZERO) {
            if let Err(e) = event {
                tracing::debug!(group, error = %e, "source group offsets reader");
            }
        }
        if wanted.is_empty() {
            continue;
        }
        let fetched = fetch(consumer, &wanted);
        if let Err(e) = &fetched {
            if let Some(held_back) = log_limit.allow("fetch", Instant::now()) {
                tracing::warn!(
                    group,
                    error = %e,
                    held_back,
                    "could not fetch the source group's committed offsets; offsets fetched before \
                     stand, and due deliveries of partitions never fetched are held a few seconds \
                     at most (none if the broker refused the group)"
                );
            }
        }
        // A refusal stands until an operator acts; anything else (a timeout while the
        // coordinator moves) may pass at the next fetch.
        let lasting = match &fetched {
            Ok(_) => true,
            Err(e) => is_refusal(e),
        };
        let mut known = shared.lock();
        for (key, answer) in wanted.into_iter().zip(answers(fetched)) {
            let Some(e) = known.partitions.get_mut(&key) else {
                continue;
            };
            let first = e.committed == Committed::Unknown;
            e.committed = merged(e.committed, answer, lasting);
            if first && answer == Some(Committed::Nothing) {
                // A misspelt group, or a topic it does not read, has nothing committed: say
                // so, since the option then does nothing there.
                if let Some(held_back) = log_limit.allow("no_offset", Instant::now()) {
                    tracing::info!(
                        group,
                        topic = %key.0,
                        partition = key.1,
                        held_back,
                        "the source group has no committed offset here; its due deliveries are copied at their deadline"
                    );
                }
            }
        }
    }
}

/// The committed offset of each of `wanted`, in order; `None` where the broker answered for
/// that partition with an error.
fn fetch(
    consumer: &BaseConsumer,
    wanted: &[(Arc<str>, i32)],
) -> Result<Vec<Option<Committed>>, rdkafka::error::KafkaError> {
    let mut tpl = TopicPartitionList::new();
    for (topic, partition) in wanted {
        tpl.add_partition(topic, *partition);
    }
    let got = consumer.committed_offsets(tpl, FETCH_WAIT)?;
    Ok(wanted
        .iter()
        .map(|(topic, partition)| {
            let e = got.find_partition(topic, *partition)?;
            e.error().ok()?;
            Some(match e.offset() {
                Offset::Offset(next) => Committed::At(next),
                // No offset committed there.
                _ => Committed::Nothing,
            })
        })
        .collect())
}

/// Each partition's answer, `None` for all of them when the fetch failed.
fn answers(
    fetched: Result<Vec<Option<Committed>>, rdkafka::error::KafkaError>,
) -> impl Iterator<Item = Option<Committed>> {
    fetched
        .unwrap_or_default()
        .into_iter()
        .chain(std::iter::repeat(None))
}

/// What is known of a partition after a fetch whose `answer` for it was `None` if it failed,
/// `lasting` if that failure will not pass by itself (a refusal, an error for the partition).
/// A failure keeps an offset known before: committed offsets move forward, so a stale one at
/// most holds a record a little longer, within the wait (the long fault run on a cluster saw
/// 61 fetches time out while a coordinator moved; reading them as "nothing" copied held
/// batches a few seconds before their next reader came). A partition never answered for stays
/// unknown through a passing failure (its deliveries are held for the first-answer grace at
/// most) and reads as nothing after a lasting one, so a tracker that may not read the group's
/// offsets at all (its ACL missing) copies at the deadline.
fn merged(old: Committed, answer: Option<Committed>, lasting: bool) -> Committed {
    match (answer, old) {
        (Some(c), _) => c,
        (None, Committed::Unknown) if lasting => Committed::Nothing,
        (None, known) => known,
    }
}

/// Whether a failed fetch was the broker refusing this tracker the group or its topics.
fn is_refusal(e: &rdkafka::error::KafkaError) -> bool {
    use rdkafka::types::RDKafkaErrorCode as Code;
    matches!(
        e.rdkafka_error_code(),
        Some(
            Code::GroupAuthorizationFailed
                | Code::TopicAuthorizationFailed
                | Code::ClusterAuthorizationFailed
                | Code::SaslAuthenticationFailed
                | Code::InvalidGroupId
        )
    )
}

#[cfg(test)]
#[allow(clippy::expect_used)]
mod tests {
    use super::*;
    use rdkafka::consumer::CommitMode;
    use rdkafka::mocking::MockCluster;

    /// Asks until the answer is no longer "unknown" (a bound, not a timing assertion).
    fn settled(offsets: &GroupOffsets, source: &SourceRef) -> Committed {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = offsets.committed(source);
            if c != Committed::Unknown || Instant::now() > deadline {
                return c;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn the_groups_committed_offsets_are_fetched_and_a_partition_without_one_reads_as_nothing() {
        let mock = MockCluster::new(1).expect("mock cluster");
        mock.create_topic("orders", 2, 1).expect("topic");
        let brokers = mock.bootstrap_servers();
        let committer: BaseConsumer =
            crate::kafka::client_config(&brokers, &[("group.id", "workers")], &[])
                .create()
                .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset("orders", 0, Offset::Offset(5))
            .expect("offset");
        committer.commit(&tpl, CommitMode::Sync).expect("committed");

        let offsets =
            GroupOffsets::start(&TrackerConfig::new(brokers, "orders.markers"), "workers")
                .expect("started");
        let first = SourceRef::new("orders", 0, 7);
        assert_eq!(offsets.committed(&first), Committed::Unknown);
        assert_eq!(settled(&offsets, &first), Committed::At(5));
        // Partition 1 was never committed: nothing to wait for.
        assert_eq!(
            settled(&offsets, &SourceRef::new("orders", 1, 0)),
            Committed::Nothing
        );
        // Later commits are seen at the next refresh.
        tpl.set_partition_offset("orders", 0, Offset::Offset(9))
            .expect("offset");
        committer.commit(&tpl, CommitMode::Sync).expect("committed");
        let deadline = Instant::now() + Duration::from_secs(30);
        while offsets.committed(&first) != Committed::At(9) {
            assert!(
                Instant::now() < deadline,
                "the new offset was never fetched"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_failed_fetch_keeps_what_was_known_and_only_a_refusal_makes_an_unknown_partition_nothing() {
        let failed = Err(rdkafka::error::KafkaError::Canceled);
        assert!(answers(failed).take(3).all(|a| a.is_none()));
        let got: Vec<_> = answers(Ok(vec![Some(Committed::At(1))])).take(2).collect();
        assert_eq!(got, [Some(Committed::At(1)), None]);
        for lasting in [false, true] {
            assert_eq!(merged(Committed::At(4), None, lasting), Committed::At(4));
            assert_eq!(
                merged(Committed::Nothing, None, lasting),
                Committed::Nothing
            );
        }
        assert_eq!(merged(Committed::Unknown, None, false), Committed::Unknown);
        assert_eq!(merged(Committed::Unknown, None, true), Committed::Nothing);
        assert_eq!(
            merged(Committed::At(4), Some(Committed::Nothing), false),
            Committed::Nothing
        );
        assert_eq!(
            merged(Committed::Unknown, Some(Committed::At(9)), false),
            Committed::At(9)
        );
        use rdkafka::error::KafkaError;
        use rdkafka::types::RDKafkaErrorCode as Code;
        assert!(is_refusal(&KafkaError::MetadataFetch(
            Code::GroupAuthorizationFailed
        )));
        assert!(!is_refusal(&KafkaError::MetadataFetch(
            Code::OperationTimedOut
        )));
    }
}
