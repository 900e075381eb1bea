//! Reading ahead: the records of deliveries that fall due soon are read before their deadline.
//!
//! A redelivery pass used to read each due record back from its source partition and then
//! produce its copy: two round trips to the broker, one after the other, for every pass. The
//! tracker knows every deadline in advance, so the markers consumer lists the records due in
//! the next [`TrackerConfig::read_ahead`] (`PartitionState::read_ahead`) and hands them to this
//! module's thread, which reads them with a source reader of its own into a [`ReadAheadCache`].
//! When they fall due, the pass takes them from there and only produces the copies.
//!
//! Nothing here decides anything: a record read ahead is redelivered only if its delivery
//! falls due as it would have without reading ahead, and a record missing from the cache (not
//! read in time, gone, evicted) is read by the pass as before. The cost is reading the records
//! of deliveries settled in their last moments, which the `unused` outcome of
//! `redelivery_read_ahead_records_total` counts. Records that close to their deadline are
//! almost all abandoned ones.
//!
//! The cache is bounded: at most [`MAX_BYTES`] of records, each kept at most the read-ahead
//! window plus [`KEEP_EXTRA`]. Hints that find the queue or the cache full are skipped and
//! counted; their records are read when due.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use rdkafka::message::{Headers, Message, OwnedMessage};

use crate::marker::SourceRef;
use crate::tracker::config::TrackerConfig;
use crate::tracker::error::TrackerError;
use crate::tracker::metrics::work::ReadAhead;
use crate::tracker::metrics::Metrics;
use crate::tracker::redeliver::source_reader::{ReadOutcome, SourceReader};

/// Most bytes of records the cache holds.
pub const MAX_BYTES: usize = 64 << 20;

/// How much longer than the read-ahead window a record is kept for its pass: a pass may start
/// late when the worker is busy, and a record evicted too soon would only be read again.
pub const KEEP_EXTRA: Duration = Duration::from_secs(10);

/// Hint lists waiting for the reading thread; more are skipped.
const MAX_QUEUED_HINTS: usize = 64;

/// Most records the reading thread asks for in one read.
const MAX_READ: usize = 5_000;

/// What a record costs the cache beyond its bytes (the map entry, the message's fields).
const RECORD_OVERHEAD: usize = 160;

/// Records read ahead, waiting for their pass.
pub struct ReadAheadCache {
    inner: Mutex<Cache>,
    keep: Duration,
    metrics: Metrics,
}

#[derive(Default)]
struct Cache {
    records: HashMap<SourceRef, (OwnedMessage, usize, Instant)>,
    /// Insertion order, for eviction by age; an entry whose record was taken or replaced is
    /// skipped.
    order: VecDeque<(Instant, SourceRef)>,
    bytes: usize,
}

impl ReadAheadCache {
    /// An empty cache whose records are kept `keep` at most.
    pub fn new(keep: Duration, metrics: Metrics) -> Self {
        ReadAheadCache {
            inner: Mutex::new(Cache::default()),
            keep,
            metrics,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Cache> {
        // The cache holds copies of records that can be read again: a panic elsewhere while
        // it was held leaves nothing to protect.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes the record read ahead for `source`, if there is one.
    pub fn take(&self, source: &SourceRef) -> Option<OwnedMessage> {
        let mut c = self.lock();
        let (record, size, _) = c.records.remove(source)?;
        c.bytes -= size;
        drop(c);
        self.metrics.emit(ReadAhead {
            n: 1,
            outcome: "used",
        });
        Some(record)
    }

    /// Whether a record for `source` is waiting.
    fn has(&self, source: &SourceRef) -> bool {
        self.lock().records.contains_key(source)
    }

    /// Adds records read at `now`, after evicting those kept too long. Records beyond
    /// [`MAX_BYTES`] are skipped.
    fn insert(&self, records: Vec<(SourceRef, OwnedMessage)>, now: Instant) {
        let (mut unused, mut skipped, mut read) = (0, 0, 0);
        {
            let mut c = self.lock();
            unused += c.evict_older_than(now, self.keep);
            for (source, record) in records {
                let size = size_of_record(&record);
                if c.bytes + size > MAX_BYTES {
                    skipped += 1;
                    continue;
                }
                read += 1;
                c.bytes += size;
                c.order.push_back((now, source.clone()));
                if let Some((_, old, _)) = c.records.insert(source, (record, size, now)) {
                    c.bytes -= old;
                }
            }
        }
        self.metrics.emit(ReadAhead {
            n: read,
            outcome: "read",
        });
        self.metrics.emit(ReadAhead {
            n: unused,
            outcome: "unused",
        });
        self.metrics.emit(ReadAhead {
            n: skipped,
            outcome: "skipped",
        });
    }

    /// Records and bytes held, for tests.
    #[cfg(test)]
    fn held(&self) -> (usize, usize) {
        let c = self.lock();
        (c.records.len(), c.bytes)
    }
}

impl Cache {
    /// Drops the records inserted before `now - keep`; returns how many.
    fn evict_older_than(&mut self, now: Instant, keep: Duration) -> usize {
        let mut evicted = 0;
        while let Some((at, _)) = self.order.front() {
            if now.saturating_duration_since(*at) <= keep {
                break;
            }
            let Some((at, source)) = self.order.pop_front() else {
                break;
            };
            // Only the entry this order item stands for: the record may have been taken, or
            // read again later.
            if self.records.get(&source).is_some_and(|(_, _, t)| *t == at) {
                if let Some((_, size, _)) = self.records.remove(&source) {
                    self.bytes -= size;
                    evicted += 1;
                }
            }
        }
        evicted
    }
}

fn size_of_record(m: &OwnedMessage) -> usize {
    let headers = m.headers().map_or(0, |h| {
        h.iter()
            .map(|h| h.key.len() + h.value.map_or(0, <[u8]>::len))
            .sum()
    });
    m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len) + headers + RECORD_OVERHEAD
}

/// The markers consumer's end: lists of records to read ahead.
pub struct Hints {
    tx: SyncSender<Vec<SourceRef>>,
    metrics: Metrics,
}

impl Hints {
    /// Hands `sources` to the reading thread without waiting; skipped (and counted) when its
    /// queue is full.
    pub fn send(&self, sources: Vec<SourceRef>) {
        if sources.is_empty() {
            return;
        }
        let n = sources.len();
        match self.tx.try_send(sources) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => self.metrics.emit(ReadAhead {
                n,
                outcome: "skipped",
            }),
            // The reading thread is gone (stopping): the passes read for themselves.
            Err(TrySendError::Disconnected(_)) => {}
        }
    }
}

/// Starts the reading thread, unless `config.read_ahead` is zero. Returns the hints' sender
/// for the markers consumer and the cache for the redelivery worker. The thread ends when the
/// sender is dropped or `stop` is set.
pub fn start(
    config: &TrackerConfig,
    metrics: &Metrics,
    stop: Arc<AtomicBool>,
) -> Result<Option<(Hints, Arc<ReadAheadCache>)>, TrackerError> {
    if config.read_ahead.is_zero() {
        return Ok(None);
    }
    let cache = Arc::new(ReadAheadCache::new(
        config.read_ahead + KEEP_EXTRA,
        metrics.clone(),
    ));
    let (tx, rx) = mpsc::sync_channel(MAX_QUEUED_HINTS);
    let reader = Reader {
        source: SourceReader::new(config, metrics)?,
        config: config.clone(),
        cache: cache.clone(),
        stop,
    };
    std::thread::Builder::new()
        .name("read-ahead".into())
        .spawn(move || reader.run(rx))
        .map_err(|e| TrackerError::Thread(format!("the read-ahead thread: {e}")))?;
    let hints = Hints {
        tx,
        metrics: metrics.clone(),
    };
    Ok(Some((hints, cache)))
}

/// The reading thread.
struct Reader {
    source: SourceReader,
    config: TrackerConfig,
    cache: Arc<ReadAheadCache>,
    stop: Arc<AtomicBool>,
}

impl Reader {
    fn run(mut self, hints: Receiver<Vec<SourceRef>>) {
        loop {
            let first = match hints.recv_timeout(Duration::from_secs(1)) {
                Ok(h) => h,
                Err(RecvTimeoutError::Timeout) if !self.stop.load(Ordering::Relaxed) => continue,
                Err(_) => return,
            };
            if self.stop.load(Ordering::Relaxed) {
                return;
            }
            // Everything queued meanwhile goes into the same read.
            let mut wanted = first;
            while wanted.len() < MAX_READ {
                match hints.try_recv() {
                    Ok(more) => wanted.extend(more),
                    Err(_) => break,
                }
            }
            self.read(wanted);
        }
    }

    /// Reads `wanted` (what is not cached already), one assignment per topic.
    fn read(&mut self, wanted: Vec<SourceRef>) {
        let mut topics: BTreeMap<Arc<str>, BTreeMap<i32, Vec<i64>>> = BTreeMap::new();
        for s in wanted {
            if !self.cache.has(&s) {
                let partitions = topics.entry(s.topic.clone()).or_default();
                partitions.entry(s.partition).or_default().push(s.offset);
            }
        }
        let (mut asked, mut got) = (0, 0);
        for (topic, partitions) in topics {
            let wanted: Vec<(i32, Vec<i64>)> = partitions
                .into_iter()
                .map(|(p, mut offsets)| {
                    offsets.sort_unstable();
                    offsets.dedup();
                    (p, offsets)
                })
                .collect();
            asked += wanted.iter().map(|(_, o)| o.len()).sum::<usize>();
            let mut found = Vec::new();
            for (partition, outcomes) in self.source.read_partitions(&topic, &wanted) {
                for (offset, outcome) in outcomes {
                    // Gone records are left to the pass, which dead-letters them with reason.
                    if let ReadOutcome::Found(m) = outcome {
                        found.push((SourceRef::new(topic.clone(), partition, offset), m));
                    }
                }
            }
            got += found.len();
            self.cache.insert(found, Instant::now());
        }
        if asked > 0 && got == 0 {
            // An idle reader can stay stuck after a broker outage (see `SourceReader::reset`);
            // a fresh one costs little next to reads that keep coming back empty.
            if let Err(e) = self.source.reset(&self.config) {
                tracing::debug!(error = %e, "read-ahead reader reset failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::Timestamp;

    fn record(offset: i64, bytes: usize) -> (SourceRef, OwnedMessage) {
        let m = OwnedMessage::new(
            Some(vec![7; bytes]),
            None,
            "t".into(),
            Timestamp::NotAvailable,
            0,
            offset,
            None,
        );
        (SourceRef::new("t", 0, offset), m)
    }

    fn cache(keep: Duration) -> ReadAheadCache {
        ReadAheadCache::new(keep, Metrics::new())
    }

    #[test]
    fn a_record_is_taken_once() {
        let c = cache(Duration::from_secs(1));
        c.insert(vec![record(5, 10)], Instant::now());
        assert!(c.take(&SourceRef::new("t", 0, 4)).is_none());
        assert_eq!(
            c.take(&SourceRef::new("t", 0, 5)).map(|m| m.offset()),
            Some(5)
        );
        assert!(c.take(&SourceRef::new("t", 0, 5)).is_none());
        assert_eq!(c.held(), (0, 0));
    }

    #[test]
    fn records_kept_too_long_are_evicted_at_the_next_insert() {
        let c = cache(Duration::from_millis(100));
        let t0 = Instant::now();
        c.insert(vec![record(1, 10), record(2, 10)], t0);
        assert!(c.take(&SourceRef::new("t", 0, 2)).is_some());
        c.insert(vec![record(3, 10)], t0 + Duration::from_millis(50));
        assert_eq!(c.held().0, 2, "nothing is old yet");
        c.insert(vec![record(4, 10)], t0 + Duration::from_millis(120));
        assert!(
            !c.has(&SourceRef::new("t", 0, 1)),
            "record 1 was kept too long"
        );
        assert!(c.has(&SourceRef::new("t", 0, 3)));
        assert!(c.has(&SourceRef::new("t", 0, 4)));
    }

    #[test]
    fn a_record_read_again_is_not_evicted_by_its_first_read() {
        let c = cache(Duration::from_millis(100));
        let t0 = Instant::now();
        c.insert(vec![record(1, 10)], t0);
        c.insert(vec![record(1, 10)], t0 + Duration::from_millis(90));
        c.insert(vec![], t0 + Duration::from_millis(150));
        assert!(c.has(&SourceRef::new("t", 0, 1)));
        assert_eq!(c.held().1, 10 + RECORD_OVERHEAD);
    }

    #[test]
    fn records_beyond_the_byte_budget_are_skipped() {
        let c = cache(Duration::from_secs(1));
        let big = MAX_BYTES / 2;
        c.insert(
            vec![record(1, big), record(2, big), record(3, 10)],
            Instant::now(),
        );
        assert!(c.has(&SourceRef::new("t", 0, 1)));
        assert!(!c.has(&SourceRef::new("t", 0, 2)), "over the budget");
        assert!(c.has(&SourceRef::new("t", 0, 3)), "a small one still fits");
        assert!(c.held().1 <= MAX_BYTES);
    }
}
