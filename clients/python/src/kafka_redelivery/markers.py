"""The marker format (docs/markers.md of the repository): values to bytes and back.

No I/O here. The decoder is total: any bytes give a marker or a :class:`DecodeError` whose
``kind`` is one of :data:`DECODE_ERROR_KINDS`, the same kinds the tracker counts. Both
versions are read; this client writes version 2 (batched) by default.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TypeVar

VERSION_1 = 1
VERSION_2 = 2
MAX_REASON_BYTES = 4096
MAX_BATCH_RECORDS = 65_536

DECODE_ERROR_KINDS = (
    "empty",
    "unknown_version",
    "unknown_type",
    "truncated",
    "invalid_utf8",
    "invalid_value",
    "trailing_bytes",
)


class DecodeError(ValueError):
    """Bytes that are not a marker this version understands; ``kind`` names why."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind


@dataclass(frozen=True)
class Source:
    """Where a record lives."""

    topic: str
    partition: int
    offset: int


@dataclass(frozen=True)
class Start:
    source: Source
    timeout_ms: int
    attempt: int


@dataclass(frozen=True)
class KeepAlive:
    source: Source
    timeout_ms: int


@dataclass(frozen=True)
class End:
    source: Source


@dataclass(frozen=True)
class Nack:
    source: Source
    delay_ms: int


@dataclass(frozen=True)
class Reject:
    source: Source
    reason: str


@dataclass(frozen=True)
class ScheduledRecord:
    topic: str
    partition: int | None
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Schedule:
    not_before_ms: int
    delay_ms: int
    record: ScheduledRecord


@dataclass(frozen=True)
class Tick:
    nonce: int


@dataclass
class StartBatch:
    """Version 2: deliveries of many records of one source partition began.

    ``offsets`` ascending and distinct; ``attempts`` and ``timeouts`` list ``(offset, value)``
    for the records whose attempt is not 1 or whose timeout is not ``timeout_ms``.
    """

    topic: str
    partition: int
    timeout_ms: int
    offsets: list[int]
    attempts: list[tuple[int, int]] = field(default_factory=list)
    timeouts: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Settle:
    """Version 2: many records of one source partition settled or kept alive.

    The tracker applies keep-alives, then nacks, then rejects, then ends.
    """

    topic: str
    partition: int
    keep_alives: list[tuple[int, int]] = field(default_factory=list)
    nacks: list[tuple[int, int]] = field(default_factory=list)
    rejects: list[tuple[int, str]] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)


Marker = Start | KeepAlive | End | Nack | Reject | Schedule | Tick | StartBatch | Settle

_V1_TYPES = {Start: 0x01, KeepAlive: 0x02, End: 0x03, Nack: 0x04, Reject: 0x05, Schedule: 0x06}


# --- encoding -------------------------------------------------------------------------------


def _cut(text: str, limit: int) -> bytes:
    """UTF-8 of ``text``, cut to at most ``limit`` bytes at a character boundary."""
    raw = text.encode("utf-8")
    if len(raw) <= limit:
        return raw
    return raw[:limit].decode("utf-8", "ignore").encode("utf-8")


def _string(text: str, limit: int = 0xFFFF) -> bytes:
    raw = _cut(text, limit)
    return struct.pack(">H", len(raw)) + raw


def _bytes(value: bytes | None) -> bytes:
    if value is None:
        return struct.pack(">i", -1)
    return struct.pack(">i", len(value)) + value


def _source(s: Source) -> bytes:
    return _string(s.topic) + struct.pack(">iq", s.partition, s.offset)


def varint(value: int) -> bytes:
    """Unsigned LEB128, shortest form."""
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for o in sorted(set(offsets)):
        if runs and runs[-1][0] + runs[-1][1] == o:
            runs[-1] = (runs[-1][0], runs[-1][1] + 1)
        else:
            runs.append((o, 1))
    return runs


def _offsets(offsets: list[int]) -> bytes:
    runs = _runs(offsets)
    out = bytearray(varint(len(runs)))
    nxt = 0
    for first, count in runs:
        out += varint(first - nxt) + varint(count)
        nxt = first + count
    return bytes(out)


T = TypeVar("T")


def _canonical(entries: Iterable[tuple[int, T]]) -> list[tuple[int, T]]:
    """Ascending by offset, the last entry given for an offset wins."""
    last: dict[int, T] = {}
    for offset, value in entries:
        last[offset] = value
    return sorted(last.items())


def encode(marker: Marker) -> bytes:
    """The wire form of ``marker``."""
    if isinstance(marker, StartBatch):
        first = min(marker.offsets) if marker.offsets else 0
        members = set(marker.offsets)
        out = bytearray(b"\x02\x01")
        out += _string(marker.topic) + struct.pack(">iI", marker.partition, marker.timeout_ms)
        out += _offsets(marker.offsets)
        for entries in (marker.attempts, marker.timeouts):
            listed = [(o, v) for o, v in _canonical(entries) if o in members]
            out += varint(len(listed))
            at = first
            for offset, value in listed:
                out += varint(offset - at) + varint(value)
                at = offset
        return bytes(out)
    if isinstance(marker, Settle):
        out = bytearray(b"\x02\x02")
        out += _string(marker.topic) + struct.pack(">i", marker.partition)
        keep = _canonical(marker.keep_alives)
        out += _offsets([o for o, _ in keep])
        for _, timeout in keep:
            out += varint(timeout)
        nacks = _canonical(marker.nacks)
        out += _offsets([o for o, _ in nacks])
        for _, delay in nacks:
            out += varint(delay)
        rejects = _canonical(marker.rejects)
        out += _offsets([o for o, _ in rejects])
        for _, reason in rejects:
            out += _string(reason, MAX_REASON_BYTES)
        out += _offsets(list(marker.ends))
        return bytes(out)
    if isinstance(marker, Tick):
        return b"\x01\x10" + struct.pack(">Q", marker.nonce)
    head = bytes([VERSION_1, _V1_TYPES[type(marker)]])
    if isinstance(marker, Start):
        return head + _source(marker.source) + struct.pack(">II", marker.timeout_ms, marker.attempt)
    if isinstance(marker, KeepAlive):
        return head + _source(marker.source) + struct.pack(">I", marker.timeout_ms)
    if isinstance(marker, End):
        return head + _source(marker.source)
    if isinstance(marker, Nack):
        return head + _source(marker.source) + struct.pack(">Q", marker.delay_ms)
    if isinstance(marker, Reject):
        return head + _source(marker.source) + _string(marker.reason, MAX_REASON_BYTES)
    r = marker.record
    out = bytearray(head + struct.pack(">qQ", marker.not_before_ms, marker.delay_ms))
    out += _string(r.topic) + struct.pack(">i", -1 if r.partition is None else r.partition)
    out += _bytes(r.key) + _bytes(r.value) + struct.pack(">H", len(r.headers))
    for name, header_value in r.headers:
        out += _string(name) + _bytes(header_value)
    return bytes(out)


# --- decoding -------------------------------------------------------------------------------


def _invalid(what: str, value: object) -> DecodeError:
    return DecodeError("invalid_value", f"field `{what}` has invalid value {value}")


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def take(self, n: int, what: str) -> bytes:
        if self.pos + n > len(self.data):
            raise DecodeError("truncated", f"marker truncated in field `{what}`")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def unpack(self, fmt: str, what: str) -> int:
        value: int = struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]
        return value

    def string(self, what: str) -> str:
        raw = self.take(self.unpack(">H", what), what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise DecodeError("invalid_utf8", f"field `{what}` is not valid UTF-8") from None

    def bytes_(self, what: str) -> bytes | None:
        n = self.unpack(">i", what)
        if n == -1:
            return None
        if n < 0:
            raise _invalid(what, n)
        return self.take(n, what)

    def source(self) -> Source:
        topic, partition = self.source_partition()
        offset = self.unpack(">q", "offset")
        if offset < 0:
            raise _invalid("offset", offset)
        return Source(topic, partition, offset)

    def source_partition(self) -> tuple[str, int]:
        topic = self.string("topic")
        if not topic:
            raise _invalid("topic", '""')
        partition = self.unpack(">i", "partition")
        if partition < 0:
            raise _invalid("partition", partition)
        return topic, partition

    def varint(self, what: str) -> int:
        value = 0
        for i in range(10):
            byte = self.take(1, what)[0]
            if i == 9 and byte > 1:
                raise _invalid(what, "varint beyond 64 bits")
            value |= (byte & 0x7F) << (7 * i)
            if byte & 0x80 == 0:
                if i > 0 and byte == 0:
                    raise _invalid(what, "varint not in its shortest form")
                return value
        raise _invalid(what, "varint longer than 10 bytes")

    def offsets(self, what: str, budget: list[int]) -> list[int]:
        count = self.varint(what)
        if count > budget[0]:
            raise _invalid(what, f"{count} runs")
        out: list[int] = []
        nxt = 0
        for i in range(count):
            skip = self.varint(what)
            if i > 0 and skip == 0:
                raise _invalid(what, "runs not separated")
            length = self.varint(what)
            if length == 0:
                raise _invalid(what, "empty run")
            if len(out) + length > budget[0]:
                raise _invalid(what, "more records than a marker may name")
            first = nxt + skip
            if first + length - 1 > (1 << 63) - 1:
                raise _invalid(what, "offset beyond i64")
            out.extend(range(first, first + length))
            nxt = first + length
        budget[0] -= len(out)
        return out

    def exceptions(self, what: str, batch: list[int], minimum: int) -> list[tuple[int, int]]:
        count = self.varint(what)
        if count > len(batch):
            raise _invalid(what, f"{count} entries")
        members = set(batch)
        out: list[tuple[int, int]] = []
        at = batch[0]
        for i in range(count):
            delta = self.varint(what)
            if i > 0 and delta == 0:
                raise _invalid(what, "entries not ascending")
            at += delta
            if at not in members:
                raise _invalid(what, "offset not in the batch")
            value = self.varint(what)
            if value < minimum or value > 0xFFFFFFFF:
                raise _invalid(what, value)
            out.append((at, value))
        return out


def _decode_v2(r: _Reader, kind: int) -> Marker:
    topic, partition = r.source_partition()
    budget = [MAX_BATCH_RECORDS]
    if kind == 0x01:
        timeout_ms = r.unpack(">I", "timeout_ms")
        offsets = r.offsets("offsets", budget)
        if not offsets:
            raise _invalid("offsets", "none")
        attempts = r.exceptions("attempts", offsets, 2)
        timeouts = r.exceptions("timeouts", offsets, 0)
        return StartBatch(topic, partition, timeout_ms, offsets, attempts, timeouts)
    settle = Settle(topic, partition)
    for o in r.offsets("keep_alives", budget):
        timeout = r.varint("keep_alive_timeout_ms")
        if timeout > 0xFFFFFFFF:
            raise _invalid("keep_alive_timeout_ms", timeout)
        settle.keep_alives.append((o, timeout))
    for o in r.offsets("nacks", budget):
        settle.nacks.append((o, r.varint("nack_delay_ms")))
    for o in r.offsets("rejects", budget):
        settle.rejects.append((o, r.string("reject_reason")))
    settle.ends = r.offsets("ends", budget)
    if not (settle.keep_alives or settle.nacks or settle.rejects or settle.ends):
        raise _invalid("settle", "no records")
    return settle


def _decode_v1(r: _Reader, kind: int) -> Marker:
    if kind == 0x01:
        source = r.source()
        timeout_ms = r.unpack(">I", "timeout_ms")
        attempt = r.unpack(">I", "attempt")
        if attempt == 0:
            raise _invalid("attempt", 0)
        return Start(source, timeout_ms, attempt)
    if kind == 0x02:
        return KeepAlive(r.source(), r.unpack(">I", "timeout_ms"))
    if kind == 0x03:
        return End(r.source())
    if kind == 0x04:
        return Nack(r.source(), r.unpack(">Q", "delay_ms"))
    if kind == 0x05:
        return Reject(r.source(), r.string("reason"))
    if kind == 0x10:
        return Tick(r.unpack(">Q", "nonce"))
    not_before = r.unpack(">q", "not_before_ms")
    if not_before < 0:
        raise _invalid("not_before_ms", not_before)
    delay_ms = r.unpack(">Q", "delay_ms")
    topic = r.string("target_topic")
    if not topic:
        raise _invalid("target_topic", '""')
    partition = r.unpack(">i", "target_partition")
    if partition < -1:
        raise _invalid("target_partition", partition)
    key = r.bytes_("key")
    value = r.bytes_("payload")
    headers: list[tuple[str, bytes | None]] = []
    for _ in range(r.unpack(">H", "header_count")):
        name = r.string("header_name")
        headers.append((name, r.bytes_("header_value")))
    record = ScheduledRecord(topic, None if partition == -1 else partition, key, value, headers)
    return Schedule(not_before, delay_ms, record)


def decode(data: bytes) -> Marker:
    """The marker in ``data``; raises :class:`DecodeError` for anything else."""
    if not data:
        raise DecodeError("empty", "empty marker")
    version = data[0]
    if version not in (VERSION_1, VERSION_2):
        raise DecodeError("unknown_version", f"unknown marker version {version}")
    r = _Reader(data)
    r.pos = 1
    kind = r.take(1, "type")[0]
    known = {0x01, 0x02} if version == VERSION_2 else {0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x10}
    if kind not in known:
        raise DecodeError("unknown_type", f"unknown marker type 0x{kind:02x}")
    marker = _decode_v2(r, kind) if version == VERSION_2 else _decode_v1(r, kind)
    if r.pos != len(data):
        raise DecodeError(
            "trailing_bytes", f"{len(data) - r.pos} unexpected bytes after the marker"
        )
    return marker


def fnv1a32(data: bytes) -> int:
    h = 0x811C9DC5
    for b in data:
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h


def markers_partition(topic: str, partition: int, partitions: int) -> int:
    """The markers partition every marker about ``topic``/``partition`` goes to."""
    h = fnv1a32(topic.encode("utf-8") + struct.pack(">i", partition))
    return h % partitions
