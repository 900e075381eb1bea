//! What to do with a delivery that is due: redeliver it, or send it to the dead-letter topic.
//! A pure decision, so the rules are tested without Kafka.

use crate::tracker::core::state::{Cause, Expiry};

/// Why a record goes to the dead-letter topic. The names are stable: they appear in the
/// `kr-dlq-reason` header and in the `reason` label of `redelivery_dead_lettered_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DlqReason {
    /// The consumer rejected it.
    Rejected,
    /// It was delivered the maximum number of times without an ack.
    MaxDeliveries,
    /// The source record could not be read back (retention, compaction, deleted topic).
    SourceUnreadable,
    /// The broker refused the copy to the source topic for good (e.g. larger than the topic
    /// allows once the redelivery headers are added, or not authorised).
    CopyRejected,
}

impl DlqReason {
    /// The stable name.
    pub fn name(self) -> &'static str {
        match self {
            DlqReason::Rejected => "rejected",
            DlqReason::MaxDeliveries => "max-deliveries",
            DlqReason::SourceUnreadable => "source-unreadable",
            DlqReason::CopyRejected => "copy-rejected",
        }
    }
}

/// The decision for one due delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Produce a copy to the source partition with this attempt number.
    Redeliver {
        /// Attempt number the copy carries.
        attempt: u32,
    },
    /// Produce a scheduled record to its target topic: read the Schedule marker back and
    /// deliver what it carries.
    Publish,
    /// Produce a copy to the dead-letter topic.
    DeadLetter {
        /// Why.
        reason: DlqReason,
        /// Detail in words, for the `kr-dlq-detail` header.
        detail: String,
    },
}

/// Decides what happens to `expiry` when at most `max_deliveries` deliveries are allowed.
///
/// A timed-out or nacked delivery whose attempt already reached the maximum is dead-lettered;
/// otherwise it is redelivered with the next attempt number. A rejected one is always
/// dead-lettered. A due schedule is published; its deliveries are counted by the consumers
/// of its target topic, not here.
pub fn decide(expiry: &Expiry, max_deliveries: u32) -> Action {
    match &expiry.cause {
        Cause::Scheduled => Action::Publish,
        Cause::Rejected(reason) => Action::DeadLetter {
            reason: DlqReason::Rejected,
            detail: reason.clone(),
        },
        Cause::Timeout | Cause::Nacked if expiry.attempt >= max_deliveries => Action::DeadLetter {
            reason: DlqReason::MaxDeliveries,
            detail: format!(
                "delivered {} times, the maximum is {max_deliveries}",
                expiry.attempt
            ),
        },
        Cause::Timeout | Cause::Nacked => Action::Redeliver {
            attempt: expiry.attempt.saturating_add(1),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::SourceRef;

    fn expiry(attempt: u32, cause: Cause) -> Expiry {
        Expiry {
            source: SourceRef::new("t", 0, 1),
            attempt,
            cause,
            deadline_ms: 0,
            due_before_takeover: false,
        }
    }

    #[test]
    fn redelivers_until_the_maximum() {
        assert_eq!(
            decide(&expiry(1, Cause::Timeout), 3),
            Action::Redeliver { attempt: 2 }
        );
        assert_eq!(
            decide(&expiry(2, Cause::Nacked), 3),
            Action::Redeliver { attempt: 3 }
        );
        match decide(&expiry(3, Cause::Timeout), 3) {
            Action::DeadLetter { reason, .. } => assert_eq!(reason, DlqReason::MaxDeliveries),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn rejects_go_to_the_dead_letter_topic_with_their_reason() {
        let action = decide(&expiry(1, Cause::Rejected("bad json".into())), 5);
        assert_eq!(
            action,
            Action::DeadLetter {
                reason: DlqReason::Rejected,
                detail: "bad json".into()
            }
        );
    }
}
