//! Partition time: the broker's clock as seen through marker timestamps.
//!
//! Deadlines are marker timestamps plus a timeout, and marker timestamps come from the broker
//! (`LogAppendTime`). So "now" for a markers partition is the newest marker timestamp seen,
//! advanced by the local monotonic clock since that marker was read. A wall-clock jump on the
//! tracker's host changes nothing, and a restarted tracker does not trust its own host clock.
//!
//! After a long quiet spell the newest marker may be old; the tracker writes a Tick marker when
//! it takes a partition, so the clock is fresh before any deadline is acted on.

use std::time::Instant;

/// The clock of one markers partition.
#[derive(Debug, Clone, Copy)]
pub struct PartitionClock {
    newest_ms: Option<i64>,
    read_at: Instant,
}

impl Default for PartitionClock {
    fn default() -> Self {
        PartitionClock {
            newest_ms: None,
            read_at: Instant::now(),
        }
    }
}

impl PartitionClock {
    /// Records a marker timestamp read at `read_at`. Older timestamps than the newest seen are
    /// ignored, so the clock never runs backwards.
    pub fn observe(&mut self, timestamp_ms: i64, read_at: Instant) {
        let projected = self.now_ms(read_at);
        if projected.is_none_or(|now| timestamp_ms >= now) {
            self.newest_ms = Some(timestamp_ms);
            self.read_at = read_at;
        }
    }

    /// Partition time at local instant `at`, or `None` before any marker was seen.
    pub fn now_ms(&self, at: Instant) -> Option<i64> {
        let elapsed = at.saturating_duration_since(self.read_at).as_millis();
        let elapsed = i64::try_from(elapsed).unwrap_or(i64::MAX);
        self.newest_ms.map(|t| t.saturating_add(elapsed))
    }

    /// The local instant at which partition time reaches `deadline_ms`.
    pub fn instant_of(&self, deadline_ms: i64) -> Option<Instant> {
        let newest = self.newest_ms?;
        let wait = u64::try_from(deadline_ms.saturating_sub(newest)).unwrap_or(0);
        Some(self.read_at + std::time::Duration::from_millis(wait))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn advances_with_the_monotonic_clock() {
        let t0 = Instant::now();
        let mut c = PartitionClock::default();
        assert_eq!(c.now_ms(t0), None);
        c.observe(1_000, t0);
        assert_eq!(c.now_ms(t0 + Duration::from_millis(250)), Some(1_250));
        assert_eq!(c.instant_of(1_500), Some(t0 + Duration::from_millis(500)));
        assert_eq!(c.instant_of(900), Some(t0), "past deadlines are due now");
    }

    #[test]
    fn never_runs_backwards() {
        let t0 = Instant::now();
        let mut c = PartitionClock::default();
        c.observe(5_000, t0);
        c.observe(4_000, t0 + Duration::from_millis(10));
        assert_eq!(c.now_ms(t0 + Duration::from_millis(10)), Some(5_010));
        c.observe(6_000, t0 + Duration::from_millis(20));
        assert_eq!(c.now_ms(t0 + Duration::from_millis(20)), Some(6_000));
    }
}
