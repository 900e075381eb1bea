//! When in-flight Starts were written: enough to tell the age of the oldest delivery without
//! a start time per delivery, in memory bounded by a constant, not by age.
//!
//! Samples (Start offset, timestamp) are taken at most one per `spacing` of partition time,
//! from the oldest item in flight on. One schedule due in 30 days under steady traffic would
//! keep millions of one-per-second samples, so past [`MAX_SAMPLES`] every other sample is
//! dropped and the spacing doubles: the age is then known to within the spacing, which stays
//! a small fraction of the span the index covers (1/512 of it at most).

use std::collections::VecDeque;

/// Samples kept at most (16 bytes each).
pub const MAX_SAMPLES: usize = 1024;
/// The finest spacing between samples, in ms.
const FINEST_MS: i64 = 1_000;

/// (Start offset, timestamp) samples in offset order.
#[derive(Debug, Clone)]
pub struct TimeIndex {
    samples: VecDeque<(i64, i64)>,
    spacing_ms: i64,
}

impl Default for TimeIndex {
    fn default() -> Self {
        TimeIndex {
            samples: VecDeque::new(),
            spacing_ms: FINEST_MS,
        }
    }
}

impl TimeIndex {
    /// An index holding `samples` (from a snapshot), thinned to the bound.
    pub fn from_samples(samples: Vec<(i64, i64)>) -> Self {
        let mut index = TimeIndex {
            samples: VecDeque::from(samples),
            spacing_ms: FINEST_MS,
        };
        while index.samples.len() > MAX_SAMPLES {
            index.thin();
        }
        index
    }

    /// The samples, oldest first.
    pub fn samples(&self) -> impl Iterator<Item = (i64, i64)> + '_ {
        self.samples.iter().copied()
    }

    /// Notes that the item started at `offset` was stamped `ts`.
    pub fn sample(&mut self, offset: i64, ts: i64) {
        if self
            .samples
            .back()
            .is_none_or(|&(_, t)| ts >= t.saturating_add(self.spacing_ms))
        {
            self.samples.push_back((offset, ts));
            if self.samples.len() > MAX_SAMPLES {
                self.thin();
            }
        }
    }

    /// Drops every other sample (keeping the oldest) and doubles the spacing.
    fn thin(&mut self) {
        let kept: VecDeque<(i64, i64)> = self.samples.iter().copied().step_by(2).collect();
        self.samples = kept;
        self.spacing_ms = self.spacing_ms.saturating_mul(2);
    }

    /// Nothing is in flight any more.
    pub fn clear(&mut self) {
        self.samples.clear();
        self.spacing_ms = FINEST_MS;
    }

    /// Forgets the samples no longer needed once the oldest item in flight started at
    /// `min_start`: all but the last at or before it.
    pub fn prune(&mut self, min_start: i64) {
        while self.samples.get(1).is_some_and(|&(o, _)| o <= min_start) {
            self.samples.pop_front();
        }
    }

    /// The timestamp of the last sample at or before `start`: when the item started at
    /// `start` was written, at the latest.
    pub fn stamped_by(&self, start: i64) -> Option<i64> {
        let after = self.samples.partition_point(|&(o, _)| o <= start);
        after
            .checked_sub(1)
            .and_then(|i| self.samples.get(i))
            .map(|&(_, t)| t)
    }

    /// Samples held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.samples.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_month_of_steady_traffic_stays_within_the_bound() {
        let mut index = TimeIndex::default();
        // One Start per second for 30 days behind one old item (offset 0).
        let month = 30 * 86_400;
        for s in 0..month {
            index.sample(s, s * 1_000);
            index.prune(0);
        }
        assert!(index.len() <= MAX_SAMPLES, "{} samples", index.len());
        assert_eq!(index.stamped_by(0), Some(0), "the oldest sample is kept");
        // Ages stay accurate to a small fraction of the span.
        let start = month / 2;
        let ts = index.stamped_by(start).unwrap();
        let error_ms = start * 1_000 - ts;
        assert!((0..=month * 1_000 / 512).contains(&error_ms), "{error_ms}");
    }

    #[test]
    fn fine_again_once_cleared() {
        let mut index = TimeIndex::from_samples((0..3_000).map(|i| (i, i * 1_000)).collect());
        assert!(index.len() <= MAX_SAMPLES);
        index.clear();
        index.sample(10, 0);
        index.sample(11, 1_000);
        assert_eq!(index.len(), 2);
    }
}
