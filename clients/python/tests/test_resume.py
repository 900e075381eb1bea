"""The resume check's decisions, the same cases as ``src/resume.rs``'s unit tests."""

from __future__ import annotations

from kafka_redelivery.resume import MAX_BACK, ResumeCheck, Step, resumed_fetching


def test_resuming_where_it_should_ends_the_check_at_once() -> None:
    assert ResumeCheck(10).step(10) is Step.KEEP


def test_a_broker_that_skips_the_batch_is_sent_further_back_until_it_answers_in_order() -> None:
    # Tansu: the batch holding 10 starts at 6, and a fetch at 10 or 9 answers with the next
    # batch (at 20); a fetch at 6 gives 6..9 (dropped) and then 10.
    c = ResumeCheck(10)
    assert c.step(20) is Step.SEEK and c.seek_to == 9
    assert c.step(20) is Step.SEEK and c.seek_to == 6
    for dropped in range(6, 10):
        assert c.step(dropped) is Step.SKIP
    assert c.step(10) is Step.KEEP


def test_a_real_gap_is_accepted_once_a_fetch_started_before_it() -> None:
    c = ResumeCheck(10)
    assert c.step(12) is Step.SEEK and c.seek_to == 9
    assert c.step(9) is Step.SKIP
    assert c.step(12) is Step.KEEP, "10 and 11 are gone (compacted, say)"
    assert not c.gave_up


def test_at_the_start_of_the_partition_there_is_no_further_back() -> None:
    c = ResumeCheck(2)
    assert c.step(5) is Step.SEEK and c.seek_to == 1
    assert c.step(5) is Step.SEEK and c.seek_to == 0
    assert c.step(5) is Step.KEEP, "nothing at or before 2 is left"


def test_a_check_that_never_reaches_its_offset_gives_up_and_says_so() -> None:
    c = ResumeCheck(1_000_000)
    steps = 0
    while c.step(1_000_001) is Step.SEEK:
        steps += 1
    assert c.gave_up
    assert 4**steps > MAX_BACK


def test_a_check_that_gets_nothing_asks_for_the_end_and_ends_when_nothing_is_past_it() -> None:
    # At the end of the log Apache Kafka has nothing to send: no record, nothing skipped.
    assert ResumeCheck(10).stalled(10) is Step.KEEP


def test_a_check_that_gets_nothing_while_records_lie_past_it_is_sent_back() -> None:
    # Tansu: a fetch inside the last batch (0..39) gets nothing; 4, 1 and 0 are tried.
    c = ResumeCheck(5)
    assert c.stalled(40) is Step.SEEK and c.seek_to == 4
    assert c.stalled(40) is Step.SEEK and c.seek_to == 1
    assert c.stalled(40) is Step.SEEK and c.seek_to == 0
    assert c.stalled(40) is Step.SKIP, "from offset 0 on, it waits for the fetch"
    for dropped in range(5):
        assert c.step(dropped) is Step.SKIP
    assert c.step(5) is Step.KEEP


def test_fetching_resumed_inside_a_walked_back_check_keeps_its_resume_offset() -> None:
    # The leader was down for long: stalls sent the consumer far before 100,000. Fetching
    # resumed at 60,000 after a pause must not hand out 60,000..99,999 again.
    checks = {("t", 0): ResumeCheck(100_000)}
    while checks[("t", 0)].stalled(200_000) is Step.SEEK:
        pass
    assert checks[("t", 0)].seek_to == 100_000 - MAX_BACK
    assert checks[("t", 0)].stalled(200_000) is Step.SKIP, "sent back as far as it goes: waits"
    resumed_fetching(checks, [("t", 0, 60_000), ("t", 1, 7)])
    assert checks[("t", 0)].step(60_000) is Step.SKIP
    assert checks[("t", 0)].step(99_999) is Step.SKIP
    assert checks[("t", 0)].step(100_000) is Step.KEEP
    assert checks[("t", 1)].resume_at == 7, "a partition without a check is checked from there"


def test_each_step_back_for_nothing_waits_twice_as_long() -> None:
    c = ResumeCheck(1_000_000)
    waits = []
    for _ in range(12):
        waits.append(c.stall_wait)
        c.stalled(2_000_000)
    assert waits[:4] == [0.5, 1.0, 2.0, 4.0]
    assert waits[-1] == 0.5 * 2**9, "capped"
