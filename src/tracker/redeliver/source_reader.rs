//! Reads original records back from their source topic, by offset, for redelivery.
//!
//! The markers never carry payloads, so a due delivery is redelivered by reading the record at
//! its offset. The reader checks the offset it got: a record that compaction or retention
//! removed comes back as [`ReadOutcome::Gone`], which takes the dead-letter path. Errors that
//! may pass (broker away, leader moving) are returned as `Err` and retried by the caller.
//!
//! **Looking back.** Apache Kafka answers a fetch at an offset inside a record batch with that
//! whole batch, and the client skips to the offset. Tansu 0.6 answers with the *next* batch (or
//! nothing, at the end of the log): the records of the batch from the offset on are skipped over
//! although they exist (README, "Tested brokers"). So before the reader calls a skipped-over
//! offset gone, or gives up on an offset nothing came back for, it reads again from further back
//! ([`SourceReader::look_back`]); only a fetch that starts at or before the offset and still
//! passes it proves the record gone. On Apache Kafka that costs one more read, and only for
//! records that really are gone.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::{BorrowedMessage, Message, OwnedMessage};
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};

use crate::tracker::config::TrackerConfig;
use crate::tracker::error::TrackerError;
use crate::tracker::metrics::{Metrics, Problem};

/// The result of reading one offset.
#[derive(Debug)]
pub enum ReadOutcome {
    /// The record, as it is in the source partition.
    Found(OwnedMessage),
    /// The record cannot be read and never will be; the text says why.
    Gone(String),
}

/// Why a read did not finish.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Nothing arrived in time; the broker may be away.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// librdkafka reported an error that may pass.
    #[error(transparent)]
    Kafka(#[from] KafkaError),
}

/// Keeps librdkafka's "end of partition" notices, which this reader asks for and handles
/// itself, out of the error log, and counts the other errors librdkafka reports to it.
pub(crate) struct ReaderContext {
    metrics: Metrics,
}

impl rdkafka::ClientContext for ReaderContext {
    fn error(&self, error: KafkaError, reason: &str) {
        if matches!(error, KafkaError::PartitionEOF(_))
            || error.rdkafka_error_code() == Some(RDKafkaErrorCode::PartitionEOF)
        {
            tracing::trace!(%error, reason, "source reader reached the end of a partition");
        } else {
            self.metrics.emit(Problem::SourceReaderError {
                error: &error,
                reason,
            });
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ReaderContext {}

/// A group-less consumer used only to fetch records by offset.
pub struct SourceReader {
    consumer: BaseConsumer<ReaderContext>,
    timeout: Duration,
    metrics: Metrics,
}

pub(crate) fn reader_consumer(
    config: &TrackerConfig,
    metrics: &Metrics,
) -> Result<BaseConsumer<ReaderContext>, TrackerError> {
    config
        .client_config(&[
            ("group.id", &format!("{}-reader", config.group_id)),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("enable.partition.eof", "true"),
            // Never jump elsewhere when the offset is gone: report it.
            ("auto.offset.reset", "error"),
            // Reads are one-off: never let the broker hold a fetch open waiting for more.
            ("fetch.wait.max.ms", "1"),
            // Wanted records lie close together; a big prefetch only makes each read wade
            // through records nobody asked for (one partition's surplus queues ahead of the
            // next partition's wanted record).
            ("max.partition.fetch.bytes", "65536"),
            ("isolation.level", "read_committed"),
        ])
        .create_with_context(ReaderContext {
            metrics: metrics.clone(),
        })
        .map_err(TrackerError::kafka("creating the source reader"))
}

/// Offsets further apart than this are fetched with a new assignment rather than by reading
/// through the records between them.
const MAX_SCAN_GAP: i64 = 256;

/// How far back [`SourceReader::look_back`] goes at most: far beyond any record batch a
/// producer writes (librdkafka's default `batch.num.messages` is 10,000).
const MAX_LOOK_BACK: i64 = 65_536;

/// How long a read waits for an answer before it is given up (and retried by the worker, with
/// a fresh consumer): a healthy broker answers in milliseconds. 10 s until 2026-12-01; a read
/// that a broker never answers (Tansu, at the end of a partition) then held every pass for 20 s.
const READ_WAIT: Duration = Duration::from_secs(2);

/// How long one step of [`SourceReader::look_back`] waits. Tansu answers a fetch inside its
/// last batch with nothing, so every step short of the batch's start waits this long: with
/// [`READ_WAIT`] a read in the middle of a 750-record batch took 16 s. An unanswered step goes
/// further back; when none answers (a slow broker), the read is retried by the worker.
const LOOK_BACK_WAIT: Duration = Duration::from_millis(400);

/// The start of every "skipped over" reason ([`skipped_over`]): such an answer may come from a
/// broker that skips the rest of a batch, so it is checked by looking back.
const SKIPPED: &str = "skipped over: ";

/// What one look-back read showed.
enum Probe {
    /// The record, or proof that it is gone.
    Answer(ReadOutcome),
    /// The first record came after `wanted` (at this offset): the read began inside a batch.
    Overshot(i64),
    /// Nothing came back.
    Silent,
}

impl SourceReader {
    /// Creates the reader's consumer.
    pub fn new(config: &TrackerConfig, metrics: &Metrics) -> Result<Self, TrackerError> {
        let consumer = reader_consumer(config, metrics)?;
        // Connect now rather than on the first redelivery, which otherwise waits ~0.3 s for
        // the connection and metadata (and every delivery due meanwhile waits behind it).
        if let Err(e) = consumer.fetch_metadata(None, Duration::from_secs(2)) {
            tracing::debug!(error = %e, "source reader warm-up failed; it connects on first use");
        }
        Ok(SourceReader {
            consumer,
            timeout: READ_WAIT,
            metrics: metrics.clone(),
        })
    }

    /// Replaces the consumer with a new one.
    ///
    /// The reader sits idle between redeliveries, and after a broker outage librdkafka was
    /// seen to leave such an idle consumer reporting "all brokers down" for minutes after the
    /// broker was back (found by the fault-injection suite). A fresh consumer connects at once,
    /// so the worker starts over with one after a failed read.
    pub fn reset(&mut self, config: &TrackerConfig) -> Result<(), TrackerError> {
        self.consumer = reader_consumer(config, &self.metrics)?;
        Ok(())
    }

    /// Reads `offsets` (ascending) of one source partition. Returns one outcome per offset
    /// read before the first error, in order; on error, the offsets after those are unread.
    pub fn read_many(
        &self,
        topic: &str,
        partition: i32,
        offsets: &[i64],
    ) -> (Vec<(i64, ReadOutcome)>, Option<ReadError>) {
        let result = self.read_assigned(topic, partition, offsets);
        // Stop fetching: an idle assigned reader would ask the broker for more every
        // `fetch.wait.max.ms`, and the next read would wait for that fetch to come back.
        if let Err(e) = self.consumer.unassign() {
            tracing::debug!(error = %e, "source reader unassign failed");
        }
        result
    }

    fn read_assigned(
        &self,
        topic: &str,
        partition: i32,
        offsets: &[i64],
    ) -> (Vec<(i64, ReadOutcome)>, Option<ReadError>) {
        let mut out = Vec::with_capacity(offsets.len());
        let mut position: Option<i64> = None;
        for &wanted in offsets {
            if position.is_none_or(|p| wanted < p || wanted - p > MAX_SCAN_GAP) {
                if let Err(e) = self.assign(topic, partition, wanted) {
                    return (out, Some(e.into()));
                }
            }
            // After a look-back the consumer reads on from there: the next wanted offset,
            // likely in the same batch, is read through rather than fetched from inside it.
            let read = match self.next_at_or_after(topic, partition, wanted) {
                Ok((ReadOutcome::Gone(why), _)) if why.starts_with(SKIPPED) => {
                    let (outcome, next) = self
                        .look_back(topic, partition, wanted)
                        .unwrap_or((ReadOutcome::Gone(why), None));
                    position = next;
                    Ok(outcome)
                }
                Ok((outcome, next)) => {
                    position = next;
                    Ok(outcome)
                }
                Err(ReadError::Timeout(t)) => match self.look_back(topic, partition, wanted) {
                    Some((outcome, next)) => {
                        position = next;
                        Ok(outcome)
                    }
                    None => Err(ReadError::Timeout(t)),
                },
                Err(e) => Err(e),
            };
            match read {
                Ok(outcome) => out.push((wanted, outcome)),
                Err(e) => return (out, Some(e)),
            }
        }
        (out, None)
    }

    /// Reads `wanted` again from further back, for brokers that answer a fetch inside a record
    /// batch with the batch after it (see the module docs): from 1, 4, 16, ... offsets before
    /// it, down to the partition's first offset, until a fetch starts at or before `wanted`.
    /// `None` when no such fetch came back (the broker is away, say): the caller's own
    /// answer stands. With the outcome comes the offset the consumer reads next, if known.
    fn look_back(
        &self,
        topic: &str,
        partition: i32,
        wanted: i64,
    ) -> Option<(ReadOutcome, Option<i64>)> {
        let (low, _) = self
            .consumer
            .fetch_watermarks(topic, partition, READ_WAIT)
            .ok()?;
        let mut back: i64 = 1;
        loop {
            let from = wanted.saturating_sub(back).max(low);
            self.assign(topic, partition, from).ok()?;
            match self.probe(topic, partition, from, wanted) {
                Probe::Answer(outcome) => {
                    let next = matches!(outcome, ReadOutcome::Found(_)).then_some(wanted + 1);
                    return Some((outcome, next));
                }
                // Started inside a batch again: further back, unless there is no further.
                Probe::Overshot(first) if from <= low => {
                    return Some((ReadOutcome::Gone(skipped_over(wanted, first)), None))
                }
                Probe::Overshot(_) | Probe::Silent if from > low && back < MAX_LOOK_BACK => {
                    back = back.saturating_mul(4);
                }
                Probe::Overshot(_) | Probe::Silent => return None,
            }
        }
    }

    /// One read from `from` (assigned) towards `wanted`: what the first records say.
    fn probe(&self, topic: &str, partition: i32, from: i64, wanted: i64) -> Probe {
        let started = Instant::now();
        // Whether a record at or before `wanted` came first: then passing it proves it gone.
        let mut reached = false;
        loop {
            let left = LOOK_BACK_WAIT.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Probe::Silent;
            }
            match self.consumer.poll(crate::kafka::whole_ms(left)) {
                None => {}
                Some(Ok(m)) if m.topic() != topic || m.partition() != partition => {}
                Some(Ok(m)) if m.offset() == wanted => {
                    return Probe::Answer(ReadOutcome::Found(m.detach()))
                }
                Some(Ok(m)) if m.offset() < wanted => reached = true,
                Some(Ok(m)) if reached || from == wanted => {
                    return Probe::Answer(ReadOutcome::Gone(skipped_over(wanted, m.offset())))
                }
                Some(Ok(m)) => return Probe::Overshot(m.offset()),
                Some(Err(KafkaError::PartitionEOF(_))) if reached => {
                    return Probe::Answer(ReadOutcome::Gone(past_end(wanted)))
                }
                Some(Err(KafkaError::PartitionEOF(_))) => return Probe::Silent,
                Some(Err(e)) => {
                    return match gone_reason(&e, wanted) {
                        Some(why) => Probe::Answer(ReadOutcome::Gone(why)),
                        None => Probe::Silent,
                    }
                }
            }
        }
    }

    /// Reads `wanted` offsets (each list sorted) of several partitions of `topic` with one
    /// assignment, so the partitions are fetched together: one round trip for a whole
    /// redelivery pass instead of one per partition. Returns what was read per partition; an
    /// offset missing from the answer is left to [`Self::read_many`], which reads one
    /// partition at a time and so can tell which partition an error belongs to (librdkafka's
    /// consume errors name no topic, and some no partition).
    pub fn read_partitions(
        &self,
        topic: &str,
        wanted: &[(i32, Vec<i64>)],
    ) -> BTreeMap<i32, Vec<(i64, ReadOutcome)>> {
        let mut cursors: BTreeMap<i32, Cursor<'_>> = wanted
            .iter()
            .filter(|(_, offsets)| !offsets.is_empty())
            .map(|(p, offsets)| (*p, Cursor::new(offsets)))
            .collect();
        let mut tpl = TopicPartitionList::new();
        for (p, c) in &cursors {
            if tpl
                .add_partition_offset(topic, *p, Offset::Offset(c.offsets[0]))
                .is_err()
            {
                return BTreeMap::new();
            }
        }
        if self.consumer.assign(&tpl).is_err() {
            return BTreeMap::new();
        }
        let mut read = BTreeMap::new();
        let mut last_progress = Instant::now();
        while cursors.values().any(|c| !c.done()) {
            let left = self.timeout.saturating_sub(last_progress.elapsed());
            if left.is_zero() {
                break;
            }
            match self.consumer.poll(crate::kafka::whole_ms(left)) {
                None => {}
                Some(Ok(m)) if m.topic() != topic => {}
                Some(Ok(m)) => {
                    let Some(c) = cursors.get_mut(&m.partition()) else {
                        continue;
                    };
                    let before = c.next;
                    c.take(&m);
                    if c.next != before {
                        last_progress = Instant::now();
                    }
                    if !self.jump_if_far(topic, &m, c) {
                        // A failed seek: what this partition read so far is its answer.
                        if let Some(c) = cursors.remove(&m.partition()) {
                            read.insert(m.partition(), c.out);
                        }
                    }
                }
                Some(Err(KafkaError::PartitionEOF(p))) => {
                    if let Some(c) = cursors.get_mut(&p) {
                        c.past_end();
                        last_progress = Instant::now();
                    }
                }
                // Not attributable to a partition: the careful path takes the rest.
                Some(Err(_)) => break,
            }
        }
        if let Err(e) = self.consumer.unassign() {
            tracing::debug!(error = %e, "source reader unassign failed");
        }
        for (p, c) in cursors {
            read.insert(p, c.out);
        }
        read
    }

    /// Far from the cursor's next wanted offset after `m`: seeks there instead of reading
    /// through. False only if that seek failed.
    fn jump_if_far(&self, topic: &str, m: &BorrowedMessage<'_>, c: &Cursor<'_>) -> bool {
        match c.offsets.get(c.next) {
            Some(&w) if w - (m.offset() + 1) > MAX_SCAN_GAP => self
                .consumer
                .seek(topic, m.partition(), Offset::Offset(w), SEEK_TIMEOUT)
                .is_ok(),
            _ => true,
        }
    }

    /// Asks the cluster whether `topic` still has `partition`. `Some(why)` when it does not:
    /// the records are gone for good. A consumer's metadata request never creates a topic.
    pub fn missing(&self, topic: &str, partition: i32) -> Option<String> {
        let md = self
            .consumer
            .fetch_metadata(Some(topic), Duration::from_secs(5))
            .ok()?;
        let t = md.topics().iter().find(|t| t.name() == topic);
        match t {
            None => Some(format!("the source topic `{topic}` no longer exists")),
            Some(t) if t.error().is_some() || t.partitions().is_empty() => Some(format!(
                "the source topic `{topic}` does not exist ({:?})",
                t.error()
            )),
            Some(t) if !t.partitions().iter().any(|p| p.id() == partition) => Some(format!(
                "the source topic `{topic}` has no partition {partition}"
            )),
            Some(_) => None,
        }
    }

    fn assign(&self, topic: &str, partition: i32, offset: i64) -> Result<(), KafkaError> {
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, partition, Offset::Offset(offset))?;
        self.consumer.assign(&tpl)
    }

    /// Polls until the record at `wanted` (or proof that it is gone) arrives. Returns the
    /// outcome and the offset the consumer will read next, if known.
    fn next_at_or_after(
        &self,
        topic: &str,
        partition: i32,
        wanted: i64,
    ) -> Result<(ReadOutcome, Option<i64>), ReadError> {
        let started = Instant::now();
        loop {
            let left = self.timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(ReadError::Timeout(self.timeout));
            }
            match self.consumer.poll(crate::kafka::whole_ms(left)) {
                None => continue,
                Some(Ok(m)) if m.topic() != topic || m.partition() != partition => continue,
                Some(Ok(m)) if m.offset() < wanted => continue,
                Some(Ok(m)) if m.offset() == wanted => {
                    return Ok((ReadOutcome::Found(m.detach()), Some(wanted + 1)))
                }
                Some(Ok(m)) => {
                    let why = skipped_over(wanted, m.offset());
                    // The next wanted offset may be this very record: read it again.
                    return Ok((ReadOutcome::Gone(why), None));
                }
                Some(Err(e)) => {
                    if let Some(why) = gone_reason(&e, wanted) {
                        return Ok((ReadOutcome::Gone(why), None));
                    }
                    return Err(e.into());
                }
            }
        }
    }
}

/// Errors that prove the record can never be read.
/// How long a seek within an assigned partition may take.
const SEEK_TIMEOUT: Duration = Duration::from_secs(5);

/// One partition's progress through its wanted offsets in [`SourceReader::read_partitions`].
struct Cursor<'a> {
    offsets: &'a [i64],
    /// Index of the next wanted offset.
    next: usize,
    out: Vec<(i64, ReadOutcome)>,
}

impl<'a> Cursor<'a> {
    fn new(offsets: &'a [i64]) -> Self {
        Cursor {
            offsets,
            next: 0,
            out: Vec::with_capacity(offsets.len()),
        }
    }

    fn done(&self) -> bool {
        self.next >= self.offsets.len()
    }

    /// Takes a fetched record: the wanted one, or a sign that the wanted ones before it were
    /// skipped over (left to the careful path), or nothing (a record between wanted ones).
    fn take(&mut self, m: &BorrowedMessage<'_>) {
        while let Some(&wanted) = self.offsets.get(self.next) {
            if m.offset() < wanted {
                return;
            }
            self.next += 1;
            if m.offset() == wanted {
                self.out.push((wanted, ReadOutcome::Found(m.detach())));
                return;
            }
            // Skipped over: left out of the answer, so the careful path reads it again and
            // looks back before calling it gone (see the module docs).
        }
    }

    /// The partition ended before the remaining wanted offsets.
    fn past_end(&mut self) {
        while let Some(&wanted) = self.offsets.get(self.next) {
            self.next += 1;
            self.out.push((wanted, ReadOutcome::Gone(past_end(wanted))));
        }
    }
}

/// Why `wanted` is gone when the partition holds `next` (greater) where it should be.
fn skipped_over(wanted: i64, next: i64) -> String {
    format!(
        "{SKIPPED}offset {wanted} no longer exists (compacted, deleted or aborted); the next record is at {next}"
    )
}

fn past_end(wanted: i64) -> String {
    format!("offset {wanted} is past the end of the partition")
}

fn gone_reason(error: &KafkaError, wanted: i64) -> Option<String> {
    if let KafkaError::PartitionEOF(_) = error {
        return Some(past_end(wanted));
    }
    match error.rdkafka_error_code()? {
        RDKafkaErrorCode::AutoOffsetReset | RDKafkaErrorCode::OffsetOutOfRange => Some(format!(
            "offset {wanted} is out of range (removed by retention or the topic was recreated)"
        )),
        RDKafkaErrorCode::UnknownTopicOrPartition
        | RDKafkaErrorCode::UnknownTopic
        | RDKafkaErrorCode::UnknownPartition => {
            Some("the source topic or partition does not exist".to_string())
        }
        _ => None,
    }
}
