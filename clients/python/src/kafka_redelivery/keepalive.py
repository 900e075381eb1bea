"""Automatic keep-alive: a KeepAlive every third of a delivery's timeout until it is settled.

For handlers whose running time is not known in advance (a long job, a slow downstream), so
that a delivery is redelivered only if its process hangs or dies, not because the handler was
slower than the timeout. One thread per consumer keeps every such delivery alive, started with
the first: the KeepAlives that fall due together are written together (one Settle per source
partition, through the settlement gatherer), and a failed one is tried again at the next turn,
a third of the timeout later, well before the deadline it protects.

The thread holds deliveries only weakly, so a delivery let go of unsettled is still released
(``Delivery.__del__``); it stops keeping one alive once it is settled or let go of. It is a
daemon thread and goes on after ``close()``: a delivery still held can be settled until the
process ends, and keeping it alive meanwhile is what keeps it from being redelivered.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
import weakref
from typing import Protocol

from . import markers as m
from .gather import SettleGatherer

log = logging.getLogger("kafka_redelivery")

#: The shortest interval between two KeepAlives of one delivery.
MIN_EVERY_S = 0.01


class Kept(Protocol):
    """What the keeper needs of a delivery (or of a record held back, see the lease module)."""

    @property
    def settled(self) -> bool: ...

    timeout_ms: int

    @property
    def source(self) -> m.Source: ...


def every_s(kept: Kept) -> float:
    """How often ``kept`` gets a KeepAlive: a third of its timeout, so two may fail in a row."""
    return max(kept.timeout_ms / 3000.0, MIN_EVERY_S)


def _keep_alive(kept: Kept) -> m.Settle:
    """The KeepAlive of ``kept`` for another full timeout."""
    src = kept.source
    return m.Settle(src.topic, src.partition, keep_alives=[(src.offset, kept.timeout_ms)])


class KeepAlives:
    """The consumer's keep-alive thread and the deliveries it keeps alive (see the module)."""

    def __init__(self, gatherer: SettleGatherer) -> None:
        self._gatherer = gatherer
        self._cond = threading.Condition()
        # (due, sequence, delivery): the sequence orders equal due times without comparing
        # deliveries.
        self._due: list[tuple[float, int, weakref.ref[Kept]]] = []
        self._sequence = itertools.count()
        self._thread: threading.Thread | None = None

    def keep(self, kept: Kept) -> None:
        """Keeps ``kept`` alive from a third of its timeout from now until it is settled."""
        with self._cond:
            self._push(kept, time.monotonic() + every_s(kept))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="kafka-redelivery-keep-alive", daemon=True
                )
                self._thread.start()
            self._cond.notify()

    def _push(self, kept: Kept, due: float) -> None:
        heapq.heappush(self._due, (due, next(self._sequence), weakref.ref(kept)))

    def _run(self) -> None:
        while True:
            try:
                self._turn()
            except Exception:  # a bug here must not end keep-alives for good
                log.exception("keep-alive turn failed; going on")
                time.sleep(MIN_EVERY_S)

    def _turn(self) -> None:
        """Waits for the next KeepAlive to fall due, then writes every one due by then."""
        with self._cond:
            while True:
                now = time.monotonic()
                if self._due and self._due[0][0] <= now:
                    break
                self._cond.wait(self._due[0][0] - now if self._due else None)
            refs = []
            while self._due and self._due[0][0] <= now:
                refs.append(heapq.heappop(self._due)[2])
        live = [k for k in (r() for r in refs) if k is not None and not k.settled]
        if not live:
            return
        items = [(_keep_alive(k), k.source) for k in live]
        errors = self._gatherer.settle_all(items)
        for k, error in zip(live, errors, strict=True):
            if error is not None:
                log.warning("keep-alive of %s failed (%s); trying again", k.source, error)
        after = time.monotonic()
        with self._cond:
            for k in live:
                self._push(k, after + every_s(k))
