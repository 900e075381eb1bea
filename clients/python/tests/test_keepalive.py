"""Automatic keep-alive (the keepalive module), with a writer that only records."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass

from test_gather import FakeWriter

from kafka_redelivery import markers as m
from kafka_redelivery.gather import SettleGatherer
from kafka_redelivery.keepalive import KeepAlives


@dataclass(eq=False)
class Kept:
    topic: str
    partition: int
    offset: int
    timeout_ms: int = 30
    settled: bool = False

    @property
    def source(self) -> m.Source:
        return m.Source(self.topic, self.partition, self.offset)


def keeper() -> tuple[FakeWriter, KeepAlives]:
    w = FakeWriter()
    return w, KeepAlives(SettleGatherer(w, 2))  # type: ignore[arg-type]


def kept_alive(w: FakeWriter, offset: int) -> int:
    return sum(
        1
        for s, _, _ in w.sent
        if isinstance(s, m.Settle) and any(o == offset for o, _ in s.keep_alives)
    )


def wait_for(what: str, check: object, within_s: float = 10.0) -> None:
    deadline = time.monotonic() + within_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def test_a_delivery_is_kept_alive_until_it_is_settled() -> None:
    w, keep = keeper()
    k = Kept("t", 0, 7)
    keep.keep(k)
    wait_for("three keep-alives", lambda: kept_alive(w, 7) >= 3)
    settle = w.sent[0][0]
    assert settle == m.Settle("t", 0, keep_alives=[(7, 30)]), "each for a whole timeout"
    before = kept_alive(w, 7)
    k.settled = True
    time.sleep(0.15)  # fifteen intervals
    # A turn that took it just before it was settled may still write one.
    assert kept_alive(w, 7) <= before + 1, "kept alive after it was settled"


def test_a_delivery_let_go_of_is_not_held_and_no_longer_kept_alive() -> None:
    w, keep = keeper()
    k = Kept("t", 0, 8)
    keep.keep(k)
    wait_for("a keep-alive", lambda: kept_alive(w, 8) >= 1)
    before = kept_alive(w, 8)
    del k
    gc.collect()
    time.sleep(0.15)
    # A turn under way holds it until its write is answered, and no longer.
    assert kept_alive(w, 8) <= before + 1, "the keeper held on to a delivery let go of"


def test_keep_alives_due_together_are_one_marker_per_partition() -> None:
    w, keep = keeper()
    held = [Kept("t", p % 2, 100 + p) for p in range(6)]
    for k in held:
        keep._push(k, 0.0)  # all due: one turn, without the thread
    keep._turn()
    assert sorted((s for s, _, _ in w.sent), key=lambda s: getattr(s, "partition", -1)) == [
        m.Settle("t", 0, keep_alives=[(100, 30), (102, 30), (104, 30)]),
        m.Settle("t", 1, keep_alives=[(101, 30), (103, 30), (105, 30)]),
    ]
