"""Keeping alive what was started but not handed out while a rebalance may move it.

A commit the group refuses because a rebalance is under way (``IllegalGeneration``,
``UnknownMemberId``, ``RebalanceInProgress`` and their kin) leaves a batch whose Starts are
durable in nobody's hands: the consumer does not hand it out, since the partition may go to
another worker that reads it again from the committed offset (handed out here too, each record
would be delivered twice), and polls it again instead. But a rebalance can outlast the delivery
timeout: the group waits for every member to rejoin, and a member that stopped polling holds it
up for as long as its ``max.poll.interval.ms``. The tracker would then redeliver the records
meanwhile, and their next owner would read them as well.

So the consumer keeps them alive, through the keep-alive thread, until the group has settled
(an assignment arrives, whatever it holds), or until it hands them out itself, and at most
:data:`LEASE_LIMIT_S`. The Rust client does the same (``src/client/lease.rs``).

A KeepAlive cannot lose a record: it only moves a deadline out, and the tracker ignores one for
a delivery already ended. That is why it is not an End: an End written after the next owner's
Start would end that owner's delivery, and a crash of that owner would then lose the record.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Protocol

from . import markers as m

#: The longest a record is kept alive for a rebalance: the longest a group waits for a member
#: by default (``max.poll.interval.ms``, 5 minutes). A group that has not settled by then has
#: lost its member for good, and the tracker is left to redeliver.
LEASE_LIMIT_S = 300.0


class Keeper(Protocol):
    """What the leases need of the keep-alive thread."""

    def keep(self, kept: Held) -> None: ...


class Held:
    """A record whose Start is durable but which was not handed out, kept alive while its
    lease lasts. ``settled`` is what tells the keep-alive thread to stop."""

    def __init__(self, source: m.Source, timeout_ms: int, now: float) -> None:
        self.source = source
        self.timeout_ms = timeout_ms
        self.ended = False
        self._until = now + LEASE_LIMIT_S

    @property
    def settled(self) -> bool:
        return self.ended or time.monotonic() >= self._until


class Leases:
    """The records held back for a rebalance, by source (see the module).

    Used from the polling thread only: the rebalance callbacks run inside its ``consume``. The
    keep-alive thread holds each :class:`Held` weakly, so this holds them until they end."""

    def __init__(self, keeper: Keeper) -> None:
        self._keeper = keeper
        self._held: dict[m.Source, Held] = {}
        #: Records ever held back for a rebalance.
        self.count = 0

    def __len__(self) -> int:
        return len(self._held)

    def hold(self, records: Iterable[tuple[m.Source, int]]) -> None:
        """Keeps ``(source, timeout_ms)`` alive until the group settles. A record already held
        keeps its lease (and its limit): polled again and refused again, it is still the same
        wait for the same rebalance."""
        now = time.monotonic()
        for source, ended in [(s, h) for s, h in self._held.items() if h.settled]:
            ended.ended = True
            del self._held[source]
        for source, timeout_ms in records:
            if source in self._held:
                continue
            held = Held(source, timeout_ms, now)
            self._held[source] = held
            self.count += 1
            self._keeper.keep(held)

    def handed_out(self, sources: Iterable[m.Source]) -> None:
        """The records at ``sources`` went to the application: their Deliveries take over."""
        if not self._held:
            return
        for source in sources:
            held = self._held.pop(source, None)
            if held is not None:
                held.ended = True

    def group_settled(self) -> None:
        """An assignment arrived: whoever owns the records now has read them, or will, and
        started them anew."""
        for held in self._held.values():
            held.ended = True
        self._held.clear()
