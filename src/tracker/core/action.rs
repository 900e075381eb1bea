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

/// Where a copy goes after `target` refused it for good (`why`): a copy to its source topic or
/// a scheduled record's target goes to the dead-letter topic instead, once; a copy the
/// dead-letter topic refused has nowhere left to go (`None`): it is parked, still in flight.
pub fn after_refusal(action: &Action, target: &str, why: &str) -> Option<Action> {
    match action {
        Action::Redeliver { .. } | Action::Publish => Some(Action::DeadLetter {
            reason: DlqReason::CopyRejected,
            detail: format!("the copy to {target} was refused: {why}"),
        }),
        Action::DeadLetter { .. } => None,
    }
}

/// How long a parked delivery waits before its `refusals`-th retry (1 for the first): 5 s,
/// doubling, at most `max`.
pub fn park_wait(refusals: u32, max: std::time::Duration) -> std::time::Duration {
    let doublings = refusals.saturating_sub(1).min(10);
    (std::time::Duration::from_secs(5) * 2u32.pow(doublings)).min(max)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::marker::SourceRef;

    #[test]
    fn a_refused_copy_is_dead_lettered_once_then_parked() {
        let to_dlq = after_refusal(&Action::Redeliver { attempt: 2 }, "orders", "too large");
        assert_eq!(
            to_dlq,
            Some(Action::DeadLetter {
                reason: DlqReason::CopyRejected,
                detail: "the copy to orders was refused: too large".into()
            })
        );
        assert!(matches!(
            after_refusal(&Action::Publish, "t", "denied"),
            Some(Action::DeadLetter {
                reason: DlqReason::CopyRejected,
                ..
            })
        ));
        assert_eq!(
            after_refusal(&to_dlq.unwrap(), "orders.dlq", "denied"),
            None
        );
    }

    #[test]
    fn parked_retries_back_off_to_a_bound() {
        let max = std::time::Duration::from_secs(300);
        let waits: Vec<u64> = (1..=8).map(|n| park_wait(n, max).as_secs()).collect();
        assert_eq!(waits, [5, 10, 20, 40, 80, 160, 300, 300]);
        assert_eq!(park_wait(u32::MAX, max).as_secs(), 300);
    }

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
