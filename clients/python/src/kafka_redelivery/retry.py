"""What ``Delivery.nack()`` does without a delay: the same policy as the Rust client's."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: The most attempts the tracker counts (and the bound of ``kr-attempt``, ``kr-max-deliveries``).
MAX_ATTEMPT = 8191


@dataclass(frozen=True)
class RetryPolicy:
    """Delay after the n-th delivery: ``initial_s * multiplier ** (n - 1)``, at most ``max_s``,
    minus up to ``jitter`` of it at random (records nacked together do not all come back at
    once). ``max_deliveries``: most deliveries of one record, the first included; a nack of
    the last one rejects the record to the dead-letter topic. ``None`` leaves the limit to the
    tracker's ``--max-deliveries``."""

    initial_s: float = 1.0
    multiplier: float = 2.0
    max_s: float = 300.0
    jitter: float = 0.2
    max_deliveries: int | None = None

    @staticmethod
    def fixed(delay_s: float, max_deliveries: int | None = None) -> RetryPolicy:
        return RetryPolicy(delay_s, 1.0, delay_s, 0.0, max_deliveries)

    def delay_after(self, attempt: int, rng: random.Random | None = None) -> float:
        """Seconds to wait before the delivery after ``attempt``."""
        grown = self.initial_s * self.multiplier ** max(attempt - 1, 0)
        delay = min(grown, self.max_s)
        draw = (rng or random).random()
        return max(delay * (1.0 - self.jitter * draw), 0.0)

    def limit(self, per_message: int | None) -> int | None:
        """The delivery limit for a record whose ``kr-max-deliveries`` says ``per_message``."""
        limits = [x for x in (self.max_deliveries, per_message) if x is not None]
        return min(limits) if limits else None
