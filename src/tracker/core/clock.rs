//! Partition time: the broker's clock as seen through marker timestamps.
//!
//! Deadlines are marker timestamps plus a timeout, and marker timestamps come from the broker
//! (`LogAppendTime`). So "now" for a markers partition is the newest marker timestamp seen,
//! advanced by the local monotonic clock since that marker was read. A wall-clock jump on the
//! tracker's host changes nothing, and a restarted tracker does not trust its own host clock.
//!
//! After a long quiet spell the newest marker may be old; the tracker writes a Tick marker when
//! it takes a partition, so the clock is fresh before any deadline is acted on.
//!
//! **Jumps.** Partition time only moves forward, so one marker stamped far in the future (a
//! broker clock step, a new leader whose clock runs fast, a `CreateTime` topic written by a
//! host with a wrong clock) would make every later delivery look due the moment it starts.
//! So a timestamp more than [`MAX_AHEAD`] ahead of what the clock allows is an *outlier*: it
//! does not move partition time, and the marker is applied as if stamped at partition time.
//! What the clock allows is partition time once the partition has caught up, and the host's
//! wall clock while it replays (replayed markers legitimately jump ahead of each other; the
//! catch-up Tick then sets the clock to the broker's time, even backwards). If every reading
//! for [`CONFIRM_AFTER`] of local time is an outlier, the broker's clock really moved: partition
//! time takes the least of those readings, and says so.

use std::time::{Duration, Instant};

/// How far ahead of the clock a marker timestamp may be and still be believed.
pub const MAX_AHEAD: Duration = Duration::from_secs(30);
/// How long only outliers must be read before the clock accepts that time moved.
pub const CONFIRM_AFTER: Duration = Duration::from_secs(60);

/// The clock of one markers partition.
#[derive(Debug, Clone, Copy)]
pub struct PartitionClock {
    newest_ms: Option<i64>,
    read_at: Instant,
    /// Outliers read since the last believable timestamp: when the first came, and the least.
    outliers: Option<(Instant, i64)>,
}

impl Default for PartitionClock {
    fn default() -> Self {
        PartitionClock {
            newest_ms: None,
            read_at: Instant::now(),
            outliers: None,
        }
    }
}

/// What the clock made of a timestamp.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reading {
    /// Believed (it may or may not have moved the clock forward): apply the marker at it.
    Believed,
    /// Too far ahead of what the clock allows: apply the marker at `apply_at_ms` instead.
    Outlier {
        /// How far ahead of the bound it was.
        ahead_ms: i64,
        /// The time to apply the marker at: partition time.
        apply_at_ms: i64,
    },
    /// Outliers for [`CONFIRM_AFTER`]: the clock moved from `from_ms` to them.
    Moved {
        /// Partition time (or the bound) before.
        from_ms: i64,
    },
}

impl PartitionClock {
    /// Records a marker timestamp read at `read_at`. `wall_ms` is the host's wall clock, used
    /// as the bound only while `replaying` (see the module docs). Older timestamps than the
    /// newest seen are believed but do not move the clock, so it never runs backwards.
    pub fn observe(
        &mut self,
        timestamp_ms: i64,
        read_at: Instant,
        wall_ms: i64,
        replaying: bool,
    ) -> Reading {
        let projected = self.now_ms(read_at);
        let basis = match projected {
            Some(now) if !replaying => now,
            _ => wall_ms,
        };
        let ahead = timestamp_ms.saturating_sub(basis.saturating_add(ms(MAX_AHEAD)));
        if ahead <= 0 {
            self.outliers = None;
            if projected.is_none_or(|now| timestamp_ms >= now) {
                self.newest_ms = Some(timestamp_ms);
                self.read_at = read_at;
            }
            return Reading::Believed;
        }
        let (since, least) = match self.outliers {
            Some((since, least)) => (since, least.min(timestamp_ms)),
            None => (read_at, timestamp_ms),
        };
        if read_at.saturating_duration_since(since) >= CONFIRM_AFTER {
            self.outliers = None;
            self.newest_ms = Some(least);
            self.read_at = read_at;
            return Reading::Moved { from_ms: basis };
        }
        self.outliers = Some((since, least));
        Reading::Outlier {
            ahead_ms: ahead,
            apply_at_ms: projected.unwrap_or(wall_ms).min(timestamp_ms),
        }
    }

    /// Sets partition time to `timestamp_ms` as read at `read_at`, even backwards: for the
    /// catch-up Tick, whose broker timestamp is the broker's time when this tracker took the
    /// partition, whatever replay met before it.
    pub fn reset(&mut self, timestamp_ms: i64, read_at: Instant) {
        self.newest_ms = Some(timestamp_ms);
        self.read_at = read_at;
        self.outliers = None;
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
        Some(self.read_at + Duration::from_millis(wait))
    }
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const DAY: i64 = 86_400_000;
    const WALL: i64 = 1_000_000;

    fn ready_at(t0: Instant, ts: i64) -> PartitionClock {
        let mut c = PartitionClock::default();
        assert_eq!(c.observe(ts, t0, ts, false), Reading::Believed);
        c
    }

    #[test]
    fn advances_with_the_monotonic_clock() {
        let t0 = Instant::now();
        let mut c = PartitionClock::default();
        assert_eq!(c.now_ms(t0), None);
        c.observe(1_000, t0, 1_000, false);
        assert_eq!(c.now_ms(t0 + Duration::from_millis(250)), Some(1_250));
        assert_eq!(c.instant_of(1_500), Some(t0 + Duration::from_millis(500)));
        assert_eq!(c.instant_of(900), Some(t0), "past deadlines are due now");
    }

    #[test]
    fn never_runs_backwards() {
        let t0 = Instant::now();
        let mut c = ready_at(t0, 5_000);
        c.observe(4_000, t0 + Duration::from_millis(10), WALL, false);
        assert_eq!(c.now_ms(t0 + Duration::from_millis(10)), Some(5_010));
        c.observe(6_000, t0 + Duration::from_millis(20), WALL, false);
        assert_eq!(c.now_ms(t0 + Duration::from_millis(20)), Some(6_000));
    }

    #[test]
    fn one_far_future_timestamp_does_not_move_the_clock() {
        let t0 = Instant::now();
        let mut c = ready_at(t0, WALL);
        let t1 = t0 + Duration::from_secs(1);
        let r = c.observe(WALL + DAY, t1, WALL + 1_000, false);
        assert_eq!(
            r,
            Reading::Outlier {
                ahead_ms: DAY - 1_000 - 30_000,
                apply_at_ms: WALL + 1_000
            }
        );
        assert_eq!(c.now_ms(t1), Some(WALL + 1_000));
        // A believable reading right after clears the suspicion...
        let t2 = t0 + Duration::from_secs(2);
        assert_eq!(c.observe(WALL + 2_000, t2, WALL, false), Reading::Believed);
        // ... so a later outlier starts its own confirmation window.
        let t3 = t0 + Duration::from_secs(70);
        assert!(matches!(
            c.observe(WALL + DAY, t3, WALL, false),
            Reading::Outlier { .. }
        ));
    }

    #[test]
    fn a_step_that_lasts_is_accepted_at_its_least_reading() {
        let t0 = Instant::now();
        let mut c = ready_at(t0, WALL);
        let hour = 3_600_000;
        for s in 1..60 {
            let at = t0 + Duration::from_secs(s as u64);
            let r = c.observe(WALL + hour + s * 1_000, at, WALL, false);
            assert!(matches!(r, Reading::Outlier { .. }), "second {s}: {r:?}");
        }
        let at = t0 + Duration::from_secs(61);
        assert_eq!(
            c.observe(WALL + hour + 61_000, at, WALL, false),
            Reading::Moved {
                from_ms: WALL + 61_000
            }
        );
        assert_eq!(c.now_ms(at), Some(WALL + hour + 1_000));
    }

    #[test]
    fn replay_is_bounded_by_the_wall_clock_and_the_tick_resets_it() {
        let t0 = Instant::now();
        let mut c = PartitionClock::default();
        // Replayed markers jump ahead of each other: believed while within the wall clock.
        assert_eq!(c.observe(WALL - 5 * DAY, t0, WALL, true), Reading::Believed);
        assert_eq!(c.observe(WALL - 10, t0, WALL, true), Reading::Believed);
        assert!(matches!(
            c.observe(WALL + DAY, t0, WALL, true),
            Reading::Outlier { apply_at_ms, .. } if apply_at_ms == WALL - 10
        ));
        c.reset(WALL - 3, t0);
        assert_eq!(c.now_ms(t0), Some(WALL - 3));
    }
}
