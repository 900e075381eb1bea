//! The markers of format version 2: one marker for many records of one source partition.
//!
//! Version 1 costs a produced and a consumed record per Start and per End, which is most of
//! what a delivery costs. A version 2 Start covers a whole poll batch of one source partition,
//! and a Settle carries every Ack, Nack, Reject and KeepAlive the client gathered for one source
//! partition within a short window. The tracker applies a version 2 marker exactly as it would
//! apply the version 1 markers it stands for, in the order `docs/markers.md` gives.

/// Most records one version 2 marker may name, over all its lists. A decoder refuses more, so a
/// hostile marker cannot make the tracker allocate without bound; writers split at it.
pub const MAX_BATCH_RECORDS: usize = 65_536;

/// A set of offsets of one source partition, kept as ascending runs of consecutive offsets.
///
/// Poll batches are mostly consecutive offsets, so a batch of 500 records is one run: that is
/// what makes a batch Start a few bytes long.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Offsets {
    /// `(first, count)` runs, ascending, separated by at least one missing offset.
    runs: Vec<(i64, u64)>,
    len: usize,
}

impl Offsets {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds `offset`, which must be greater than every offset already in the set; returns false
    /// (and adds nothing) otherwise, or if the offset is negative.
    pub fn push(&mut self, offset: i64) -> bool {
        if offset < 0 {
            return false;
        }
        match self.runs.last_mut() {
            Some((first, count)) => {
                let next = first.saturating_add(*count as i64);
                if offset < next {
                    return false;
                }
                if offset == next {
                    *count += 1;
                } else {
                    self.runs.push((offset, 1));
                }
            }
            None => self.runs.push((offset, 1)),
        }
        self.len += 1;
        true
    }

    /// The set of `offsets` in any order, duplicates dropped.
    pub fn collect(offsets: impl IntoIterator<Item = i64>) -> Self {
        let mut all: Vec<i64> = offsets.into_iter().filter(|o| *o >= 0).collect();
        all.sort_unstable();
        all.dedup();
        let mut set = Offsets::new();
        for o in all {
            set.push(o);
        }
        set
    }

    /// Builds a set from runs that were checked by the decoder.
    pub(crate) fn from_runs(runs: Vec<(i64, u64)>, len: usize) -> Self {
        Offsets { runs, len }
    }

    /// The runs of consecutive offsets: `(first, count)`, ascending.
    pub fn runs(&self) -> &[(i64, u64)] {
        &self.runs
    }

    /// The greatest offset, if any.
    pub fn last(&self) -> Option<i64> {
        self.runs
            .last()
            .map(|&(first, count)| first + count as i64 - 1)
    }

    /// Number of offsets.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True if the set has no offset.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// True if `offset` is in the set.
    pub fn contains(&self, offset: i64) -> bool {
        let i = self.runs.partition_point(|(first, _)| *first <= offset);
        i > 0 && {
            let (first, count) = self.runs[i - 1];
            offset - first < count as i64
        }
    }

    /// The offsets, ascending.
    pub fn iter(&self) -> impl Iterator<Item = i64> + '_ {
        self.runs
            .iter()
            .flat_map(|&(first, count)| (0..count as i64).map(move |i| first + i))
    }
}

/// A version 2 Start: deliveries of many records of one source partition began.
///
/// Every record gets `timeout_ms` and attempt 1 unless an exception names it: copies carry
/// their attempt, and a record whose `kr-timeout-ms` header overrode the default carries its
/// own timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StartBatch {
    /// Topic of the records.
    pub topic: String,
    /// Partition of the records.
    pub partition: i32,
    /// Timeout of every record without its own, in milliseconds.
    pub timeout_ms: u32,
    /// The records' offsets.
    pub offsets: Offsets,
    /// `(offset, attempt)` for the records whose attempt is not 1, ascending by offset.
    pub attempts: Vec<(i64, u32)>,
    /// `(offset, timeout_ms)` for the records with their own timeout, ascending by offset.
    pub timeouts: Vec<(i64, u32)>,
}

impl StartBatch {
    /// Each record as `(offset, timeout_ms, attempt)`, ascending by offset.
    pub fn records(&self) -> impl Iterator<Item = (i64, u32, u32)> + '_ {
        let mut attempts = self.attempts.iter().peekable();
        let mut timeouts = self.timeouts.iter().peekable();
        self.offsets.iter().map(move |offset| {
            let attempt = attempts.next_if(|(o, _)| *o == offset).map_or(1, |e| e.1);
            let timeout = timeouts
                .next_if(|(o, _)| *o == offset)
                .map_or(self.timeout_ms, |e| e.1);
            (offset, timeout, attempt)
        })
    }
}

/// A version 2 settlement: many records of one source partition settled or kept alive.
///
/// The tracker applies the lists in this order: keep-alives, nacks, rejects, ends, as if each
/// entry were its own version 1 marker written in that order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settle {
    /// Topic of the records.
    pub topic: String,
    /// Partition of the records.
    pub partition: i32,
    /// `(offset, timeout_ms)`: new allowance from this marker on. Ascending by offset.
    pub keep_alives: Vec<(i64, u32)>,
    /// `(offset, delay_ms)`: redeliver after the delay. Ascending by offset.
    pub nacks: Vec<(i64, u64)>,
    /// `(offset, reason)`: to the dead-letter topic now. Ascending by offset.
    pub rejects: Vec<(i64, String)>,
    /// Acknowledged records.
    pub ends: Offsets,
}

impl Settle {
    /// An empty settlement for one source partition.
    pub fn new(topic: impl Into<String>, partition: i32) -> Self {
        Settle {
            topic: topic.into(),
            partition,
            ..Settle::default()
        }
    }

    /// Records named, over all lists.
    pub fn len(&self) -> usize {
        self.keep_alives.len() + self.nacks.len() + self.rejects.len() + self.ends.len()
    }

    /// True if it names no record.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_merge_consecutive_runs_and_refuse_going_back() {
        let mut s = Offsets::new();
        for o in [3, 4, 5, 9, 10] {
            assert!(s.push(o));
        }
        assert!(!s.push(10));
        assert!(!s.push(-1));
        assert_eq!(s.runs(), &[(3, 3), (9, 2)]);
        assert_eq!(s.len(), 5);
        assert!(s.contains(5) && s.contains(9) && !s.contains(6) && !s.contains(2));
        assert_eq!(s.iter().collect::<Vec<_>>(), vec![3, 4, 5, 9, 10]);
        assert_eq!(Offsets::collect([10, 3, 9, 4, 5, 4]), s);
    }

    #[test]
    fn start_batch_records_apply_exceptions_to_their_offsets_only() {
        let b = StartBatch {
            topic: "t".into(),
            partition: 0,
            timeout_ms: 100,
            offsets: Offsets::collect([1, 2, 3]),
            attempts: vec![(2, 4)],
            timeouts: vec![(3, 7)],
        };
        let got: Vec<_> = b.records().collect();
        assert_eq!(got, vec![(1, 100, 1), (2, 100, 4), (3, 7, 1)]);
    }
}
