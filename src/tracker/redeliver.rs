//! The redelivery worker: turns due deliveries into copies and Ends.
//!
//! It runs on its own thread so that slow reads and produces never hold up the markers
//! consumer. For each job it reads the original records, produces the copies (to the source
//! partition, or to a dead-letter topic), waits until they are durable, and only then writes the
//! End markers that let the tracker forget them. A crash anywhere in between leaves the delivery
//! in flight in the markers log, so it is redelivered again after a restart: a duplicate at
//! worst, never a loss.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::executor::block_on;
use futures::future::join_all;
use rdkafka::message::{Message, OwnedMessage};
use rdkafka::producer::{FutureProducer, FutureRecord};

use crate::headers::{self, HeaderList};
use crate::marker::{encode, Marker, SourceRef};

use super::action::{decide, Action, DlqReason};
use super::config::TrackerConfig;
use super::copy::copy_headers;
use super::metrics::Metrics;
use super::source_reader::{ReadOutcome, SourceReader};
use super::state::{Cause, Expiry};

/// Due deliveries of one markers partition, handed over by the consumer thread.
#[derive(Debug)]
pub struct Job {
    /// The markers partition they were tracked in; their Ends go back there.
    pub markers_partition: i32,
    /// The due deliveries.
    pub expiries: Vec<Expiry>,
    /// Partition time when they were taken, and the local instant of that reading, to measure
    /// deadline-to-redelivery lag.
    pub taken_at_ms: i64,
    /// Local instant matching `taken_at_ms`.
    pub taken_at: Instant,
}

/// A record to produce, owned so it can be retried.
#[derive(Debug, Clone)]
struct Outgoing {
    topic: String,
    partition: Option<i32>,
    key: Option<Vec<u8>>,
    payload: Option<Vec<u8>>,
    headers: HeaderList,
}

/// One due delivery with its decision and, once read, its copy.
struct Pending {
    expiry: Expiry,
    action: Action,
    copy: Option<Outgoing>,
}

/// Owns the source reader and a producer; see the module docs.
pub struct Redeliverer {
    config: Arc<TrackerConfig>,
    reader: SourceReader,
    producer: FutureProducer,
    metrics: Metrics,
    stop: Arc<AtomicBool>,
}

const MAX_BACKOFF: Duration = Duration::from_secs(5);

impl Redeliverer {
    /// Creates the worker's clients.
    pub fn new(
        config: Arc<TrackerConfig>,
        producer: FutureProducer,
        metrics: Metrics,
        stop: Arc<AtomicBool>,
    ) -> Result<Self, super::TrackerError> {
        Ok(Redeliverer {
            reader: SourceReader::new(&config)?,
            config,
            producer,
            metrics,
            stop,
        })
    }

    /// Handles jobs until the sender is dropped or a stop is requested.
    /// `queued` counts jobs sent but not yet finished; the consumer reads it to bound the queue.
    pub fn run(self, jobs: Receiver<Job>, queued: &AtomicUsize) {
        while let Ok(job) = jobs.recv() {
            if self.stopping() {
                break;
            }
            self.handle(job);
            queued.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    fn handle(&self, job: Job) {
        let pending = self.read_sources(job.expiries);
        if self.stopping() {
            return;
        }
        let copies: Vec<Outgoing> = pending.iter().filter_map(|p| p.copy.clone()).collect();
        if !self.send_all("copy", &copies) {
            return;
        }
        let lag_base = job.taken_at_ms as f64 / 1000.0;
        for p in &pending {
            let now = lag_base + job.taken_at.elapsed().as_secs_f64();
            self.metrics
                .deadline_lag(now - p.expiry.deadline_ms as f64 / 1000.0);
            self.count(p);
        }
        let ends: Vec<Outgoing> = pending
            .iter()
            .map(|p| {
                end_marker(
                    &self.config.markers_topic,
                    job.markers_partition,
                    &p.expiry.source,
                )
            })
            .collect();
        self.send_all("end", &ends);
    }

    fn count(&self, p: &Pending) {
        match &p.action {
            Action::Redeliver { attempt } => {
                let cause = if p.expiry.cause == Cause::Nacked {
                    "nacked"
                } else {
                    "timeout"
                };
                self.metrics.redelivered(&p.expiry.source, cause, *attempt);
            }
            Action::DeadLetter { reason, detail } => {
                let dlq = self.config.dlq_topic_for(&p.expiry.source.topic);
                self.metrics
                    .dead_lettered(&p.expiry.source, &dlq, *reason, detail);
            }
        }
    }

    /// Reads every source record, retrying errors that may pass, and builds the copies.
    fn read_sources(&self, expiries: Vec<Expiry>) -> Vec<Pending> {
        let mut groups: BTreeMap<(String, i32), Vec<Expiry>> = BTreeMap::new();
        for e in expiries {
            groups
                .entry((e.source.topic.clone(), e.source.partition))
                .or_default()
                .push(e);
        }
        let mut out = Vec::new();
        for ((topic, partition), mut group) in groups {
            group.sort_by_key(|e| e.source.offset);
            let mut results = self.read_group(&topic, partition, &group);
            for e in group {
                let action = decide(&e, self.config.max_deliveries);
                let outcome = results.remove(&e.source.offset);
                out.push(self.pending(e, action, outcome));
            }
        }
        out
    }

    fn read_group(
        &self,
        topic: &str,
        partition: i32,
        group: &[Expiry],
    ) -> BTreeMap<i64, ReadOutcome> {
        let mut results = BTreeMap::new();
        let mut backoff = Duration::from_millis(100);
        loop {
            let left: Vec<i64> = group
                .iter()
                .map(|e| e.source.offset)
                .filter(|o| !results.contains_key(o))
                .collect();
            if left.is_empty() || self.stopping() {
                return results;
            }
            let (done, error) = self.reader.read_many(topic, partition, &left);
            results.extend(done);
            if let Some(error) = error {
                let at = SourceRef::new(topic, partition, left.first().copied().unwrap_or(-1));
                self.metrics.source_read_error(&at, &error);
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }

    fn pending(&self, expiry: Expiry, action: Action, outcome: Option<ReadOutcome>) -> Pending {
        let (action, record) = match outcome {
            Some(ReadOutcome::Found(m)) => (action, Some(m)),
            Some(ReadOutcome::Gone(why)) => (
                Action::DeadLetter {
                    reason: DlqReason::SourceUnreadable,
                    detail: why,
                },
                None,
            ),
            // Only when stopping: nothing is produced, the delivery stays in flight.
            None => {
                return Pending {
                    expiry,
                    action,
                    copy: None,
                }
            }
        };
        let copy = Some(self.build_copy(&expiry, &action, record.as_ref()));
        Pending {
            expiry,
            action,
            copy,
        }
    }

    fn build_copy(
        &self,
        expiry: &Expiry,
        action: &Action,
        record: Option<&OwnedMessage>,
    ) -> Outgoing {
        let original = record.map_or_else(Vec::new, |m| headers::from_kafka(m.headers()));
        let source = &expiry.source;
        let (topic, partition, headers) = match action {
            Action::Redeliver { attempt } => (
                source.topic.clone(),
                Some(source.partition),
                copy_headers(&original, source, *attempt, None),
            ),
            Action::DeadLetter { reason, detail } => (
                self.config.dlq_topic_for(&source.topic),
                None,
                copy_headers(&original, source, expiry.attempt, Some((*reason, detail))),
            ),
        };
        Outgoing {
            topic,
            partition,
            key: record.and_then(|m| m.key().map(<[u8]>::to_vec)),
            payload: record.and_then(|m| m.payload().map(<[u8]>::to_vec)),
            headers,
        }
    }

    /// Produces every record and waits until all are durable, retrying failures with back-off.
    /// Returns false only if a stop was requested first.
    fn send_all(&self, what: &str, records: &[Outgoing]) -> bool {
        let mut left: Vec<&Outgoing> = records.iter().collect();
        let mut backoff = Duration::from_millis(100);
        while !left.is_empty() {
            if self.stopping() {
                return false;
            }
            let results = block_on(join_all(left.iter().map(|r| self.send(r))));
            let mut failed = Vec::new();
            for (r, result) in left.into_iter().zip(results) {
                if let Err(e) = result {
                    self.metrics.produce_error(what, &r.topic, &e);
                    failed.push(r);
                }
            }
            if !failed.is_empty() {
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
            left = failed;
        }
        true
    }

    async fn send(&self, r: &Outgoing) -> Result<(), rdkafka::error::KafkaError> {
        let mut record = FutureRecord::to(&r.topic).headers(headers::to_kafka(&r.headers));
        if let Some(p) = r.partition {
            record = record.partition(p);
        }
        if let Some(k) = &r.key {
            record = record.key(k);
        }
        if let Some(v) = &r.payload {
            record = record.payload(v);
        }
        self.producer
            .send(record, Duration::from_secs(5))
            .await
            .map(|_| ())
            .map_err(|(e, _)| e)
    }
}

fn end_marker(markers_topic: &str, partition: i32, source: &SourceRef) -> Outgoing {
    Outgoing {
        topic: markers_topic.to_string(),
        partition: Some(partition),
        key: None,
        payload: Some(encode(&Marker::End {
            source: source.clone(),
        })),
        headers: Vec::new(),
    }
}
