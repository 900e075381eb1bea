"""Resuming a partition at an offset inside a record batch, checked (as ``src/resume.rs``).

A consumer that takes a partition resumes at its committed offset, and our commits land
anywhere inside a producer's record batch. Apache Kafka answers a fetch at such an offset with
the whole batch and librdkafka skips to the offset. Some Kafka-protocol brokers (Tansu 0.6)
answer with the *next* batch, so every client resuming there skips the rest of the batch
without a word: records that were never started, lost.

So the first record of a partition after an assignment, a seek of ours or a resume of fetching
is checked against the offset it should have come from. On Apache Kafka it is that offset and
the check ends there. If it lies past it, the consumer is sent 1, 4, 16, ... offsets further
back, and what comes before the resume offset is dropped, until a fetch starts at or before
it: then the records from the resume offset on arrive in order. A gap that is real
(compaction, transaction markers, retention) shows as a fetch that starts before the resume
offset and still passes it, and is accepted as it is.

Such a broker answers a fetch inside the *last* batch of a partition with nothing at all, so a
check that sees no record for a while (:data:`STALL_S`) asks for the partition's end offset:
at or before the resume offset, there is nothing to skip and the check ends; past it, the
consumer is sent further back as if a later record had come. Each further step waits twice as
long: a partition whose leader is down (killed, cut off) gets nothing either, and an outage of
a few seconds then sends the consumer back a few dozen offsets, not tens of thousands.

Only a seek of ours or a rebalance sets a new resume offset. Fetching resumed after a pause
leaves an open check as it is (:func:`resumed_fetching`): the check may have sent the consumer
before its resume offset, and made the resume offset, that position would have every record
from there on handed out again.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Iterable

#: How far back the check goes at most: far beyond any record batch a producer writes.
MAX_BACK = 65_536

#: How long a check waits for a record before it asks for the partition's end offset; doubled
#: for each step back already taken because nothing came (at most 2**9 times).
STALL_S = 0.5


class Step(enum.Enum):
    """What to do with a record the check has seen."""

    KEEP = "keep"
    """Hand it on; the check is over for this partition."""
    SKIP = "skip"
    """Drop it: it comes before the resume offset."""
    SEEK = "seek"
    """Drop it and send the consumer back to :attr:`ResumeCheck.seek_to`."""


class ResumeCheck:
    """The check of one partition, from its assignment (or a seek) to its first kept record.

    Pure: the consumer does the seeking when :meth:`step` says :attr:`Step.SEEK`.
    """

    def __init__(self, resume_at: int) -> None:
        self.resume_at = resume_at
        self.seek_to = resume_at
        self._back = 1
        # A record before the resume offset came: one after it then proves a real gap.
        self._reached = False
        # The last seek went to offset 0: there is no further back.
        self._at_start = False
        #: When the check began or last sent the consumer back (``time.monotonic``).
        self.since = time.monotonic()
        # How many times :meth:`stalled` sent the consumer back.
        self._stalls = 0

    def step(self, offset: int) -> Step:
        """The verdict on a record at ``offset``."""
        if offset == self.resume_at or (
            offset > self.resume_at and (self._reached or self._at_start)
        ):
            return Step.KEEP
        if offset < self.resume_at:
            self._reached = True
            return Step.SKIP
        if self._back > MAX_BACK:
            return Step.KEEP
        self.seek_to = max(self.resume_at - self._back, 0)
        self._at_start = self.seek_to == 0
        self._back *= 4
        self.since = time.monotonic()
        return Step.SEEK

    def stalled(self, end: int) -> Step:
        """The verdict when no record came for :data:`STALL_S` and the partition ends before
        ``end`` (its high watermark). ``SKIP`` means: keep waiting."""
        self.since = time.monotonic()
        if end <= self.resume_at:
            return Step.KEEP
        # Sent back as far as it goes: wait for the fetch. Ended here (``KEEP``), the check
        # would let every record from 65,536 before the resume offset on be handed out again.
        if self._reached or self._at_start or self._back > MAX_BACK:
            return Step.SKIP
        step = self.step(end)
        if step is Step.SEEK:
            self._stalls += 1
        return step

    @property
    def stall_wait(self) -> float:
        """Seconds without a record before :meth:`stalled` is asked: :data:`STALL_S`, doubled
        for each step back it already took."""
        return STALL_S * float(1 << min(self._stalls, 9))

    def is_stalled(self, now: float) -> bool:
        """Whether no record came for this check within :attr:`stall_wait`."""
        return now - self.since >= self.stall_wait

    @property
    def gave_up(self) -> bool:
        """Whether the last ``KEEP`` was given because no fetch started early enough."""
        return self._back > MAX_BACK and not (self._reached or self._at_start)


def resumed_fetching(
    checks: dict[tuple[str, int], ResumeCheck], positions: Iterable[tuple[str, int, int]]
) -> None:
    """Fetching resumed after a pause at ``positions`` (topic, partition, offset): a partition
    without an open check is checked from its position; an open check keeps its resume offset,
    since the position may lie before it."""
    for topic, partition, offset in positions:
        checks.setdefault((topic, partition), ResumeCheck(offset))
