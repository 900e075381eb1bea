//! Waiting on a condition. A test that sleeps for a guessed time is slow when the guess is
//! generous and flaky when it is not; one that waits for what it needs is neither.

use std::time::{Duration, Instant};

/// Checks `done` every `every` until it returns `Some`, for at most `limit`; `None` if it never
/// did. Blocking: an async test calls it from `spawn_blocking`.
pub fn until<T>(
    limit: Duration,
    every: Duration,
    mut done: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(v) = done() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(every);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn returns_the_first_value_the_condition_gives() {
        let mut calls = 0;
        let got = until(Duration::from_secs(5), Duration::from_millis(1), || {
            calls += 1;
            (calls == 3).then_some(calls)
        });
        assert_eq!(got, Some(3));
    }

    #[test]
    fn gives_up_after_the_limit() {
        let got: Option<()> = until(Duration::from_millis(20), Duration::from_millis(5), || None);
        assert_eq!(got, None);
    }
}
