//! Kafka refusing the tracker itself: a missing ACL on its consumer group or on the markers
//! topic.
//!
//! Such a tracker can never become ready, and before this it stayed up, unready, logging
//! "authorization failed" for ever, while a wrong password ends the process at start with
//! exit 77. Waiting cannot fix either (an operator has to grant the ACL), so a refusal that
//! lasts [`REFUSAL_GRACE`] before the tracker was ever ready ends it the same way, saying what
//! was refused. The grace covers an ACL granted a moment before the tracker started, which
//! the broker may not have applied yet.
//!
//! Once ready, the tracker never ends on a refusal: an ACL taken away from a running tracker is
//! counted and logged (`redelivery_consume_errors_total`) while it waits for the ACL to come
//! back, as a record parked for want of Write on its dead-letter topic does.

use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;

/// How long a refusal must last, with nothing read meanwhile, to end a tracker that was never
/// ready.
pub(crate) const REFUSAL_GRACE: Duration = Duration::from_secs(10);

/// Whether `e` is the broker refusing this principal something an ACL would grant.
pub(crate) fn is_refusal(e: &KafkaError) -> bool {
    matches!(
        e.rdkafka_error_code(),
        Some(
            RDKafkaErrorCode::GroupAuthorizationFailed
                | RDKafkaErrorCode::TopicAuthorizationFailed
                | RDKafkaErrorCode::ClusterAuthorizationFailed
        )
    )
}

/// The refusals seen since the last sign of access; see the module doc.
#[derive(Debug, Default)]
pub(crate) struct Refusals {
    /// When the current run of refusals began, and the latest one's message.
    current: Option<(Instant, String)>,
    /// The tracker was ready once: refusals no longer end it.
    was_ready: bool,
}

impl Refusals {
    /// Notes an error of the markers consumer (or of a Tick sent to the markers topic).
    pub(crate) fn saw(&mut self, e: &KafkaError, now: Instant) {
        if !is_refusal(e) {
            return;
        }
        let since = self.current.as_ref().map_or(now, |(since, _)| *since);
        self.current = Some((since, e.to_string()));
    }

    /// A record was read: access works, whatever was refused before.
    pub(crate) fn read_something(&mut self) {
        self.current = None;
    }

    /// The tracker is ready: from now on refusals are only counted.
    pub(crate) fn became_ready(&mut self) {
        self.was_ready = true;
        self.current = None;
    }

    /// The refusal that ends the tracker, if one has lasted the grace period before it was
    /// ever ready.
    pub(crate) fn for_good(&self, now: Instant) -> Option<&str> {
        match &self.current {
            Some((since, why)) if !self.was_ready && now - *since >= REFUSAL_GRACE => Some(why),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(code: RDKafkaErrorCode) -> KafkaError {
        KafkaError::MessageConsumption(code)
    }

    #[test]
    fn a_lasting_refusal_before_ready_ends_the_tracker() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        r.saw(&refused(RDKafkaErrorCode::GroupAuthorizationFailed), t0);
        assert_eq!(r.for_good(t0 + REFUSAL_GRACE / 2), None, "within the grace");
        r.saw(
            &refused(RDKafkaErrorCode::TopicAuthorizationFailed),
            t0 + REFUSAL_GRACE / 2,
        );
        let why = r
            .for_good(t0 + REFUSAL_GRACE)
            .expect("ends after the grace");
        assert!(why.contains("Topic authorization failed"), "{why}");
    }

    #[test]
    fn other_errors_and_reads_do_not_count_as_refusals() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        r.saw(&refused(RDKafkaErrorCode::BrokerTransportFailure), t0);
        assert_eq!(r.for_good(t0 + REFUSAL_GRACE * 2), None);
        r.saw(&refused(RDKafkaErrorCode::TopicAuthorizationFailed), t0);
        r.read_something();
        assert_eq!(r.for_good(t0 + REFUSAL_GRACE * 2), None, "a read clears it");
    }

    #[test]
    fn once_ready_a_refusal_never_ends_the_tracker() {
        let t0 = Instant::now();
        let mut r = Refusals::default();
        r.became_ready();
        r.saw(&refused(RDKafkaErrorCode::GroupAuthorizationFailed), t0);
        assert_eq!(r.for_good(t0 + REFUSAL_GRACE * 10), None);
    }
}
