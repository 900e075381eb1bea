//! Holding back the copy of a record that its consumer group will read again anyway.
//!
//! The client commits a batch's source offsets before it hands the batch out (the protocol's
//! step 3 before step 4). So when a delivery's deadline passes while the source group's
//! committed offset of that partition is still at or before the record, no application was
//! given that delivery: its worker stopped between the durable Start and the commit (killed,
//! crashed, or cut off), and whoever takes the partition next reads the record again from the
//! committed offset and writes a new Start for it. A copy made now is delivered as well: in the
//! long fault runs this was the largest class of duplicates (RELIABILITY.md).
//!
//! With `--source-group` the tracker holds such a delivery instead of copying it: its deadline
//! moves `recheck` ahead, as a KeepAlive would move it, and the next owner's Start (and then its
//! End) takes the delivery over. Once held so, a delivery stays held when the group's offset
//! then moves past the record: the group has taken it over (its next reader, or the worker
//! itself back from a stop, was handed it after its commit), and that reader's Start or End
//! takes the delivery over or ends it; a copy would be a second delivery. The hold is bounded
//! by `wait`, counted from the first hold:
//! a group that never comes back (every worker gone, its offsets deleted) still has its records
//! copied, at worst `wait` later than without the option, so nothing is lost. A partition the
//! group has no committed offset for (its next reader starts wherever its `auto.offset.reset`
//! says, perhaps after the record), one whose offset could never be fetched, and every expiry
//! that is not a timeout (a nack, a reject: those were handed out) are copied as before.
//!
//! One exception to "never handed out": a commit that failed for a reason other than a
//! rebalance, after which the client hands the batch out anyway (its Starts are durable). A
//! record held by mistake so is copied once a later commit of its worker passes it, or when
//! the wait runs out: later than without the option, never lost.
//!
//! Holds live in memory only: after a tracker restart a held delivery falls due again at once
//! and is held anew, with its wait counted afresh.

use std::collections::HashMap;

use crate::marker::SourceRef;

use super::state::{Cause, Expiry};

/// What the tracker knows of the source group's committed offset of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Committed {
    /// Not known yet: asked for, the answer pending.
    Unknown,
    /// The group has no committed offset there, or asking failed: nothing to wait for.
    Nothing,
    /// The group's committed offset: the next offset it reads.
    At(i64),
}

/// How long deliveries are held, in partition-time milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HoldPolicy {
    /// Longest a delivery is held, from its first hold.
    pub wait_ms: i64,
    /// How far each hold moves the deadline: when the committed offset is looked at again.
    pub recheck_ms: i64,
    /// Longest a delivery is held while its partition's committed offset is still unknown.
    pub unknown_ms: i64,
}

impl HoldPolicy {
    /// A policy holding for at most `wait_ms`, looking again every second and waiting at most
    /// five seconds for a first answer.
    pub(crate) fn waiting(wait_ms: i64) -> Self {
        HoldPolicy {
            wait_ms,
            recheck_ms: 1_000,
            unknown_ms: 5_000,
        }
    }
}

/// What to do with one due delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Hold it: make it due again at `until_ms`. `first` is its first hold.
    Hold { until_ms: i64, first: bool },
    /// Copy it now; `after_hold` says why, when it was held before.
    Copy { after_hold: Option<AfterHold> },
}

/// Why a held delivery is copied after all. Each tells an operator something different: a
/// group that did not come back, a tracker that cannot see the group's offsets, a group whose
/// offsets are gone, or a hold that turned out not to be needed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AfterHold {
    /// The wait (`--source-group-wait`) ran out: nobody took the record over in time.
    Waited,
    /// The group's offset of the partition stayed unknown past the first-answer grace: the
    /// fetches are failing, or a tracker just started has no answer yet.
    NoAnswer,
    /// The group has no committed offset there any more, or the broker refuses to say.
    NoOffset,
    /// The record had been handed out after all: held only while its partition's offset was
    /// unknown, the answer showed the group past it; or it was nacked or rejected since.
    HandedOut,
}

impl AfterHold {
    /// Every reason, in the order of [`CopiedAfterHold`]'s counts.
    pub(crate) const ALL: [AfterHold; 4] = [
        AfterHold::Waited,
        AfterHold::NoAnswer,
        AfterHold::NoOffset,
        AfterHold::HandedOut,
    ];

    /// The `outcome` label of `redelivery_group_holds_total` for copies made for this reason.
    pub(crate) fn outcome(self) -> &'static str {
        match self {
            AfterHold::Waited => "copied_after_wait",
            AfterHold::NoAnswer => "copied_no_answer",
            AfterHold::NoOffset => "copied_no_offset",
            AfterHold::HandedOut => "copied_handed_out",
        }
    }
}

/// Copies made after a hold, counted by [`AfterHold`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct CopiedAfterHold([u64; 4]);

impl CopiedAfterHold {
    pub(crate) fn add(&mut self, why: AfterHold) {
        self.0[why as usize] += 1;
    }

    pub(crate) fn get(&self, why: AfterHold) -> u64 {
        self.0[why as usize]
    }

    pub(crate) fn total(&self) -> u64 {
        self.0.iter().sum()
    }
}

/// The deliveries of one markers partition held so far.
#[derive(Debug, Default)]
pub(crate) struct Holds {
    since: HashMap<SourceRef, Held>,
    last_forget_ms: i64,
}

/// One held delivery.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// When it was first held, in partition time.
    since_ms: i64,
    /// Whether the group's offset was ever seen at or before the record (not only unknown).
    confirmed: bool,
}

impl Holds {
    /// Decides for `expiry`, due at partition time `now_ms`, given what is known of its
    /// partition's committed offset.
    pub(crate) fn decide(
        &mut self,
        expiry: &Expiry,
        committed: Committed,
        now_ms: i64,
        policy: &HoldPolicy,
    ) -> Verdict {
        self.forget_old(now_ms, policy);
        let held = self.since.get(&expiry.source).copied();
        let held_for = held.map_or(0, |h| now_ms.saturating_sub(h.since_ms));
        let confirmed = held.is_some_and(|h| h.confirmed);
        let hold = matches!(expiry.cause, Cause::Timeout)
            && held_for < policy.wait_ms
            && match committed {
                // Not committed past: nobody was handed the record. Committed past it since a
                // hold confirmed that: the group took it over (its next reader, or the worker
                // itself, back from a stop), and that reader's Start or End is on its way in
                // the markers; copying now would deliver it twice. The wait still bounds both.
                Committed::At(next) => next <= expiry.source.offset || confirmed,
                Committed::Unknown => held_for < policy.unknown_ms,
                Committed::Nothing => false,
            };
        if hold {
            let confirmed = confirmed
                || matches!(committed, Committed::At(next) if next <= expiry.source.offset);
            let first = held.is_none();
            self.since.insert(
                expiry.source.clone(),
                Held {
                    since_ms: held.map_or(now_ms, |h| h.since_ms),
                    confirmed,
                },
            );
            Verdict::Hold {
                until_ms: now_ms.saturating_add(policy.recheck_ms.max(1)),
                first,
            }
        } else {
            let after_hold = self.since.remove(&expiry.source).map(|_| {
                if !matches!(expiry.cause, Cause::Timeout) {
                    AfterHold::HandedOut
                } else if held_for >= policy.wait_ms {
                    AfterHold::Waited
                } else {
                    match committed {
                        Committed::Unknown => AfterHold::NoAnswer,
                        Committed::Nothing => AfterHold::NoOffset,
                        // Past the record, and never confirmed behind it.
                        Committed::At(_) => AfterHold::HandedOut,
                    }
                }
            });
            Verdict::Copy { after_hold }
        }
    }

    /// How many deliveries are remembered as held.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.since.len()
    }

    /// Forgets, at most once a second, holds older than the wait and a few rechecks: their
    /// deliveries were taken over by a new Start, ended, or copied in another pass.
    fn forget_old(&mut self, now_ms: i64, policy: &HoldPolicy) {
        if self.since.is_empty() || now_ms.saturating_sub(self.last_forget_ms) < 1_000 {
            return;
        }
        self.last_forget_ms = now_ms;
        let keep = policy
            .wait_ms
            .saturating_add(policy.recheck_ms.saturating_mul(4));
        self.since
            .retain(|_, h| now_ms.saturating_sub(h.since_ms) <= keep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: HoldPolicy = HoldPolicy {
        wait_ms: 10_000,
        recheck_ms: 1_000,
        unknown_ms: 3_000,
    };

    fn due(offset: i64, cause: Cause) -> Expiry {
        Expiry {
            source: SourceRef::new("orders", 0, offset),
            attempt: 1,
            cause,
            deadline_ms: 0,
            due_before_takeover: false,
        }
    }

    #[test]
    fn a_record_the_group_has_not_committed_past_is_held_until_the_wait_runs_out() {
        let mut holds = Holds::default();
        let e = due(5, Cause::Timeout);
        // Committed offset 5 is the next to read: record 5 was never handed out.
        assert_eq!(
            holds.decide(&e, Committed::At(5), 100, &POLICY),
            Verdict::Hold {
                until_ms: 1_100,
                first: true
            }
        );
        assert_eq!(
            holds.decide(&e, Committed::At(3), 1_100, &POLICY),
            Verdict::Hold {
                until_ms: 2_100,
                first: false
            }
        );
        assert_eq!(
            holds.decide(&e, Committed::At(5), 10_099, &POLICY),
            Verdict::Hold {
                until_ms: 11_099,
                first: false
            }
        );
        // Ten seconds after the first hold: copied, nothing lost.
        assert_eq!(
            holds.decide(&e, Committed::At(5), 10_100, &POLICY),
            Verdict::Copy {
                after_hold: Some(AfterHold::Waited)
            }
        );
        assert_eq!(holds.len(), 0);
    }

    #[test]
    fn a_record_the_group_committed_past_is_copied_at_once() {
        let mut holds = Holds::default();
        // Committed 6: record 5 was committed, so it was handed out (or is about to be).
        assert_eq!(
            holds.decide(&due(5, Cause::Timeout), Committed::At(6), 0, &POLICY),
            Verdict::Copy { after_hold: None }
        );
    }

    #[test]
    fn a_held_record_stays_held_when_the_group_commits_past_it_until_the_wait() {
        let mut holds = Holds::default();
        let e = due(5, Cause::Timeout);
        assert!(matches!(
            holds.decide(&e, Committed::At(0), 0, &POLICY),
            Verdict::Hold { first: true, .. }
        ));
        // The group read it again and committed: its Start (or End) is on the way.
        assert!(matches!(
            holds.decide(&e, Committed::At(9), 1_000, &POLICY),
            Verdict::Hold { first: false, .. }
        ));
        // Nothing came in time: copied.
        assert_eq!(
            holds.decide(&e, Committed::At(9), 10_000, &POLICY),
            Verdict::Copy {
                after_hold: Some(AfterHold::Waited)
            }
        );
    }

    #[test]
    fn a_record_held_only_while_unknown_is_copied_if_the_group_had_committed_past_it() {
        let mut holds = Holds::default();
        let e = due(5, Cause::Timeout);
        assert!(matches!(
            holds.decide(&e, Committed::Unknown, 0, &POLICY),
            Verdict::Hold { .. }
        ));
        // The first answer: committed past it before it fell due, so it was handed out.
        assert_eq!(
            holds.decide(&e, Committed::At(6), 500, &POLICY),
            Verdict::Copy {
                after_hold: Some(AfterHold::HandedOut)
            }
        );
    }

    #[test]
    fn no_committed_offset_or_a_failed_fetch_means_no_hold() {
        let mut holds = Holds::default();
        assert_eq!(
            holds.decide(&due(5, Cause::Timeout), Committed::Nothing, 0, &POLICY),
            Verdict::Copy { after_hold: None }
        );
    }

    #[test]
    fn an_unknown_offset_is_waited_for_briefly() {
        let mut holds = Holds::default();
        let e = due(5, Cause::Timeout);
        assert!(matches!(
            holds.decide(&e, Committed::Unknown, 0, &POLICY),
            Verdict::Hold { first: true, .. }
        ));
        assert!(matches!(
            holds.decide(&e, Committed::Unknown, 2_999, &POLICY),
            Verdict::Hold { first: false, .. }
        ));
        assert_eq!(
            holds.decide(&e, Committed::Unknown, 3_000, &POLICY),
            Verdict::Copy {
                after_hold: Some(AfterHold::NoAnswer)
            }
        );
    }

    #[test]
    fn a_held_record_copied_says_whether_the_offset_went_or_it_was_handed_out() {
        let mut holds = Holds::default();
        let e = due(5, Cause::Timeout);
        assert!(matches!(
            holds.decide(&e, Committed::At(5), 0, &POLICY),
            Verdict::Hold { .. }
        ));
        // The group's offsets were deleted (or an ACL refuses them now).
        assert_eq!(
            holds.decide(&e, Committed::Nothing, 1_000, &POLICY),
            Verdict::Copy {
                after_hold: Some(AfterHold::NoOffset)
            }
        );
        let e = due(6, Cause::Timeout);
        assert!(matches!(
            holds.decide(&e, Committed::At(6), 0, &POLICY),
            Verdict::Hold { .. }
        ));
        // Its next reader was handed it and nacked it.
        assert_eq!(
            holds.decide(&due(6, Cause::Nacked), Committed::Nothing, 1_000, &POLICY),
            Verdict::Copy {
                after_hold: Some(AfterHold::HandedOut)
            }
        );
        // The counts are indexed by the reasons' order in `ALL`.
        for (i, why) in AfterHold::ALL.into_iter().enumerate() {
            assert_eq!(why as usize, i);
        }
        let mut counts = CopiedAfterHold::default();
        counts.add(AfterHold::NoOffset);
        counts.add(AfterHold::HandedOut);
        counts.add(AfterHold::HandedOut);
        assert_eq!((counts.get(AfterHold::HandedOut), counts.total()), (2, 3));
    }

    #[test]
    fn only_timeouts_are_held() {
        let mut holds = Holds::default();
        for cause in [
            Cause::Nacked,
            Cause::Rejected("bad".into()),
            Cause::Scheduled,
        ] {
            assert_eq!(
                holds.decide(&due(5, cause), Committed::At(0), 0, &POLICY),
                Verdict::Copy { after_hold: None }
            );
        }
    }

    #[test]
    fn old_holds_are_forgotten() {
        let mut holds = Holds::default();
        assert!(matches!(
            holds.decide(&due(1, Cause::Timeout), Committed::At(0), 0, &POLICY),
            Verdict::Hold { .. }
        ));
        // Record 1 was taken over by a new Start and never fell due again.
        holds.decide(&due(2, Cause::Timeout), Committed::At(9), 20_000, &POLICY);
        assert_eq!(holds.len(), 0);
    }
}
