"""Delayed and scheduled delivery: send a record now, have it delivered later.

:meth:`Scheduler.send_after` and :meth:`Scheduler.send_at` write the whole record into a
Schedule marker on the markers topic and return its :class:`ScheduleId`, the marker's own
partition and offset. The tracker keeps only a small slot per schedule; when the record falls
due it reads the marker back, produces the record to its topic, and writes an End.
:meth:`Scheduler.cancel` writes an End first, so that the tracker forgets it instead. The
same markers, the same rules and the same answers as the Rust client's ``Scheduler``.

The markers topic's retention is the only limit on how far ahead a record can be scheduled:
the marker must still be there when it falls due. The scheduler reads ``retention.ms`` when
it is created and refuses, with :class:`BeyondRetentionError`, a due time too close to it.
"""

from __future__ import annotations

import enum
import itertools
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin._config import ConfigResource

from . import markers as m
from .writer import MarkerWriter, RedeliveryError, durable_producer

#: How long one scan of a markers partition may read nothing before it gives up.
SCAN_STALL_S = 30.0

#: The header that caps a record's deliveries (as in the Rust client).
MAX_DELIVERIES_HEADER = "kr-max-deliveries"


class BeyondRetentionError(RedeliveryError):
    """A due time past the markers topic's retention (less its margin): the Schedule marker
    would be deleted before the tracker could deliver it."""


@dataclass(frozen=True, order=True)
class ScheduleId:
    """Where a Schedule marker sits in the markers topic; shown and parsed as
    ``partition@offset``. The ``kr-schedule-id`` header of a delivered record,
    ``markers-topic/partition@offset``, parses too."""

    partition: int
    offset: int

    def __str__(self) -> str:
        return f"{self.partition}@{self.offset}"

    @classmethod
    def parse(cls, text: str) -> ScheduleId:
        """``partition@offset``, after an optional ``topic/``; :class:`ValueError` if not."""
        coordinates = text.rsplit("/", 1)[-1]
        partition, at, offset = coordinates.partition("@")
        try:
            if not at:
                raise ValueError
            parsed = cls(int(partition), int(offset))
        except ValueError:
            raise ValueError(f"{text!r} is not a schedule id (partition@offset)") from None
        if parsed.partition < 0 or parsed.offset < 0:
            raise ValueError(f"{text!r} is not a schedule id (partition@offset)")
        return parsed


class CancelOutcome(enum.Enum):
    """What :meth:`Scheduler.cancel` found."""

    #: The schedule was pending; it will never be delivered.
    CANCELLED = "cancelled"
    #: It was already delivered to its topic.
    ALREADY_DELIVERED = "already_delivered"
    #: It had been cancelled before.
    ALREADY_CANCELLED = "already_cancelled"
    #: No schedule has this id (never written, or removed by the markers topic's retention).
    NOT_FOUND = "not_found"


def retention_margin_ms(retention_ms: int) -> int:
    """How long before the markers topic's retention a schedule must fall due: a tenth of it,
    at most an hour, so that a tracker down for a while still finds the marker."""
    return min(retention_ms // 10, 3_600_000)


def scheduled(
    topic: str,
    value: bytes | None = None,
    *,
    key: bytes | None = None,
    headers: list[tuple[str, bytes | None]] | None = None,
    partition: int | None = None,
    max_deliveries: int | None = None,
) -> m.ScheduledRecord:
    """The record to schedule, checked against what a Schedule marker can carry (a
    :class:`ValueError` says what it cannot). Without ``partition``, the record goes where
    its key puts it (the Java client's partitioner) when it is delivered."""
    all_headers = list(headers or [])
    if max_deliveries is not None:
        if max_deliveries < 1:
            raise ValueError("max_deliveries must be at least 1")
        all_headers.append((MAX_DELIVERIES_HEADER, str(max_deliveries).encode()))
    if not topic or len(topic) > 249:
        raise ValueError(f"{topic!r} is not a Kafka topic name")
    if partition is not None and partition < 0:
        raise ValueError("a partition cannot be negative")
    if len(all_headers) > 0xFFFF:
        raise ValueError(f"{len(all_headers)} headers; a schedule carries at most 65535")
    for name, _ in all_headers:
        if len(name.encode("utf-8")) > 0xFFFF:
            raise ValueError("a header name is longer than 65535 bytes")
    return m.ScheduledRecord(topic, partition, key, value, all_headers)


def due_at(marker: m.Marker, timestamp_ms: int) -> int | None:
    """When a Schedule marker appended at ``timestamp_ms`` is due; ``None`` for any other."""
    if not isinstance(marker, m.Schedule):
        return None
    return max(timestamp_ms + marker.delay_ms, marker.not_before_ms)


def ended_before_us(end_timestamp_ms: int, due_ms: int) -> CancelOutcome:
    """An End appended before the due time can only be a cancel: the tracker writes its End
    after delivering, which it does at the due time or later."""
    if end_timestamp_ms < due_ms:
        return CancelOutcome.ALREADY_CANCELLED
    return CancelOutcome.ALREADY_DELIVERED


@dataclass(frozen=True)
class _Pending:
    due_ms: int


@dataclass(frozen=True)
class _Ended:
    offset: int
    timestamp_ms: int
    due_ms: int


class Scheduler:
    """Writes Schedule markers and cancels them. Safe to share between threads.

    ``config`` adds librdkafka settings (for example SASL) to every client it makes.
    ``settle_wait_s`` is how long :meth:`cancel` waits to learn whether a tracker that had
    already taken a due schedule delivered it.
    """

    def __init__(
        self,
        bootstrap_servers: str,
        markers_topic: str,
        *,
        settle_wait_s: float = 5.0,
        config: dict[str, Any] | None = None,
    ) -> None:
        self.markers_topic = markers_topic
        self.settle_wait_s = settle_wait_s
        self._common = {"bootstrap.servers": bootstrap_servers, **(config or {})}
        self._producer = durable_producer(self._common)
        found = self._producer.list_topics(markers_topic, timeout=10).topics.get(markers_topic)
        if found is None or found.error is not None or not found.partitions:
            why = "missing" if found is None else (found.error or "no partitions")
            raise RedeliveryError(
                f"markers topic {markers_topic!r} is not usable ({why}); "
                "create it with `redelivery-tracker topics create`"
            )
        self._partitions = len(found.partitions)
        self._writer = MarkerWriter(self._producer, markers_topic, self._partitions)
        self._retention_ms = self._read_retention()
        self._next = itertools.count()
        self._lock = threading.Lock()

    @property
    def horizon_s(self) -> float | None:
        """How far ahead a record may be scheduled: the markers topic's retention less a
        margin; ``None`` when the topic keeps records forever."""
        if self._retention_ms is None:
            return None
        return (self._retention_ms - retention_margin_ms(self._retention_ms)) / 1000.0

    def send_after(self, rec: m.ScheduledRecord, delay_s: float) -> ScheduleId:
        """Sends ``rec`` (see :func:`scheduled`) to be delivered ``delay_s`` from now, measured on
        the broker's clock from the moment the Schedule marker is appended."""
        if delay_s < 0:
            raise ValueError("a delay cannot be negative")
        self._check_horizon(delay_s)
        return self._write(m.Schedule(0, int(delay_s * 1000), rec))

    def send_at(self, rec: m.ScheduledRecord, at: datetime | float) -> ScheduleId:
        """Sends ``rec`` to be delivered at ``at`` (an aware datetime, or Unix time in
        seconds), as the broker's clock tells it. A time in the past means at once."""
        at_s = at.timestamp() if isinstance(at, datetime) else float(at)
        self._check_horizon(max(at_s - time.time(), 0.0))
        # 0 means "no absolute time" on the wire; the epoch itself is long past anyway.
        return self._write(m.Schedule(max(int(at_s * 1000), 1), 0, rec))

    def cancel(self, schedule: ScheduleId) -> CancelOutcome:
        """Cancels a pending schedule. Not an error if it was already delivered, already
        cancelled, or never existed: the outcome says which.

        It reads the markers partition from the Schedule marker on to find out, and if no End
        follows, writes one. A tracker that had already taken the schedule when it fell due
        may be producing it at that moment: if our End lands at or after the due time, this
        waits up to ``settle_wait_s`` for that tracker's End and answers
        ``ALREADY_DELIVERED`` if it comes. The scan reads every marker after the schedule in
        its partition, so it costs more the older the schedule is."""
        found = self._scan(schedule, None)
        if found is None:
            return CancelOutcome.NOT_FOUND
        if isinstance(found, _Ended):
            return ended_before_us(found.timestamp_ms, found.due_ms)
        me = m.Source(self.markers_topic, schedule.partition, schedule.offset)
        ours = self._produce(m.encode(m.End(me)), schedule.partition).offset
        settled = self._scan(schedule, ours)
        if not isinstance(settled, _Ended):
            # Our End is durable, so the scan cannot miss it: this would be a broker bug.
            raise RedeliveryError(
                f"the End written at {schedule.partition}@{ours} was not read back"
            )
        if settled.offset != ours:
            return ended_before_us(settled.timestamp_ms, settled.due_ms)
        if settled.timestamp_ms < settled.due_ms:
            return CancelOutcome.CANCELLED
        # Ours landed at or after the due time: a tracker may have taken the schedule just
        # before reading it. If so, its End follows shortly.
        if self._end_after(schedule, ours):
            return CancelOutcome.ALREADY_DELIVERED
        return CancelOutcome.CANCELLED

    def close(self) -> None:
        """Waits for anything still on its way."""
        self._producer.flush(10)

    def _check_horizon(self, due_in_s: float) -> None:
        horizon = self.horizon_s
        if horizon is not None and due_in_s > horizon:
            raise BeyondRetentionError(
                f"due in {due_in_s:.0f} s, but {self.markers_topic!r} keeps markers for "
                f"{self._retention_ms} ms: schedule at most {horizon:.0f} s ahead"
            )

    def _write(self, schedule: m.Schedule) -> ScheduleId:
        with self._lock:
            partition = next(self._next) % self._partitions
        return self._produce(m.encode(schedule), partition)

    def _produce(self, payload: bytes, partition: int) -> ScheduleId:
        """Writes ``payload`` to ``partition`` of the markers topic and returns where it
        landed once it is durable."""
        w = self._writer.send_to(payload, partition)
        self._writer.wait([w])
        if w.error is not None or w.offset is None:
            why = w.error or "the broker gave no offset"
            raise RedeliveryError(f"writing to {self.markers_topic}/{partition}: {why}")
        return ScheduleId(partition, w.offset)

    def _read_retention(self) -> int | None:
        """The markers topic's ``retention.ms``; ``None`` when it is unlimited."""
        admin = AdminClient(self._common)
        resource = ConfigResource(ConfigResource.Type.TOPIC, self.markers_topic)
        try:
            entries = admin.describe_configs([resource])[resource].result(timeout=10)
        except KafkaException as e:
            raise RedeliveryError(
                f"markers topic {self.markers_topic!r}: describing its configuration failed: {e}"
            ) from e
        entry = entries.get("retention.ms")
        if entry is None or entry.value is None:
            raise RedeliveryError(
                f"markers topic {self.markers_topic!r}: its configuration has no retention.ms"
            )
        try:
            ms = int(entry.value)
        except ValueError:
            raise RedeliveryError(
                f"markers topic {self.markers_topic!r}: retention.ms is {entry.value!r}"
            ) from None
        return None if ms < 0 else ms

    def _reader(self, partition: int, start: int) -> Any:
        c = Consumer(
            {
                **self._common,
                # Assigned, never subscribed: the group id is required but never joined.
                "group.id": "kafka-redelivery-schedule-scan",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": False,
            }
        )
        c.assign([TopicPartition(self.markers_topic, partition, start)])
        return c

    def _scan(self, schedule: ScheduleId, until: int | None) -> _Pending | _Ended | None:
        """Reads the Schedule marker at ``schedule`` and the markers after it, up to offset
        ``until`` (inclusive; the partition's end when the scan began if ``None``): the first
        End for it, or pending; ``None`` if there is no Schedule marker there."""
        c = self._reader(schedule.partition, schedule.offset)
        try:
            tp = TopicPartition(self.markers_topic, schedule.partition)
            low, high = c.get_watermark_offsets(tp, timeout=10)
            if not low <= schedule.offset < high:
                return None
            last = high - 1 if until is None else until
            me = m.Source(self.markers_topic, schedule.partition, schedule.offset)
            due_ms: int | None = None
            quiet_since = time.monotonic()
            while True:
                msg = c.poll(0.2)
                if msg is None:
                    if time.monotonic() - quiet_since > SCAN_STALL_S:
                        raise RedeliveryError(
                            f"reading {self.markers_topic}/{schedule.partition}: nothing read "
                            f"for {SCAN_STALL_S:.0f} s before offset {last}"
                        )
                    continue
                quiet_since = time.monotonic()
                if msg.error() is not None:
                    raise RedeliveryError(
                        f"reading {self.markers_topic}/{schedule.partition}: {msg.error()}"
                    )
                timestamp_ms = max(msg.timestamp()[1], 0)
                marker = _decoded(msg.value())
                if due_ms is None:
                    # The first record read must be the schedule itself.
                    due = None
                    if marker is not None and msg.offset() == schedule.offset:
                        due = due_at(marker, timestamp_ms)
                    if due is None:
                        return None
                    due_ms = due
                elif isinstance(marker, m.End) and marker.source == me:
                    return _Ended(msg.offset(), timestamp_ms, due_ms)
                if msg.offset() >= last:
                    return _Pending(due_ms)
        except KafkaException as e:
            raise RedeliveryError(f"reading {self.markers_topic}/{schedule.partition}: {e}") from e
        finally:
            c.close()

    def _end_after(self, schedule: ScheduleId, after: int) -> bool:
        """Whether another End for ``schedule`` is appended after offset ``after`` within
        ``settle_wait_s``."""
        c = self._reader(schedule.partition, after + 1)
        me = m.Source(self.markers_topic, schedule.partition, schedule.offset)
        deadline = time.monotonic() + self.settle_wait_s
        try:
            while time.monotonic() < deadline:
                msg = c.poll(0.1)
                if msg is None:
                    continue
                if msg.error() is not None:
                    raise RedeliveryError(
                        f"reading {self.markers_topic}/{schedule.partition}: {msg.error()}"
                    )
                marker = _decoded(msg.value())
                if isinstance(marker, m.End) and marker.source == me:
                    return True
            return False
        finally:
            c.close()


def _decoded(value: bytes | None) -> m.Marker | None:
    """The marker in ``value``; ``None`` for a tombstone or bytes that are not a marker (a
    scan skips them, as the tracker does)."""
    if value is None:
        return None
    try:
        return m.decode(value)
    except m.DecodeError:
        return None
