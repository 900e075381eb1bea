//! Resuming a partition at an offset inside a record batch, checked.
//!
//! A consumer that takes a partition resumes at its committed offset, and our commits land
//! anywhere inside a producer's record batch. Apache Kafka answers a fetch at such an offset
//! with the whole batch, and the client skips to the offset. Tansu 0.6 answers with the *next*
//! batch: the rest of the batch at the committed offset is skipped without a word, by every
//! client (README, "Tested brokers"). For the workers that would lose records that were never
//! started; for the tracker's markers consumer, Starts it never applies.
//!
//! So the first record of a partition after it was taken (or sought) is checked against the
//! offset it should have resumed at. On Apache Kafka it is that offset and the check ends there,
//! at the cost of looking up the committed offsets: one request per rebalance in the client,
//! one per assigned partition in the tracker (which has a few). If it lies past
//! that offset, the consumer seeks 1, 4, 16, ... offsets further back and skips what comes
//! before the resume offset, until a fetch starts at or before it: then the records from the
//! resume offset on arrive in order. A gap that is real (compaction, transaction markers, a
//! retention that removed the offset) shows as a fetch that starts before the resume offset and
//! still passes it, and is accepted as it is.
//!
//! Such a broker answers a fetch inside the *last* batch of a partition with nothing at all,
//! so a check that sees no record for [`STALL`] sends the consumer back a step anyway
//! ([`ResumeCheck::stalled`]): on Apache Kafka at the end of a partition that re-reads the one
//! record before the resume offset and ends the wait; on Tansu it reaches the batch's start.
//! (The end offset cannot tell: Tansu answers a ListOffsets for the end with one past its last
//! batch's first offset.)

use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::{Offset, TopicPartitionList};

/// How far back the check goes at most: far beyond any record batch a producer writes.
const MAX_BACK: i64 = 65_536;

/// How long the committed-offset look-up and a seek may take.
const WAIT: Duration = Duration::from_secs(5);

/// How long a check waits for a record before it sends the consumer back a step unasked. Each
/// further step waits twice as long as the one before: a broker that answers nothing because
/// the partition's leader is down (killed, cut off) looks the same as Tansu's empty answer, and
/// an outage of a few seconds then sends the consumer back a few dozen offsets, not tens of
/// thousands.
pub(crate) const STALL: Duration = Duration::from_millis(500);

/// What to do with a record the check has seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Hand it on; the check is over for this partition.
    Keep,
    /// Drop it: it comes before the resume offset, or the consumer was sent further back and
    /// it will come again in order.
    Skip,
}

/// The check of one partition, from its assignment (or a seek) to its first kept record.
#[derive(Debug, Clone)]
pub(crate) struct ResumeCheck {
    /// The offset the partition should resume at; `None` until looked up (the committed one).
    from: Option<i64>,
    /// How far before `from` the next seek goes.
    back: i64,
    /// Whether a record before `from` came: then one after it proves a real gap.
    reached: bool,
    /// Whether the last seek went to offset 0: there is no further back.
    at_start: bool,
    /// When the check began, last sent the consumer back, or last saw a record.
    since: Instant,
    /// How many times it sent the consumer back because nothing came: the next wait is
    /// [`STALL`] doubled that many times.
    stalls: u32,
}

impl ResumeCheck {
    /// A partition just assigned: it resumes at its committed offset, looked up on its first
    /// record.
    pub(crate) fn committed() -> Self {
        ResumeCheck {
            from: None,
            back: 1,
            reached: false,
            at_start: false,
            since: Instant::now(),
            stalls: 0,
        }
    }

    /// A partition the consumer was sent to `offset` in.
    pub(crate) fn at(offset: i64) -> Self {
        ResumeCheck {
            from: Some(offset),
            ..Self::committed()
        }
    }

    /// Checks a record of `topic`/`partition` at `offset`. `Keep` ends the check.
    pub(crate) fn check<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> Verdict {
        let from = match self.from {
            Some(from) => from,
            None => match committed(consumer, topic, partition) {
                Some(from) => *self.from.insert(from),
                // Nothing committed: it starts where `auto.offset.reset` says, at a batch.
                None => return Verdict::Keep,
            },
        };
        let step = self.step(offset, from);
        if let Step::Seek(to) = step {
            let sought = consumer.seek(topic, partition, Offset::Offset(to), WAIT);
            if let Err(error) = sought {
                tracing::warn!(
                    topic, partition, from, offset, %error,
                    "could not seek back to the resume offset; records from it up to this one \
                     may be skipped (a broker that answers a fetch inside a batch with a later one)"
                );
                return Verdict::Keep;
            }
            tracing::debug!(
                topic,
                partition,
                from,
                offset,
                to,
                "resumed past its offset; seeking back"
            );
            return Verdict::Skip;
        }
        match step {
            Step::Keep => Verdict::Keep,
            _ => Verdict::Skip,
        }
    }

    /// Sends the consumer back a step if no record came for [`STALL`] and no fetch has
    /// started at or before the resume offset yet; false if the seek failed (the check is
    /// then over: nothing more can be done than before it).
    pub(crate) fn stalled<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
    ) -> bool {
        let Some(from) = self.from else {
            return true;
        };
        if self.since.elapsed() < self.stall_wait() {
            return true;
        }
        let Step::Seek(to) = self.stalled_step(from) else {
            return true;
        };
        match consumer.seek(topic, partition, Offset::Offset(to), WAIT) {
            Ok(()) => {
                tracing::debug!(
                    topic,
                    partition,
                    from,
                    to,
                    "no record since the resume; seeking back"
                );
                true
            }
            Err(error) => {
                tracing::warn!(
                    topic, partition, from, %error,
                    "could not seek back to the resume offset; records from it up to the next \
                     batch may be skipped (a broker that answers a fetch inside a batch with a \
                     later one)"
                );
                false
            }
        }
    }

    /// How long to wait for a record before the next step back: [`STALL`], doubled for each
    /// step already taken because nothing came (at most 2^9 times, about four minutes).
    fn stall_wait(&self) -> Duration {
        STALL.saturating_mul(1 << self.stalls.min(9))
    }

    /// The decision when nothing came for a while: a step back, as for a record past the
    /// resume offset, unless a fetch already started at or before it (then: wait).
    fn stalled_step(&mut self, from: i64) -> Step {
        self.since = Instant::now();
        if self.reached || self.at_start || self.back > MAX_BACK {
            return Step::Skip;
        }
        self.stalls = self.stalls.saturating_add(1);
        self.step(from.saturating_add(1), from)
    }

    /// The decision, apart from the I/O.
    fn step(&mut self, offset: i64, from: i64) -> Step {
        self.since = Instant::now();
        if offset == from || (offset > from && (self.reached || self.at_start)) {
            return Step::Keep;
        }
        if offset < from {
            self.reached = true;
            return Step::Skip;
        }
        if self.back > MAX_BACK {
            tracing::warn!(
                from,
                offset,
                "no fetch started at or before the resume offset within {MAX_BACK} offsets; \
                 going on from {offset}"
            );
            return Step::Keep;
        }
        let to = from.saturating_sub(self.back).max(0);
        self.at_start = to == 0;
        self.back = self.back.saturating_mul(4);
        Step::Seek(to)
    }
}

/// The open checks of a consumer's partitions, one at most per partition: the client's poll
/// thread keeps one list for its whole assignment.
///
/// Who may replace an open check matters. A check that was sent back (a record past its
/// resume offset, or nothing for a while) has moved the consumer *before* its resume offset,
/// and only the check knows that the records up to that offset are to be skipped. A seek of
/// our own ([`ResumeChecks::sought`]) and a rebalance ([`ResumeChecks::rebalanced`]) set a new
/// resume offset and replace it; fetching resumed after a pause
/// ([`ResumeChecks::fetch_resumed`]) does not. Had it replaced the check with one at the
/// consumer's position, everything from there to the old resume offset would have been handed
/// out again: the long cluster fault runs of 2026-12-03 re-delivered 72,000 records that way,
/// after a partition's leader was down for long enough to send a check 65,536 offsets back.
#[derive(Debug, Default)]
pub(crate) struct ResumeChecks(Vec<(String, i32, ResumeCheck)>);

impl ResumeChecks {
    /// Whether no partition is being checked (the rule but for a moment after a rebalance).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn position(&self, topic: &str, partition: i32) -> Option<usize> {
        self.0
            .iter()
            .position(|(t, p, _)| *p == partition && t == topic)
    }

    /// The consumer was sent to `offset` by a seek of its own (to poll a batch again): the
    /// partition resumes there, whatever was checked before.
    pub(crate) fn sought(&mut self, topic: &str, partition: i32, offset: i64) {
        if let Some(i) = self.position(topic, partition) {
            self.0.swap_remove(i);
        }
        self.0
            .push((topic.to_string(), partition, ResumeCheck::at(offset)));
    }

    /// Fetching resumed at `position` after a pause, which may lie inside a record batch.
    /// An open check stays as it is: its resume offset is where the partition really
    /// resumes, and the position may lie before it.
    pub(crate) fn fetch_resumed(&mut self, topic: &str, partition: i32, position: i64) {
        if self.position(topic, partition).is_none() {
            self.0
                .push((topic.to_string(), partition, ResumeCheck::at(position)));
        }
    }

    /// A rebalance moved `moved` (assigned or revoked): their checks end, and the partitions
    /// assigned resume at their committed offsets (`committed`; one without is not checked).
    pub(crate) fn rebalanced(
        &mut self,
        moved: &[(String, i32)],
        committed: Vec<(String, i32, i64)>,
    ) {
        self.0
            .retain(|(t, p, _)| !moved.iter().any(|(mt, mp)| mt == t && mp == p));
        for (topic, partition, at) in committed {
            self.0.push((topic, partition, ResumeCheck::at(at)));
        }
    }

    /// Whether the record of `topic`/`partition` at `offset` is to be dropped while its
    /// partition's resume is checked (see [`ResumeCheck::check`]); a kept one ends the check.
    pub(crate) fn skips<C: ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        topic: &str,
        partition: i32,
        offset: i64,
    ) -> bool {
        let Some(i) = self.position(topic, partition) else {
            return false;
        };
        match self.0[i].2.check(consumer, topic, partition, offset) {
            Verdict::Skip => true,
            Verdict::Keep => {
                self.0.swap_remove(i);
                false
            }
        }
    }

    /// Sends back the partitions whose checks saw no record for a while (see
    /// [`ResumeCheck::stalled`]); a check whose seek failed ends.
    pub(crate) fn stalled<C: ConsumerContext>(&mut self, consumer: &BaseConsumer<C>) {
        self.0
            .retain_mut(|(topic, partition, check)| check.stalled(consumer, topic, *partition));
    }
}

#[derive(Debug, PartialEq, Eq)]
enum Step {
    Keep,
    Skip,
    Seek(i64),
}

/// The committed offsets of `partitions` for the consumer's group, in one request: those that
/// have one. Empty if the look-up failed (then nothing is checked, as before the check).
pub(crate) fn committed_many<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    partitions: &[(String, i32)],
) -> Vec<(String, i32, i64)> {
    let mut tpl = TopicPartitionList::new();
    for (topic, partition) in partitions {
        tpl.add_partition(topic, *partition);
    }
    match consumer.committed_offsets(tpl, WAIT) {
        Ok(tpl) => tpl
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.topic().to_string(), e.partition(), o)),
                _ => None,
            })
            .collect(),
        Err(error) => {
            tracing::debug!(%error, "committed offsets look-up failed; not checking the resume");
            Vec::new()
        }
    }
}

/// The committed offset of one partition for the consumer's group, if there is one.
fn committed<C: ConsumerContext>(
    consumer: &BaseConsumer<C>,
    topic: &str,
    partition: i32,
) -> Option<i64> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    match consumer.committed_offsets(tpl, WAIT) {
        Ok(tpl) => match tpl.find_partition(topic, partition)?.offset() {
            Offset::Offset(o) => Some(o),
            _ => None,
        },
        Err(error) => {
            tracing::debug!(topic, partition, %error, "committed offset look-up failed; not checking the resume");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resuming_where_it_should_ends_the_check_at_once() {
        let mut c = ResumeCheck::at(10);
        assert_eq!(c.step(10, 10), Step::Keep);
    }

    /// Tansu: the batch holding 10 starts at 6, and a fetch at 10 or 9 answers with the next
    /// batch (at 20); a fetch at 6 gives 6..9 (skipped) and then 10.
    #[test]
    fn a_broker_that_skips_the_batch_is_sent_further_back_until_it_answers_in_order() {
        let mut c = ResumeCheck::at(10);
        assert_eq!(c.step(20, 10), Step::Seek(9));
        assert_eq!(c.step(20, 10), Step::Seek(6));
        for skipped in 6..10 {
            assert_eq!(c.step(skipped, 10), Step::Skip);
        }
        assert_eq!(c.step(10, 10), Step::Keep);
    }

    #[test]
    fn a_real_gap_is_accepted_once_a_fetch_started_before_it() {
        let mut c = ResumeCheck::at(10);
        assert_eq!(c.step(12, 10), Step::Seek(9));
        assert_eq!(c.step(9, 10), Step::Skip);
        assert_eq!(
            c.step(12, 10),
            Step::Keep,
            "10 and 11 are gone (compacted, say)"
        );
    }

    /// Tansu: the last batch holds 0..39 and a fetch inside it gets nothing; 4, 1 and 0 are
    /// tried, and from 0 on the check waits for the fetch.
    #[test]
    fn a_check_that_gets_nothing_is_sent_back_until_a_fetch_starts_early_enough() {
        let mut c = ResumeCheck::at(5);
        assert_eq!(c.stalled_step(5), Step::Seek(4));
        assert_eq!(c.stalled_step(5), Step::Seek(1));
        assert_eq!(c.stalled_step(5), Step::Seek(0));
        assert_eq!(c.stalled_step(5), Step::Skip);
        for skipped in 0..5 {
            assert_eq!(c.step(skipped, 5), Step::Skip);
        }
        assert_eq!(c.step(5, 5), Step::Keep);
    }

    /// Apache Kafka at the end of a partition: one step back re-reads the record before the
    /// resume offset, and the check then only waits.
    #[test]
    fn at_the_end_of_a_partition_one_step_back_ends_the_wait() {
        let mut c = ResumeCheck::at(40);
        assert_eq!(c.stalled_step(40), Step::Seek(39));
        assert_eq!(c.step(39, 40), Step::Skip);
        assert_eq!(c.stalled_step(40), Step::Skip);
        assert_eq!(c.step(40, 40), Step::Keep, "the next record produced");
    }

    /// The decision for a record at `offset`, against the check's own resume offset.
    fn verdict(c: &mut ResumeCheck, offset: i64) -> Step {
        let from = c.from.expect("a resume offset");
        c.step(offset, from)
    }

    /// A partition's leader is down for a long while after a seek: every stall sends the
    /// consumer further back, to 65,536 before the resume offset at most. A pause and resume
    /// of fetching then must not make the consumer's position the new resume offset, or
    /// every record from there on is handed out again.
    #[test]
    fn fetch_resumed_inside_a_walked_back_check_keeps_its_resume_offset() {
        let mut checks = ResumeChecks::default();
        checks.sought("t", 0, 100_000);
        let mut deepest = 100_000;
        while let Step::Seek(to) = checks.0[0].2.stalled_step(100_000) {
            deepest = to;
        }
        assert_eq!(deepest, 100_000 - MAX_BACK);
        checks.fetch_resumed("t", 0, 60_000);
        assert_eq!(checks.0.len(), 1);
        let c = &mut checks.0[0].2;
        for skipped in [60_000, 99_999] {
            assert_eq!(
                verdict(c, skipped),
                Step::Skip,
                "{skipped} was handed out before"
            );
        }
        assert_eq!(verdict(c, 100_000), Step::Keep);
    }

    #[test]
    fn fetch_resumed_without_a_check_checks_from_the_position() {
        let mut checks = ResumeChecks::default();
        checks.fetch_resumed("t", 0, 40);
        checks.fetch_resumed("t", 1, 7);
        assert_eq!(verdict(&mut checks.0[0].2, 40), Step::Keep);
        assert_eq!(verdict(&mut checks.0[1].2, 9), Step::Seek(6));
    }

    #[test]
    fn a_seek_of_our_own_replaces_the_check() {
        let mut checks = ResumeChecks::default();
        checks.sought("t", 0, 500);
        checks.sought("t", 0, 300);
        assert_eq!(checks.0.len(), 1);
        assert_eq!(verdict(&mut checks.0[0].2, 300), Step::Keep);
    }

    #[test]
    fn a_rebalance_ends_the_checks_of_partitions_moved_and_checks_those_assigned() {
        let mut checks = ResumeChecks::default();
        checks.sought("t", 0, 10);
        checks.sought("t", 1, 20);
        let moved = [("t".to_string(), 1), ("t".to_string(), 2)];
        checks.rebalanced(&moved, vec![("t".to_string(), 2, 30)]);
        let open: Vec<(i32, Option<i64>)> = checks.0.iter().map(|(_, p, c)| (*p, c.from)).collect();
        assert_eq!(open, [(0, Some(10)), (2, Some(30))]);
    }

    /// A leader down for ten seconds sends the consumer back in four steps, to 64 offsets
    /// before the resume offset, not in nine to 65,536.
    #[test]
    fn each_step_back_for_nothing_waits_twice_as_long() {
        let mut c = ResumeCheck::at(1_000_000);
        let mut waited = Duration::ZERO;
        let mut steps = 0;
        loop {
            waited += c.stall_wait();
            if waited > Duration::from_secs(10) {
                break;
            }
            assert!(matches!(c.stalled_step(1_000_000), Step::Seek(_)));
            steps += 1;
        }
        assert_eq!(steps, 4);
        assert_eq!(c.back, 256, "the next step would go 256 back");
        for _ in 0..20 {
            c.stalled_step(1_000_000);
        }
        assert_eq!(c.stall_wait(), STALL * 512, "capped");
    }

    #[test]
    fn at_the_start_of_the_partition_there_is_no_further_back() {
        let mut c = ResumeCheck::at(2);
        assert_eq!(c.step(5, 2), Step::Seek(1));
        assert_eq!(c.step(5, 2), Step::Seek(0));
        assert_eq!(c.step(5, 2), Step::Keep, "nothing at or before 2 is left");
    }
}
