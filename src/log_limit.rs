//! One log line per kind of problem per interval, however many records have it.
//!
//! A poison producer can write a million bad records a minute; a line per record would bury
//! every other line and cost more than the skip itself. Each problem is still counted on every
//! occurrence (by the caller, in a metric); the log says how many lines it held back.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How often each kind of problem may be logged.
pub(crate) const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Rate limit per kind.
#[derive(Debug)]
pub(crate) struct LogLimit {
    interval: Duration,
    kinds: Mutex<HashMap<&'static str, Window>>,
}

#[derive(Debug)]
struct Window {
    logged_at: Instant,
    held_back: u64,
}

impl Default for LogLimit {
    fn default() -> Self {
        LogLimit::new(LOG_INTERVAL)
    }
}

impl LogLimit {
    /// At most one line per kind per `interval`.
    pub(crate) fn new(interval: Duration) -> Self {
        LogLimit {
            interval,
            kinds: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a line about `kind` may be written at `now`: `Some(n)` with the number of lines
    /// held back since the last one, or `None` (this one is held back).
    pub(crate) fn allow(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut kinds = self.kinds.lock().unwrap_or_else(|e| e.into_inner());
        match kinds.get_mut(kind) {
            Some(w) if now.saturating_duration_since(w.logged_at) < self.interval => {
                w.held_back += 1;
                None
            }
            Some(w) => {
                let held = std::mem::take(&mut w.held_back);
                w.logged_at = now;
                Some(held)
            }
            None => {
                kinds.insert(
                    kind,
                    Window {
                        logged_at: now,
                        held_back: 0,
                    },
                );
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_kind_per_interval_saying_how_many_were_held_back() {
        let limit = LogLimit::new(Duration::from_secs(10));
        let t0 = Instant::now();
        assert_eq!(limit.allow("a", t0), Some(0));
        assert_eq!(limit.allow("a", t0 + Duration::from_secs(1)), None);
        assert_eq!(limit.allow("a", t0 + Duration::from_secs(2)), None);
        assert_eq!(
            limit.allow("b", t0 + Duration::from_secs(2)),
            Some(0),
            "kinds apart"
        );
        assert_eq!(limit.allow("a", t0 + Duration::from_secs(10)), Some(2));
        assert_eq!(limit.allow("a", t0 + Duration::from_secs(11)), None);
    }
}
