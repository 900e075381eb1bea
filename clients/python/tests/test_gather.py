"""Settlements gathered across threads (the gather module), with a writer that only records."""

from __future__ import annotations

import threading
import time

import pytest

from kafka_redelivery import RedeliveryError
from kafka_redelivery import markers as m
from kafka_redelivery.gather import MAX_REASON_BYTES_PER_MARKER, SettleGatherer, merged
from kafka_redelivery.writer import Write


class FakeWriter:
    """Records what is sent; a write is answered when ``release`` is set (at once by default),
    with ``fail`` as its error."""

    def __init__(self) -> None:
        self.sent: list[tuple[m.Marker, str, int]] = []
        self.release = threading.Event()
        self.release.set()
        self.waiting = threading.Event()
        self.fail: str | None = None

    def send(self, marker: m.Marker, topic: str, partition: int) -> Write:
        self.sent.append((marker, topic, partition))
        return Write(threading.Event())

    def wait(self, writes: list[Write]) -> None:
        self.waiting.set()
        self.release.wait(10)
        for w in writes:
            w.error = self.fail
            w.done.set()


def end(topic: str, partition: int, offset: int) -> tuple[m.Settle, m.Source]:
    return m.Settle(topic, partition, ends=[offset]), m.Source(topic, partition, offset)


def gatherer(writer: FakeWriter, marker_format: int = 2) -> SettleGatherer:
    return SettleGatherer(writer, marker_format)  # type: ignore[arg-type]


def test_a_lone_settlement_is_written_at_once_and_alone() -> None:
    w = FakeWriter()
    g = gatherer(w)
    g.settle(*end("t", 0, 5))
    g.settle(*end("t", 0, 6))
    assert [s for s, _, _ in w.sent] == [
        m.Settle("t", 0, ends=[5]),
        m.Settle("t", 0, ends=[6]),
    ], "one thread after another: nothing to gather, no waiting for others"


def test_settlements_made_during_a_write_share_one_marker_per_partition() -> None:
    w = FakeWriter()
    w.release.clear()
    g = gatherer(w)
    first = threading.Thread(target=g.settle, args=end("t", 0, 0))
    first.start()
    assert w.waiting.wait(10), "the first settlement is written at once"
    later = [threading.Thread(target=g.settle, args=end("t", p % 2, 100 + p)) for p in range(20)]
    for t in later:
        t.start()
    # Every later thread has queued its settlement (the first write still holds them back).
    deadline = time.monotonic() + 10
    while len(g._pending) < 20:
        assert time.monotonic() < deadline, "the settling threads did not queue"
        time.sleep(0.01)
    w.release.set()
    for t in [first, *later]:
        t.join(10)
        assert not t.is_alive()
    markers = [s for s, _, _ in w.sent if isinstance(s, m.Settle)]
    assert len(markers) == len(w.sent) == 3
    assert markers[0] == m.Settle("t", 0, ends=[0])
    # Threads queue in whatever order they run; the encoder sorts each marker's offsets.
    assert sorted((s.partition, sorted(s.ends)) for s in markers[1:]) == [
        (0, [100 + p for p in range(0, 20, 2)]),
        (1, [100 + p for p in range(1, 20, 2)]),
    ]
    assert [p for _, _, p in w.sent] == [mk.partition for mk in markers]


def test_a_failed_write_is_every_gathered_settlements_error() -> None:
    w = FakeWriter()
    w.fail = "broker away"
    g = gatherer(w)
    with pytest.raises(RedeliveryError, match="broker away"):
        g.settle(*end("t", 3, 9))
    w.fail = None
    g.settle(*end("t", 3, 10))  # the gatherer is not left stuck by a failure


def test_a_send_that_raises_answers_its_threads_and_keeps_the_gatherer_usable() -> None:
    w = FakeWriter()
    g = gatherer(w)

    def refuse(marker: m.Marker, topic: str, partition: int) -> Write:
        raise ValueError("bad topic")

    w.send = refuse  # type: ignore[method-assign]
    with pytest.raises(RedeliveryError, match="could not be sent: bad topic"):
        g.settle(*end("t", 0, 1))
    del w.send
    g.settle(*end("t", 0, 2))
    assert len(w.sent) == 1


def test_version_1_writes_each_settlement_as_its_own_marker() -> None:
    w = FakeWriter()
    g = gatherer(w, marker_format=1)
    src = m.Source("t", 1, 4)
    g.settle(m.Settle("t", 1, nacks=[(4, 250)]), src)
    g.settle(m.Settle("t", 1, rejects=[(4, "bad")]), src)
    g.settle(m.Settle("t", 1, keep_alives=[(4, 1000)]), src)
    g.settle(m.Settle("t", 1, ends=[4]), src)
    assert [s for s, _, _ in w.sent] == [
        m.Nack(src, 250),
        m.Reject(src, "bad"),
        m.KeepAlive(src, 1000),
        m.End(src),
    ]


def test_merging_splits_a_partition_past_the_records_or_reason_bytes_one_marker_takes() -> None:
    from kafka_redelivery.gather import _Ticket

    many = [_Ticket(*end("t", 0, o)) for o in range(m.MAX_BATCH_RECORDS + 3)]
    assert [g.records for g in merged(many)] == [m.MAX_BATCH_RECORDS, 3]
    reason = "r" * (MAX_REASON_BYTES_PER_MARKER // 2)
    rejects = [
        _Ticket(m.Settle("t", 0, rejects=[(o, reason)]), m.Source("t", 0, o)) for o in range(3)
    ]
    out = merged(rejects)
    assert [len(g.marker.rejects) for g in out] == [2, 1]
    assert all(len(g.tickets) == len(g.marker.rejects) for g in out)
    kinds = merged(
        [
            _Ticket(m.Settle("t", 2, keep_alives=[(1, 500)]), m.Source("t", 2, 1)),
            _Ticket(m.Settle("t", 2, nacks=[(2, 0)]), m.Source("t", 2, 2)),
            _Ticket(m.Settle("t", 2, ends=[3]), m.Source("t", 2, 3)),
        ]
    )
    assert [g.marker for g in kinds] == [
        m.Settle("t", 2, keep_alives=[(1, 500)], nacks=[(2, 0)], ends=[3])
    ]
    assert m.decode(m.encode(kinds[0].marker)) == kinds[0].marker


def test_a_write_interrupted_before_the_answers_leaves_no_ticket_looking_durable() -> None:
    from kafka_redelivery.gather import _Ticket

    w = FakeWriter()

    def interrupted(writes: list[Write]) -> None:
        raise KeyboardInterrupt

    w.wait = interrupted  # type: ignore[method-assign]
    g = gatherer(w)
    batch = [_Ticket(*end("t", 0, 1)), _Ticket(*end("t", 1, 2))]
    with pytest.raises(KeyboardInterrupt):
        g._write(batch)
    assert all(t.error == "interrupted before the broker answered" for t in batch)
