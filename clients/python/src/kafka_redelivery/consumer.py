"""The consumer side of the protocol, on confluent-kafka.

For each batch ``poll`` takes from Kafka, in this order and no other:

1. write a Start marker per source partition of the batch (idempotent producer, ``acks=all``);
2. wait until every Start is acknowledged;
3. commit each source partition whose Start is durable; seek a partition whose Start failed
   back to its first record of the batch, so it is polled again (if even the seek fails, the
   consumer stops with an error rather than risk committing past it later);
4. hand the records out as :class:`Delivery` objects. If a rebalance refused the commit, the
   batch is not handed out but polled again, and kept alive until the group settles (see the
   lease module): its partitions may go to another worker, which reads it too.

So a source offset is never committed before its Start is durable, as in the Rust client. The
markers go to the markers partition the FNV-1a rule picks, the same as every other client.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from . import headers as hdr
from . import markers as m
from .gather import SettleGatherer
from .keepalive import KeepAlives
from .lease import Leases
from .resume import ResumeCheck, Step, resumed_fetching
from .retry import RetryPolicy
from .writer import MarkerWriter, RedeliveryError, Write, durable_producer

log = logging.getLogger("kafka_redelivery")

# A polled record with what its headers say: (message, headers, attempt, timeout in ms);
# headers ``None`` when confluent-kafka cannot read them (see ``_read``).
_Polled = tuple[Any, hdr.Headers | None, int, int]

#: Why a record whose headers confluent-kafka cannot read is dead-lettered (see ``_read``).
UNREADABLE_HEADERS = (
    "the Python client cannot read this record's headers (confluent-kafka refuses a header "
    "name that is not UTF-8); its dead-letter copy carries them byte for byte"
)

#: How long a committed-offset look-up or a position query may take.
LOOKUP_WAIT_S = 5.0

#: How long commits refused by a rebalance make the consumer poll their batches again rather
#: than hand them out. A rebalance normally ends within seconds; past this (a member stuck
#: behind its group), batches are handed out uncommitted, as for any other failed commit:
#: polling again would refresh their Starts for ever and deliver nothing.
REFUSED_GRACE_S = 10.0

#: The commit errors that mean the group moved on without this member's generation (a
#: rebalance under way, or the member fenced or forgotten), so that its partitions may be
#: handed to another worker, rather than that the coordinator could not be reached.
MOVED_BY_REBALANCE = frozenset(
    {
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError.FENCED_INSTANCE_ID,
        KafkaError.STALE_MEMBER_EPOCH,
        KafkaError.FENCED_MEMBER_EPOCH,
        KafkaError._ASSIGNMENT_LOST,
    }
)


def moved_by_rebalance(e: KafkaException) -> bool:
    """Whether a failed commit's error is one of :data:`MOVED_BY_REBALANCE`."""
    error = e.args[0] if e.args else None
    return isinstance(error, KafkaError) and error.code() in MOVED_BY_REBALANCE


class Delivery:
    """One record handed to the application, to be settled exactly once."""

    def __init__(self, owner: RedeliveryConsumer, polled: _Polled, started_at: float) -> None:
        msg, headers, attempt, timeout_ms = polled
        headers = headers or []
        self._owner = owner
        self.topic: str = msg.topic()
        self.partition: int = msg.partition()
        self.offset: int = msg.offset()
        self.key: bytes | None = msg.key()
        self.value: bytes | None = msg.value()
        self.headers: hdr.Headers = headers
        self.attempt = attempt
        self.timeout_ms = timeout_ms
        self.original: m.Source | None = hdr.original(headers) if headers else None
        self.settled = False
        self._kept_alive = False
        # When the tracker may redeliver it, by time.monotonic(): when its Start was sent, plus
        # its timeout. The tracker counts from the Start's broker timestamp, a little later, so
        # a delivery expired by this clock is due there too (see RedeliveryConsumer.poll).
        self._expires = started_at + timeout_ms / 1000

    @property
    def source(self) -> m.Source:
        return m.Source(self.topic, self.partition, self.offset)

    def ack(self) -> None:
        """The record is done: it will not be redelivered. Returns once its End is durable."""
        self._settle(m.Settle(self.topic, self.partition, ends=[self.offset]))

    def nack(self, delay_s: float | None = None) -> None:
        """Give the record back: redelivered after ``delay_s``, or after the retry policy's
        delay (and to the dead-letter topic once the policy's limit is reached)."""
        if delay_s is None:
            policy = self._owner.retry
            limit = policy.limit(hdr.max_deliveries(self.headers))
            if limit is not None and self.attempt >= limit:
                self.reject(f"delivered {self.attempt} times; the retry policy allows {limit}")
                return
            delay_s = policy.delay_after(self.attempt)
        delay_ms = max(int(delay_s * 1000), 0)
        self._settle(m.Settle(self.topic, self.partition, nacks=[(self.offset, delay_ms)]))

    def reject(self, reason: str) -> None:
        """Refuse the record: the tracker sends it to the dead-letter topic with ``reason``."""
        self._settle(m.Settle(self.topic, self.partition, rejects=[(self.offset, reason)]))

    def keep_alive(self, timeout_s: float | None = None) -> None:
        """Push the deadline out to ``timeout_s`` (default: this delivery's timeout) from now."""
        if self.settled:
            raise RedeliveryError("keep_alive on a settled delivery")
        ms = self.timeout_ms if timeout_s is None else int(timeout_s * 1000)
        marker = m.Settle(self.topic, self.partition, keep_alives=[(self.offset, ms)])
        self._owner._write(marker, self)

    def auto_keep_alive(self) -> None:
        """Keeps the delivery alive in the background, a KeepAlive every third of its timeout,
        until it is settled or let go of (see the keepalive module). For a handler that may
        run longer than the timeout: the record is then redelivered only if this process hangs
        or dies. Calling it again does nothing."""
        if self.settled or self._kept_alive:
            return
        self._kept_alive = True
        self._owner._keep_alives.keep(self)

    def _expired(self, now: float) -> bool:
        """Whether its deadline passed by ``now`` while nothing kept it alive."""
        return not self._kept_alive and now >= self._expires

    def abandon(self) -> None:
        """Give up on the delivery without telling the tracker: it is redelivered when its
        timeout passes, as if this process had hung. Frees its place under the bound."""
        if not self.settled:
            self.settled = True
            self._owner._settled(self)

    def __del__(self) -> None:
        # Let go of unsettled: released for redelivery at once (a Nack without delay), as the
        # Rust client does on drop, and its place under the bound freed. Only queued here: a
        # finalizer may run on any thread, even inside one of our locks, so the consumer's next
        # poll writes the release (RedeliveryConsumer._release_dropped).
        if not getattr(self, "settled", True):
            self._owner._dropped.append(self.source)

    def _settle(self, marker: m.Settle) -> None:
        if self.settled:
            raise RedeliveryError(f"{self.source} is already settled")
        self.settled = True
        self._owner._settled(self)
        self._owner._write(marker, self)

    def __repr__(self) -> str:
        return f"Delivery({self.topic}/{self.partition}@{self.offset}, attempt {self.attempt})"


class RedeliveryConsumer:
    """A Kafka consumer whose records are acknowledged one by one (see the module docs).

    ``config`` adds librdkafka settings to both the consumer and the markers producer (for
    example SASL). ``marker_format`` 2 (the default) writes one Start per source partition of
    each batch; 1 writes one marker per record, for a tracker older than version 2.
    ``auto_keep_alive`` keeps every delivery alive until it is settled, as
    :meth:`Delivery.auto_keep_alive` does for one.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        group_id: str,
        topics: list[str],
        markers_topic: str,
        *,
        timeout_s: float = 30.0,
        max_unsettled: int = 1000,
        retry: RetryPolicy | None = None,
        config: dict[str, Any] | None = None,
        max_batch: int = 500,
        marker_format: int = 2,
        auto_keep_alive: bool = False,
    ) -> None:
        if marker_format not in (1, 2):
            raise ValueError(f"marker_format must be 1 or 2, not {marker_format}")
        extra = dict(config or {})
        self.retry = retry or RetryPolicy()
        self.timeout_ms = int(timeout_s * 1000)
        self.max_unsettled = max(max_unsettled, 1)
        self.max_batch = max(max_batch, 1)
        self.marker_format = marker_format
        self._consumer = Consumer(
            {
                "bootstrap.servers": bootstrap_servers,
                "group.id": group_id,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "auto.offset.reset": "earliest",
                # librdkafka waits a second (its default) before fetching again once its
                # queue is full; a consumer that drains it in milliseconds would idle the
                # rest of that second. The Rust client sets the same (src/kafka.rs).
                "fetch.queue.backoff.ms": 10,
                **extra,
            }
        )
        producer = durable_producer({"bootstrap.servers": bootstrap_servers, **extra})
        meta = self._consumer.list_topics(markers_topic, timeout=10)
        found = meta.topics.get(markers_topic)
        if found is None or found.error is not None or not found.partitions:
            why = "missing" if found is None else (found.error or "no partitions")
            self._consumer.close()
            raise RedeliveryError(
                f"markers topic {markers_topic!r} is not usable ({why}); "
                "create it with `redelivery-tracker topics create`"
            )
        self._writer = MarkerWriter(producer, markers_topic, len(found.partitions))
        self._gatherer = SettleGatherer(self._writer, marker_format)
        self.auto_keep_alive = auto_keep_alive
        self._keep_alives = KeepAlives(self._gatherer)
        self._leases = Leases(self._keep_alives)
        # Since when commits have been refused by a rebalance without a success in between.
        self._refused_since: float | None = None
        # Partitions whose first record is checked against the offset they should resume at
        # (see the resume module): after an assignment, a seek of ours, a resume of fetching.
        self._resuming: dict[tuple[str, int], ResumeCheck] = {}
        self._consumer.subscribe(
            list(topics),
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_revoke,
        )
        self._ready: deque[Delivery] = deque()
        # Deliveries let go of unsettled (Delivery.__del__), to be released by the next poll;
        # a deque because its appends and pops need no lock of ours.
        self._dropped: deque[m.Source] = deque()
        # Releases on their way: (what they release, their write), checked at each poll.
        self._releases: list[tuple[str, Write]] = []
        self._lock = threading.Lock()
        self._unsettled = 0
        self._paused = False
        self._failed: str | None = None
        self._closed = False
        self._expired_count = 0
        self._expired_logged_at: float | None = None

    @property
    def expired_before_handout(self) -> int:
        """Deliveries whose timeout passed while they waited in this consumer for the
        application (taken from Kafka with an earlier batch): not handed out, since the tracker
        redelivers their records. A count that grows says the application works more slowly
        than its deliveries time out: lower ``max_batch``, or raise the timeout."""
        return self._expired_count

    @property
    def held_through_rebalances(self) -> int:
        """Records whose Starts were durable but which were held back, kept alive, because a
        rebalance refused their commit (see the lease module)."""
        return self._leases.count

    @property
    def unsettled(self) -> int:
        """Deliveries handed out and not settled yet (nor let go of)."""
        with self._lock:
            return self._unsettled - len(self._dropped)

    def poll(self, timeout_s: float = 1.0) -> Delivery | None:
        """The next delivery, or ``None`` if none came within ``timeout_s``.

        A delivery whose timeout passed while it waited here for the application (the rest of
        an earlier batch) is not handed out: the tracker redelivers its record, and handing it
        out as well would deliver it twice. It is counted (:attr:`expired_before_handout`) and
        logged. One kept alive automatically does not expire."""
        until = time.monotonic() + timeout_s
        while True:
            self._fill(max(until - time.monotonic(), 0.0))
            now = time.monotonic()
            while self._ready:
                d = self._ready.popleft()
                if not d._expired(now):
                    return d
                self._expire(d)
            if now >= until:
                return None

    def poll_batch(self, timeout_s: float = 1.0) -> list[Delivery]:
        """Every delivery already taken from Kafka, or the next poll batch (at most
        ``max_batch``) if none was; empty if none came within ``timeout_s``. With
        :meth:`ack_many`, the cheap way to work a batch at a time. Deliveries that timed out
        while they waited are left out, as in :meth:`poll`."""
        until = time.monotonic() + timeout_s
        while True:
            self._fill(max(until - time.monotonic(), 0.0))
            now = time.monotonic()
            batch = []
            for d in self._ready:
                if d._expired(now):
                    self._expire(d)
                else:
                    batch.append(d)
            self._ready.clear()
            if batch or now >= until:
                return batch

    def _expire(self, d: Delivery) -> None:
        """Lets go of ``d``, whose deadline passed before the application took it, without a
        marker: the tracker's copy is its next delivery. Logged at most once per 10 s."""
        d.abandon()
        self._expired_count += 1
        now = time.monotonic()
        if self._expired_logged_at is None or now - self._expired_logged_at >= 10.0:
            self._expired_logged_at = now
            log.warning(
                "%s: its timeout passed before the application took it; not handed out, the "
                "tracker redelivers it (%d so far; the application works more slowly than its "
                "deliveries time out: lower max_batch, or raise the timeout)",
                d,
                self._expired_count,
            )

    def _fill(self, timeout_s: float) -> None:
        """Polls Kafka for the next batch (steps 1 to 4) if nothing is ready to hand out."""
        if self._failed is not None:
            raise RedeliveryError(f"the consumer stopped: {self._failed}")
        if self._closed:
            raise RedeliveryError("the consumer is closed")
        self._release_dropped()
        if not self._ready:
            room = self.max_unsettled - self.unsettled
            self._set_paused(room <= 0)
            # Paused, the poll only serves rebalances (a partition assigned meanwhile is paused
            # as it comes); a limit of one bounds what a pause that failed lets through.
            limit = 1 if room <= 0 else min(room, self.max_batch)
            wait = min(timeout_s, 0.1) if room <= 0 else timeout_s
            messages = self._consumer.consume(num_messages=limit, timeout=wait)
            batch = []
            for msg in messages:
                if msg.error() is not None:
                    log.warning("consumer error: %s", msg.error())
                else:
                    batch.append(msg)
            if self._resuming:
                batch = self._checked(batch)
                if not self._paused:
                    self._check_stalled()
            if batch:
                self._start(batch)

    def __iter__(self) -> Iterator[Delivery]:
        while not self._closed:
            d = self.poll(1.0)
            if d is not None:
                yield d

    def close(self) -> None:
        """Leaves the group. Deliveries taken from Kafka but not handed out yet, and those let
        go of unsettled, are released for redelivery at once; those still held can be settled
        until the process ends, and are redelivered after their timeout if they are not."""
        if self._closed:
            return
        self._closed = True
        while self._ready:
            d = self._ready.popleft()
            try:
                d.nack(0.0)
            except RedeliveryError as e:
                log.warning("release of %s failed (%s); it times out instead", d, e)
        self._release_dropped()
        # Leaving the group settles it: the records held back go to the next owners.
        self._leases.group_settled()
        self._set_paused(False)
        self._consumer.close()
        self._writer.producer.flush(10)
        self._check_releases()

    def ack_many(self, deliveries: list[Delivery]) -> None:
        """Acknowledges many deliveries at once: one Settle marker per source partition, all
        written together, returning once every one is durable. Far cheaper per record than
        one ``ack()`` after another, each of which waits for its own marker."""
        by_partition: dict[tuple[str, int], list[int]] = {}
        for d in deliveries:
            if d.settled:
                raise RedeliveryError(f"{d.source} is already settled")
        for d in deliveries:
            d.settled = True
            self._settled(d)
            by_partition.setdefault((d.topic, d.partition), []).append(d.offset)
        writes = []
        for (topic, partition), offsets in by_partition.items():
            if self.marker_format == 1:
                for o in offsets:
                    writes.append(
                        self._writer.send(m.End(m.Source(topic, partition, o)), topic, partition)
                    )
            else:
                # One Settle per partition, split where a marker would exceed the records
                # a tracker accepts in one.
                for i in range(0, len(offsets), m.MAX_BATCH_RECORDS):
                    marker = m.Settle(topic, partition, ends=offsets[i : i + m.MAX_BATCH_RECORDS])
                    writes.append(self._writer.send(marker, topic, partition))
        self._writer.wait(writes)
        failed = [w.error for w in writes if w.error is not None]
        if failed:
            raise RedeliveryError(f"{len(failed)} End markers not written: {failed[0]}")

    def _set_paused(self, pause: bool) -> None:
        if pause == self._paused and not pause:
            return
        assignment = self._consumer.assignment()
        if not assignment:
            self._paused = pause
            return
        try:
            if pause:
                self._consumer.pause(assignment)
            else:
                self._consumer.resume(assignment)
                resumed_fetching(
                    self._resuming,
                    (
                        (tp.topic, tp.partition, tp.offset)
                        for tp in self._consumer.position(assignment)
                        if tp.error is None and tp.offset >= 0
                    ),
                )
            self._paused = pause
        except KafkaException as e:
            log.warning("could not pause/resume fetching: %s", e)

    def _on_assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """A rebalance gave us ``partitions``: each resumes at its committed offset, checked.
        One look-up for all of them; a partition with nothing committed starts where
        ``auto.offset.reset`` says, at a batch, unchecked."""
        # Whatever it holds, the group has settled: the records held back are read again by
        # whoever owns their partitions now.
        self._leases.group_settled()
        for tp in partitions:
            self._resuming.pop((tp.topic, tp.partition), None)
        if self._paused:
            # Paused for back-pressure: the new partitions are paused before they are assigned
            # (librdkafka keeps the pause through the assignment), so none of their records
            # comes past max_unsettled.
            try:
                consumer.pause(partitions)
            except KafkaException as e:
                log.warning("could not pause newly assigned partitions: %s", e)
        try:
            committed = consumer.committed(partitions, timeout=LOOKUP_WAIT_S)
        except KafkaException as e:
            log.debug("committed offsets look-up failed (%s); not checking the resume", e)
            return
        self._check_resumes_at(committed)

    def _on_revoke(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        """``partitions`` are taken away (revoked or lost). librdkafka keeps an application's
        pause on a partition after it is revoked, and ``_set_paused(False)`` resumes only the
        current assignment: a partition taken away while back-pressure paused fetching would
        come back paused for good. Resuming it here clears that; it is unassigned next, so
        nothing is fetched for it meanwhile."""
        for tp in partitions:
            self._resuming.pop((tp.topic, tp.partition), None)
        try:
            consumer.resume(partitions)
        except KafkaException as e:
            log.warning("could not clear the pause of revoked partitions: %s", e)

    def _check_resumes_at(self, positions: list[TopicPartition]) -> None:
        for tp in positions:
            if tp.error is None and tp.offset >= 0:
                self._resuming[(tp.topic, tp.partition)] = ResumeCheck(tp.offset)

    def _check_stalled(self) -> None:
        """Checks that saw no record for a while ask for their partition's end offset (see the
        resume module): a broker may answer a fetch inside the last batch with nothing."""
        now = time.monotonic()
        for tp, check in list(self._resuming.items()):
            if not check.is_stalled(now):
                continue
            # The end the last fetch answer reported, which is right where a ListOffsets
            # answer may not be (Tansu 0.6 answers one past its last batch's first offset);
            # asked for only when no fetch answered yet.
            try:
                _low, end = self._consumer.get_watermark_offsets(TopicPartition(*tp), cached=True)
                if end < 0:
                    _low, end = self._consumer.get_watermark_offsets(
                        TopicPartition(*tp), timeout=LOOKUP_WAIT_S
                    )
            except KafkaException as e:
                log.debug("%s/%s: end offset look-up failed (%s)", *tp, e)
                continue
            step = check.stalled(end)
            if step is Step.KEEP:
                del self._resuming[tp]
            elif step is Step.SEEK:
                self._seek_back(tp, check, end)

    def _seek_back(self, tp: tuple[str, int], check: ResumeCheck, seen: int) -> bool:
        """Sends the consumer to ``check.seek_to``; false (and the check ended) if it failed."""
        try:
            self._consumer.seek(TopicPartition(*tp, check.seek_to))
        except KafkaException as e:
            del self._resuming[tp]
            log.warning(
                "%s/%s: could not seek back to the resume offset %s (%s); records from it up "
                "to %s may be skipped (a broker that answers a fetch inside a batch with a "
                "later one)",
                *tp,
                check.resume_at,
                e,
                seen,
            )
            return False
        log.debug(
            "%s/%s resumed at %s past its offset %s; seeking back to %s",
            *tp,
            seen,
            check.resume_at,
            check.seek_to,
        )
        return True

    def _checked(self, batch: list[Any]) -> list[Any]:
        """``batch`` without the records a resume check drops. Once a partition is sent
        further back, the rest of its records in this batch come from the old fetch and are
        dropped too: they come again in order."""
        kept = []
        sought: set[tuple[str, int]] = set()
        for msg in batch:
            tp = (msg.topic(), msg.partition())
            if tp in sought:
                continue
            check = self._resuming.get(tp)
            if check is None:
                kept.append(msg)
                continue
            step = check.step(msg.offset())
            if step is Step.KEEP:
                del self._resuming[tp]
                if check.gave_up:
                    log.warning(
                        "%s/%s: no fetch started at or before the resume offset %s; going on "
                        "from %s",
                        *tp,
                        check.resume_at,
                        msg.offset(),
                    )
                kept.append(msg)
            elif step is Step.SEEK:
                if self._seek_back(tp, check, msg.offset()):
                    sought.add(tp)
                else:
                    kept.append(msg)
            else:
                check.since = time.monotonic()
        return kept

    def _start(self, batch: list[Any]) -> None:
        """Steps 1 to 4 for one polled batch."""
        # Read before the Starts go: each delivery's deadline counts from here.
        started_at = time.monotonic()
        groups: dict[tuple[str, int], list[_Polled]] = {}
        for msg in batch:
            groups.setdefault((msg.topic(), msg.partition()), []).append(self._read(msg))
        planned: list[tuple[tuple[str, int], list[Write]]] = []
        for (topic, partition), polled in groups.items():
            writes = [self._writer.send(mk, topic, partition) for mk in self._starts(polled)]
            planned.append(((topic, partition), writes))
        self._writer.wait([w for _, ws in planned for w in ws])
        commit: list[TopicPartition] = []
        handed: list[_Polled] = []
        for (topic, partition), writes in planned:
            polled = groups[(topic, partition)]
            failed = [w.error for w in writes if w.error is not None]
            if failed:
                first = polled[0][0].offset()
                log.warning(
                    "Start marker for %s/%s not durable (%s); not committing past offset %s "
                    "and polling it again",
                    topic,
                    partition,
                    failed[0],
                    first,
                )
                try:
                    self._consumer.seek(TopicPartition(topic, partition, first))
                except KafkaException as e:
                    self._failed = f"seeking {topic}/{partition} back to {first} failed: {e}"
                    raise RedeliveryError(self._failed) from e
                self._resuming[(topic, partition)] = ResumeCheck(first)
                continue
            commit.append(TopicPartition(topic, partition, polled[-1][0].offset() + 1))
            handed.extend(polled)
        if commit:
            handed = self._commit(commit, handed)
        if not handed:
            return
        self._leases.handed_out(
            m.Source(p[0].topic(), p[0].partition(), p[0].offset()) for p in handed
        )
        unreadable = [p for p in handed if p[1] is None]
        if unreadable:
            handed = [p for p in handed if p[1] is not None]
            self._dead_letter_unreadable(unreadable)
        with self._lock:
            self._unsettled += len(handed)
        deliveries = [Delivery(self, p, started_at) for p in handed]
        if self.auto_keep_alive:
            for d in deliveries:
                d.auto_keep_alive()
        self._ready.extend(deliveries)

    def _commit(self, offsets: list[TopicPartition], handed: list[_Polled]) -> list[_Polled]:
        """Step 3's commit of ``offsets``; the records of ``handed`` to hand out after it: all
        of them unless a rebalance refused the commit (see the lease module)."""
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as e:
            if moved_by_rebalance(e):
                return self._refused(e, handed)
            # The Starts are durable, so handing over is still safe: at worst the batch is
            # polled again after a rebalance and delivered twice.
            log.warning("commit failed: %s", e)
        self._refused_since = None
        return handed

    def _refused(self, e: KafkaException, handed: list[_Polled]) -> list[_Polled]:
        """A rebalance refused the commit of ``handed``: the group moved on without this
        member's generation, and the partitions may go to another worker, which reads from
        the committed offset. Handed out here too, the batch would be delivered twice; polled
        again instead (each partition sought back to its first record), it is delivered here
        if the partitions stay, and there if they move. Meanwhile it is kept alive. Returns
        what is handed out anyway: everything once refusals have lasted
        :data:`REFUSED_GRACE_S`, and the records of a partition that could not be sought
        back (their Starts are durable, so at worst they are delivered twice)."""
        now = time.monotonic()
        if self._refused_since is None:
            self._refused_since = now
        if now - self._refused_since >= REFUSED_GRACE_S:
            log.warning(
                "commits refused by a rebalance for %.0f s (%s); handing the batch out uncommitted",
                now - self._refused_since,
                e,
            )
            return handed
        groups: dict[tuple[str, int], list[_Polled]] = {}
        for p in handed:
            groups.setdefault((p[0].topic(), p[0].partition()), []).append(p)
        out: list[_Polled] = []
        held: list[_Polled] = []
        for (topic, partition), polled in groups.items():
            first = polled[0][0].offset()
            try:
                self._consumer.seek(TopicPartition(topic, partition, first))
            except KafkaException as se:
                log.warning(
                    "%s/%s: could not seek back to %s after a refused commit (%s); handing "
                    "its records out uncommitted",
                    topic,
                    partition,
                    first,
                    se,
                )
                out.extend(polled)
                continue
            self._resuming[(topic, partition)] = ResumeCheck(first)
            held.extend(polled)
        log.info(
            "commit refused by a rebalance (%s); not handing %d records out, polling them again "
            "(kept alive until the group settles)",
            e,
            len(held),
        )
        self._leases.hold(
            (m.Source(msg.topic(), msg.partition(), msg.offset()), timeout)
            for msg, _, _, timeout in held
        )
        return out

    def _starts(self, polled: list[_Polled]) -> list[m.Marker]:
        """The Start markers for one source partition's records of a batch, in offset order."""
        if self.marker_format == 1:
            return [
                m.Start(m.Source(msg.topic(), msg.partition(), msg.offset()), timeout, attempt)
                for msg, _, attempt, timeout in polled
            ]
        out: list[m.Marker] = []
        for i in range(0, len(polled), m.MAX_BATCH_RECORDS):
            chunk = polled[i : i + m.MAX_BATCH_RECORDS]
            first = chunk[0][0]
            batch = m.StartBatch(first.topic(), first.partition(), self.timeout_ms, [])
            for msg, _, attempt, timeout in chunk:
                offset = msg.offset()
                batch.offsets.append(offset)
                if attempt != 1:
                    batch.attempts.append((offset, attempt))
                if timeout != self.timeout_ms:
                    batch.timeouts.append((offset, timeout))
            out.append(batch)
        return out

    def _read(self, msg: Any) -> _Polled:
        """A polled record with its headers read once: they give its attempt and timeout.

        confluent-kafka raises for a header name that is not UTF-8 (which the C, Go and Java
        clients write): such a record cannot be handed to Python as written, and without its
        ``kr-attempt`` a failing handler could see it redelivered forever. It is started like
        any other record and then rejected to the dead-letter topic
        (``_dead_letter_unreadable``), where the tracker's copy keeps the headers byte for
        byte. The message is not asked for its headers again: it keeps a broken list."""
        try:
            headers = hdr.of_message(msg)
        except Exception as e:  # SystemError wrapping a UnicodeDecodeError, in 2.16
            log.warning(
                "%s/%s@%s: headers not readable (%s); it goes to the dead-letter topic",
                msg.topic(),
                msg.partition(),
                msg.offset(),
                e,
            )
            return (msg, None, 1, self.timeout_ms)
        if not headers:
            # Most records carry none: nothing to look up.
            return (msg, headers, 1, self.timeout_ms)
        return (
            msg,
            headers,
            hdr.attempt(headers),
            hdr.timeout_ms(headers) or self.timeout_ms,
        )

    def _dead_letter_unreadable(self, polled: list[_Polled]) -> None:
        """Rejects records whose headers cannot be read (see ``_read``), their Starts durable:
        the tracker sends each to the dead-letter topic with the reason. If a Reject is not
        written, the record comes back after its timeout and is rejected then."""
        sources = [m.Source(msg.topic(), msg.partition(), msg.offset()) for msg, _, _, _ in polled]
        items = [
            (m.Settle(s.topic, s.partition, rejects=[(s.offset, UNREADABLE_HEADERS)]), s)
            for s in sources
        ]
        for (_, source), error in zip(items, self._gatherer.settle_all(items), strict=True):
            if error is not None:
                log.warning("rejecting %s failed (%s); it times out and comes back", source, error)

    def _release_dropped(self) -> None:
        """Writes a release (a Nack without delay) for every delivery let go of unsettled since
        the last poll, one marker per source partition, without waiting for it: a release
        that fails leaves its records to their timeout, and :meth:`_check_releases` says so."""
        self._check_releases()
        if not self._dropped:
            return
        by_partition: dict[tuple[str, int], list[int]] = {}
        while self._dropped:
            src = self._dropped.popleft()
            with self._lock:
                self._unsettled -= 1
            by_partition.setdefault((src.topic, src.partition), []).append(src.offset)
        step = m.MAX_BATCH_RECORDS
        for (topic, partition), offsets in by_partition.items():
            what = f"{len(offsets)} deliveries of {topic}/{partition} (from offset {offsets[0]})"
            log.debug("releasing %s let go of unsettled", what)
            markers: list[m.Marker]
            if self.marker_format == 1:
                markers = [m.Nack(m.Source(topic, partition, o), 0) for o in offsets]
            else:
                markers = [
                    m.Settle(topic, partition, nacks=[(o, 0) for o in offsets[i : i + step]])
                    for i in range(0, len(offsets), step)
                ]
            for marker in markers:
                try:
                    self._releases.append((what, self._writer.send(marker, topic, partition)))
                except Exception as e:  # the records still come back, after their timeout
                    log.warning("releasing %s failed (%s); they time out instead", what, e)

    def _check_releases(self) -> None:
        """Forgets the releases the broker answered, with a warning for each that failed."""
        waiting = []
        for what, w in self._releases:
            if not w.done.is_set():
                waiting.append((what, w))
            elif w.error is not None:
                log.warning("releasing %s failed (%s); they time out instead", what, w.error)
        self._releases = waiting

    def _settled(self, _d: Delivery) -> None:
        with self._lock:
            self._unsettled -= 1

    def _write(self, marker: m.Settle, d: Delivery) -> None:
        """Writes one record's settlement (version 1: the marker it stands for), gathered with
        those other threads make meanwhile, and waits for it (see the gather module)."""
        self._gatherer.settle(marker, d.source)
