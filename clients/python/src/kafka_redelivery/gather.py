"""Settlements from many threads written together: one Settle marker per source partition.

A lone ``ack()`` waits until its End is durable. When several threads settle at once (a pool
of workers, each acking its own delivery), each writing and waiting for a marker of its own
costs a marker, a delivery report and a tracker update per record. Here they share: the first
thread to settle while nothing is being written writes at once, alone, so a single-threaded
consumer waits no longer than it would on its own; settlements that arrive while a write is on
its way gather, and when it is answered one of their threads writes all of them, one Settle
marker per source partition (version 2), and tells each thread whether its own settlement is
durable. So no settlement waits for a timer, and under load a marker carries as many
settlements as arrived during one round trip to the broker. (The Rust client gathers over a
fixed window on a thread of its own instead; a Python thread costs too much to keep one.)

Version 1 has no marker for many records: each settlement is its own marker then, still sent
together with the others gathered and waited for once.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from . import markers as m
from .writer import MarkerWriter, RedeliveryError, Write

#: Most bytes of reject reasons in one Settle before the next gathered reject starts another
#: marker: far below the 1 MB a markers topic accepts by default (as in the Rust client).
MAX_REASON_BYTES_PER_MARKER = 256 * 1024


@dataclass
class _Ticket:
    """One settlement waiting for its answer."""

    settle: m.Settle
    source: m.Source
    done: bool = False
    error: str | None = None


@dataclass
class _Gathered:
    """One marker being filled, and the settlements it answers."""

    marker: m.Settle
    tickets: list[_Ticket] = field(default_factory=list)
    records: int = 0
    reason_bytes: int = 0


def _size(s: m.Settle) -> tuple[int, int]:
    """Records and reject-reason bytes in ``s``."""
    records = len(s.keep_alives) + len(s.nacks) + len(s.rejects) + len(s.ends)
    return records, sum(len(reason.encode("utf-8")) for _, reason in s.rejects)


def as_v1(s: m.Settle, source: m.Source) -> m.Marker:
    """The version 1 marker of a one-record settlement of ``source``."""
    if s.ends:
        return m.End(source)
    if s.nacks:
        return m.Nack(source, s.nacks[0][1])
    if s.rejects:
        return m.Reject(source, s.rejects[0][1])
    return m.KeepAlive(source, s.keep_alives[0][1])


def merged(tickets: list[_Ticket]) -> list[_Gathered]:
    """Version 2 markers for ``tickets``: one Settle per source partition, a second one where
    the first would pass the records a tracker accepts in one or the reason bytes above."""
    markers: list[_Gathered] = []
    filling: dict[tuple[str, int], _Gathered] = {}
    for t in tickets:
        records, reason_bytes = _size(t.settle)
        key = (t.settle.topic, t.settle.partition)
        g = filling.get(key)
        if g is not None and (
            g.records + records > m.MAX_BATCH_RECORDS
            or g.reason_bytes + reason_bytes > MAX_REASON_BYTES_PER_MARKER
        ):
            g = None
        if g is None:
            g = _Gathered(m.Settle(*key))
            filling[key] = g
            markers.append(g)
        g.marker.keep_alives += t.settle.keep_alives
        g.marker.nacks += t.settle.nacks
        g.marker.rejects += t.settle.rejects
        g.marker.ends += t.settle.ends
        g.records += records
        g.reason_bytes += reason_bytes
        g.tickets.append(t)
    return markers


class SettleGatherer:
    """Writes settlements, gathering those of threads that settle while a write is on its way
    (see the module docs). ``settle`` returns once the settlement is durable."""

    def __init__(self, writer: MarkerWriter, marker_format: int) -> None:
        self._writer = writer
        self._format = marker_format
        self._cond = threading.Condition()
        self._pending: list[_Ticket] = []
        self._writing = False

    def settle(self, settle: m.Settle, source: m.Source) -> None:
        """Writes ``settle`` (one record's settlement of ``source``) with whatever else is
        gathered, and returns once its marker is durable; raises :class:`RedeliveryError`
        if it is not."""
        (error,) = self.settle_all([(settle, source)])
        if error is not None:
            raise RedeliveryError(f"settling {source} was not written: {error}")

    def settle_all(self, items: list[tuple[m.Settle, m.Source]]) -> list[str | None]:
        """Writes every one-record settlement in ``items`` with whatever else is gathered and
        returns once all are answered: for each, ``None`` if it is durable, else why not."""
        tickets = [_Ticket(settle, source) for settle, source in items]
        with self._cond:
            self._pending.extend(tickets)
            while not all(t.done for t in tickets):
                if self._writing:
                    self._cond.wait()
                    continue
                # Nobody is writing: this thread writes everything gathered, its own included.
                batch, self._pending = self._pending, []
                self._writing = True
                self._cond.release()
                try:
                    self._write(batch)
                finally:
                    self._cond.acquire()
                    for t in batch:
                        t.done = True
                    self._writing = False
                    self._cond.notify_all()
        return [t.error for t in tickets]

    def _write(self, batch: list[_Ticket]) -> None:
        """Sends the markers for ``batch``, waits for all of them, and gives each ticket its
        marker's answer. A failure is every affected ticket's error; interrupted (say by a
        ``KeyboardInterrupt``) before the answers came, every ticket says so."""
        for t in batch:
            t.error = "interrupted before the broker answered"
        sent: list[tuple[Write, list[_Ticket]]] = []
        try:
            if self._format == 1:
                for t in batch:
                    marker = as_v1(t.settle, t.source)
                    w = self._writer.send(marker, t.source.topic, t.source.partition)
                    sent.append((w, [t]))
            else:
                for g in merged(batch):
                    w = self._writer.send(g.marker, g.marker.topic, g.marker.partition)
                    sent.append((w, g.tickets))
        except Exception as e:  # every waiting thread must get an answer
            answered = {id(t) for _, ts in sent for t in ts}
            for t in batch:
                if id(t) not in answered:
                    t.error = f"could not be sent: {e}"
        self._writer.wait([w for w, _ in sent])
        for w, tickets in sent:
            for t in tickets:
                t.error = w.error
