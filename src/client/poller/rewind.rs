//! Records to be polled again: after a failed Start, the consumer seeks back to it (or holds
//! its partition while the seek fails), and the batches polled since leave those records out.

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rdkafka::consumer::Consumer;
use rdkafka::Offset;

use crate::failpoint;
use crate::marker::SourceRef;

use super::{InFlight, Polled, Poller};

impl Poller {
    /// Makes `topic`/`partition` come again from `offset`: seeks back (or holds the partition
    /// if the seek fails), and tells the batches polled after this one (`later`), whose
    /// records past the offset will come again.
    pub(super) fn rewind(
        &self,
        topic: &str,
        partition: i32,
        offset: i64,
        later: &mut VecDeque<InFlight>,
    ) {
        if !self.seek_back(topic, partition, offset) {
            let mut held = self.held.borrow_mut();
            let at = held.entry((topic.to_string(), partition)).or_insert(offset);
            *at = (*at).min(offset);
        }
        for b in later.iter_mut() {
            b.rewound.push((topic.to_string(), partition, offset));
        }
    }

    /// Seeks `topic`/`partition` back to `offset`; false (logged) if that failed.
    pub(super) fn seek_back(&self, topic: &str, partition: i32, offset: i64) -> bool {
        let result = if failpoint::fails("seek") {
            Err(rdkafka::error::KafkaError::Seek("failpoint".into()))
        } else {
            self.consumer.seek(
                topic,
                partition,
                Offset::Offset(offset),
                Duration::from_secs(5),
            )
        };
        match result {
            Ok(()) => {
                self.check_resume_at(topic, partition, offset);
                true
            }
            Err(e) => {
                tracing::warn!(
                    error = %e,
                    topic,
                    partition,
                    offset,
                    "seek back failed; holding the partition (nothing of it from this offset on \
                     is handed out or committed) and trying again"
                );
                false
            }
        }
    }

    /// Whether `s` lies in a held partition at or after the record it must be re-read from.
    pub(super) fn is_held(&self, s: &SourceRef) -> bool {
        let held = self.held.borrow();
        // Almost always empty: then no key (a copy of the topic name) is built.
        !held.is_empty()
            && held
                .get(&(s.topic.to_string(), s.partition))
                .is_some_and(|&from| s.offset >= from)
    }

    /// Tries the seek of each held partition again. A partition no longer assigned is let go:
    /// its next owner starts from the committed offset, which never passed the held record.
    pub(super) fn retry_held(&self, pipeline: &mut VecDeque<InFlight>) {
        if self.held.borrow().is_empty() {
            return;
        }
        let assigned = self.consumer.assignment().ok();
        let held: Vec<((String, i32), i64)> = self
            .held
            .borrow()
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for ((topic, partition), offset) in held {
            let ours = assigned
                .as_ref()
                .is_none_or(|a| a.find_partition(&topic, partition).is_some());
            if ours && !self.seek_back(&topic, partition, offset) {
                continue;
            }
            self.held.borrow_mut().remove(&(topic.clone(), partition));
            // Batches polled while held may hold records past the seek: those come again.
            for b in pipeline.iter_mut() {
                b.rewound.push((topic.clone(), partition, offset));
            }
            tracing::info!(topic, partition, offset, ours, "held partition released");
        }
    }
}

/// The first (lowest) offset of each source partition in `batch`.
pub(super) fn first_offsets(batch: &[Polled]) -> BTreeMap<(String, i32), i64> {
    let mut firsts = BTreeMap::new();
    for p in batch {
        let e = firsts
            .entry((p.source.topic.to_string(), p.source.partition))
            .or_insert(p.source.offset);
        *e = (*e).min(p.source.offset);
    }
    firsts
}

/// Whether `s` lies in a partition range that was rewound after its batch was polled.
pub(super) fn is_rewound(rewound: &[(String, i32, i64)], s: &SourceRef) -> bool {
    rewound
        .iter()
        .any(|(t, p, o)| **t == *s.topic && *p == s.partition && s.offset >= *o)
}

/// Splits a batch into the records that may be handed over (in each source partition, those
/// before the first failed Start) and, per partition, the offset of that first failure.
pub(super) fn split_at_first_failure(
    batch: Vec<Polled>,
    durable: Vec<bool>,
) -> (Vec<Polled>, Vec<(String, i32, i64)>) {
    // Every Start durable is the rule: then no key (a copy of the topic name) is built.
    if durable.iter().all(|&ok| ok) {
        return (batch, Vec::new());
    }
    let mut first_failure: BTreeMap<(String, i32), i64> = BTreeMap::new();
    for (p, ok) in batch.iter().zip(&durable) {
        if !ok {
            let key = (p.source.topic.to_string(), p.source.partition);
            let e = first_failure.entry(key).or_insert(i64::MAX);
            *e = (*e).min(p.source.offset);
        }
    }
    let handed = batch
        .into_iter()
        .filter(|p| {
            first_failure
                .get(&(p.source.topic.to_string(), p.source.partition))
                .is_none_or(|&f| p.source.offset < f)
        })
        .collect();
    let failed = first_failure
        .into_iter()
        .map(|((t, p), o)| (t, p, o))
        .collect();
    (handed, failed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::poller::tests::{coords, polled};

    #[test]
    fn a_rewind_covers_its_partition_from_its_offset_on() {
        let rewound = vec![("a".to_string(), 0, 11)];
        let covered: Vec<_> = [
            ("a", 0, 10),
            ("a", 0, 11),
            ("a", 0, 12),
            ("a", 1, 11),
            ("b", 0, 11),
        ]
        .iter()
        .map(|&(t, p, o)| is_rewound(&rewound, &polled(t, p, o).source))
        .collect();
        assert_eq!(covered, vec![false, true, true, false, false]);
    }

    #[test]
    fn a_failed_start_holds_back_its_partition_from_that_record_on() {
        let batch = vec![
            polled("a", 0, 10),
            polled("a", 0, 11),
            polled("a", 1, 5),
            polled("a", 0, 12),
            polled("b", 0, 1),
            polled("a", 1, 6),
        ];
        let durable = vec![true, false, true, true, true, false];
        failpoint::hit("after-start-durable");
        let (handed, failed) = split_at_first_failure(batch, durable);
        // a/0: 11 failed, so 12 waits even though its own Start was durable.
        assert_eq!(
            coords(&handed),
            vec![("a".into(), 0, 10), ("a".into(), 1, 5), ("b".into(), 0, 1)]
        );
        assert_eq!(failed, vec![("a".into(), 0, 11), ("a".into(), 1, 6)]);
    }

    #[test]
    fn all_durable_hands_over_everything() {
        let batch = vec![polled("a", 0, 1), polled("a", 0, 2)];
        let (handed, failed) = split_at_first_failure(batch, vec![true, true]);
        assert_eq!(handed.len(), 2);
        assert!(failed.is_empty());
    }
}
