//! The retry policy: how long a nacked record waits before it comes back, and how many
//! deliveries it gets before it goes to the dead-letter topic.
//!
//! The delay travels in the Nack marker, so the tracker's deadline heap does the waiting: no
//! timer lives in the application, and a worker that crashes after its nack changes nothing.

use std::hash::{BuildHasher, Hash, Hasher};
use std::time::Duration;

/// How the delay grows from one delivery to the next.
#[derive(Debug, Clone, PartialEq)]
pub enum Backoff {
    /// The same delay every time.
    Fixed(Duration),
    /// `initial × multiplierⁿ⁻¹` after the n-th delivery, at most `max`, minus up to
    /// `jitter` (a fraction, 0 to 1) of it drawn at random so that records nacked together do
    /// not all come back at once.
    Exponential {
        /// Delay after the first delivery.
        initial: Duration,
        /// Growth per delivery (2 doubles it).
        multiplier: f64,
        /// The cap.
        max: Duration,
        /// Share of the delay that may be taken off at random (0 = none).
        jitter: f64,
    },
}

/// Per-consumer retry defaults ([`super::ConsumerConfig::retry`]), which a single delivery can
/// override ([`super::Delivery::nack_with`]).
///
/// ```
/// use std::time::Duration;
/// use kafka_redelivery::client::RetryPolicy;
///
/// let policy = RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(60))
///     .jitter(0.0)
///     .max_deliveries(5);
/// assert_eq!(policy.delay_after(1, 0.5), Duration::from_secs(1));
/// assert_eq!(policy.delay_after(3, 0.5), Duration::from_secs(4));
/// assert_eq!(policy.delay_after(30, 0.5), Duration::from_secs(60));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// How the delay grows.
    pub backoff: Backoff,
    /// Most deliveries of one record, the first included. A `nack()` of the last one sends
    /// the record to the dead-letter topic instead. `None` leaves the limit to the tracker's
    /// `--max-deliveries`. A record's `kr-max-deliveries` header can lower it per message.
    pub max_deliveries: Option<u32>,
}

impl Default for RetryPolicy {
    /// Exponential from 1 s, doubling, at most 5 min, 20 % jitter; no limit of its own.
    fn default() -> Self {
        RetryPolicy::exponential(Duration::from_secs(1), Duration::from_secs(300))
    }
}

impl RetryPolicy {
    /// The same delay after every delivery.
    pub fn fixed(delay: Duration) -> Self {
        RetryPolicy {
            backoff: Backoff::Fixed(delay),
            max_deliveries: None,
        }
    }

    /// Doubling from `initial` up to `max`, with 20 % jitter.
    pub fn exponential(initial: Duration, max: Duration) -> Self {
        RetryPolicy {
            backoff: Backoff::Exponential {
                initial,
                multiplier: 2.0,
                max,
                jitter: 0.2,
            },
            max_deliveries: None,
        }
    }

    /// Sets the growth factor of an exponential policy (values below 1 are taken as 1).
    pub fn multiplier(mut self, factor: f64) -> Self {
        if let Backoff::Exponential { multiplier, .. } = &mut self.backoff {
            *multiplier = factor.max(1.0);
        }
        self
    }

    /// Sets the jitter of an exponential policy, clamped to 0..=1.
    pub fn jitter(mut self, share: f64) -> Self {
        if let Backoff::Exponential { jitter, .. } = &mut self.backoff {
            *jitter = share.clamp(0.0, 1.0);
        }
        self
    }

    /// Sets the most deliveries per record.
    pub fn max_deliveries(mut self, n: u32) -> Self {
        self.max_deliveries = Some(n.clamp(1, crate::headers::checked::MAX_ATTEMPT));
        self
    }

    /// The delay before the next delivery when delivery number `attempt` (1 = first) is
    /// nacked. `unit_random` in `[0, 1)` draws the jitter.
    pub fn delay_after(&self, attempt: u32, unit_random: f64) -> Duration {
        match &self.backoff {
            Backoff::Fixed(d) => *d,
            Backoff::Exponential {
                initial,
                multiplier,
                max,
                jitter,
            } => {
                let steps = attempt.saturating_sub(1).min(1_000) as i32;
                let grown = initial.as_secs_f64() * multiplier.powi(steps);
                let capped = grown.min(max.as_secs_f64());
                let taken = capped * jitter * unit_random.clamp(0.0, 1.0);
                Duration::from_secs_f64((capped - taken).max(0.0))
            }
        }
    }

    /// The limit for a record whose `kr-max-deliveries` header says `per_message`: the lower
    /// of the two.
    pub fn limit(&self, per_message: Option<u32>) -> Option<u32> {
        match (self.max_deliveries, per_message) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// A number in `[0, 1)` that differs per record and per call, for jitter. Hashing with a
/// randomly keyed hasher is enough here and needs no random-number dependency.
pub(crate) fn unit_random(seed: impl Hash) -> f64 {
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    seed.hash(&mut h);
    std::time::SystemTime::now().hash(&mut h);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn exponential_grows_by_its_multiplier_up_to_the_cap() {
        let p = RetryPolicy::exponential(S, 10 * S)
            .multiplier(3.0)
            .jitter(0.0);
        let delays: Vec<Duration> = (1..=4).map(|a| p.delay_after(a, 0.9)).collect();
        assert_eq!(delays, vec![S, 3 * S, 9 * S, 10 * S]);
    }

    #[test]
    fn jitter_only_shortens_and_never_below_its_share() {
        let p = RetryPolicy::exponential(10 * S, 100 * S).jitter(0.2);
        for r in [0.0, 0.3, 0.999] {
            let d = p.delay_after(1, r);
            assert!(d <= 10 * S && d >= 8 * S, "{d:?}");
        }
        // Even with the most jitter, each delay exceeds the last one's largest value.
        assert!(p.delay_after(2, 0.999) > p.delay_after(1, 0.0));
    }

    #[test]
    fn fixed_is_fixed_and_limits_take_the_lower() {
        let p = RetryPolicy::fixed(2 * S).max_deliveries(5);
        assert_eq!(p.delay_after(1, 0.5), p.delay_after(9, 0.1));
        assert_eq!(p.limit(Some(3)), Some(3));
        assert_eq!(p.limit(Some(9)), Some(5));
        assert_eq!(p.limit(None), Some(5));
        assert_eq!(RetryPolicy::fixed(S).limit(Some(2)), Some(2));
        assert_eq!(RetryPolicy::fixed(S).limit(None), None);
    }

    #[test]
    fn huge_attempts_do_not_overflow() {
        let p = RetryPolicy::exponential(S, 60 * S);
        assert!(p.delay_after(u32::MAX, 0.0) <= 60 * S);
    }

    #[test]
    fn unit_random_stays_in_range() {
        for i in 0..1000 {
            let r = unit_random(i);
            assert!((0.0..1.0).contains(&r));
        }
    }
}
