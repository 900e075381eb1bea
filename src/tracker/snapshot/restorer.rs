//! Restoring snapshots on a thread of their own.
//!
//! A newly assigned markers partition may need its snapshot before any marker is applied
//! (see `snapshotting`). Reading it takes a committed-offsets lookup and a read of up to
//! millions of entries, and may wait up to 30 s on a broker that does not answer. Done on the
//! markers thread, one unreadable snapshot stalled every healthy partition (no deadlines, no
//! commits) and a stop could not be heard. So the markers thread pauses the partition, asks
//! here, and goes on; it installs the answer when it comes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rdkafka::consumer::BaseConsumer;

use crate::tracker::config::TrackerConfig;
use crate::tracker::error::TrackerError;
use crate::tracker::metrics::Metrics;
use crate::tracker::snapshot::policy::{self, Restored};

/// A restore for `partition` as granted under `generation` (see `fence`): an answer for an
/// older grant is ignored.
pub(crate) type Ask = (i32, u64);

/// What the restorer found for one partition.
pub(crate) struct Answer {
    pub(crate) partition: i32,
    pub(crate) generation: u64,
    pub(crate) result: Result<Restored, String>,
}

/// The markers thread's handle on the restore thread.
pub(crate) struct Restorer {
    asks: Sender<Vec<Ask>>,
    // A `Mutex` only because the consumer context must be `Sync`; one thread uses it.
    answers: Mutex<Receiver<Answer>>,
}

impl Restorer {
    /// Starts the restore thread; it reads from `snapshots_topic` and ends on `stop` or when
    /// this handle is dropped.
    pub(crate) fn start(
        config: Arc<TrackerConfig>,
        metrics: Metrics,
        snapshots_topic: Option<String>,
        stop: Arc<AtomicBool>,
    ) -> Result<Self, TrackerError> {
        // Its own client in the tracker's group, never subscribed: it only reads committed
        // offsets and their metadata.
        let consumer: BaseConsumer = config
            .client_config(&[
                ("group.id", &config.group_id),
                ("enable.auto.commit", "false"),
            ])
            .create()
            .map_err(TrackerError::kafka("creating the snapshot restorer"))?;
        let (asks, ask_rx) = mpsc::channel::<Vec<Ask>>();
        let (answer_tx, answers) = mpsc::channel();
        std::thread::Builder::new()
            .name("tracker-restorer".into())
            .spawn(move || {
                serve(
                    &consumer,
                    &config,
                    &metrics,
                    snapshots_topic.as_deref(),
                    &stop,
                    &ask_rx,
                    &answer_tx,
                )
            })
            .map_err(|e| TrackerError::Thread(format!("starting the restore thread: {e}")))?;
        Ok(Restorer {
            asks,
            answers: Mutex::new(answers),
        })
    }

    /// Asks for the snapshots of these partitions; answers come through [`Self::answers`].
    pub(crate) fn ask(&self, work: Vec<Ask>) -> bool {
        work.is_empty() || self.asks.send(work).is_ok()
    }

    /// The answers that have arrived.
    pub(crate) fn answers(&self) -> Vec<Answer> {
        let rx = self.answers.lock().unwrap_or_else(|e| e.into_inner());
        rx.try_iter().collect()
    }
}

fn serve(
    consumer: &BaseConsumer,
    config: &TrackerConfig,
    metrics: &Metrics,
    topic: Option<&str>,
    stop: &AtomicBool,
    asks: &Receiver<Vec<Ask>>,
    answers: &Sender<Answer>,
) {
    while !stop.load(Ordering::Relaxed) {
        let mut work = match asks.recv_timeout(Duration::from_millis(200)) {
            Ok(work) => work,
            Err(RecvTimeoutError::Timeout) => continue,
            Err(RecvTimeoutError::Disconnected) => return,
        };
        work.extend(asks.try_iter().flatten());
        // The latest grant of each partition is the one that matters.
        let work: std::collections::BTreeMap<i32, u64> =
            work.into_iter().fold(Default::default(), |mut m, (p, g)| {
                let e = m.entry(p).or_insert(g);
                *e = (*e).max(g);
                m
            });
        let ids: Vec<i32> = work.keys().copied().collect();
        let mut found = policy::restore(consumer, config, metrics, topic, &ids, stop);
        for (partition, generation) in work {
            let result = found
                .remove(&partition)
                .unwrap_or_else(|| Err("no committed offset came back for it".into()));
            let answer = Answer {
                partition,
                generation,
                result,
            };
            if answers.send(answer).is_err() {
                return;
            }
        }
    }
}
