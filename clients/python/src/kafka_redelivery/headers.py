"""The ``kr-*`` headers: written by the tracker and by producers, so validated, not trusted.

Same bounds as the Rust client: a value that is not a positive decimal is ignored, one out of
range is clamped.
"""

from __future__ import annotations

import gc
from typing import Any

from .markers import Source
from .retry import MAX_ATTEMPT

Headers = list[tuple[str, bytes | None]]

MIN_TIMEOUT_MS = 1_000
MAX_TIMEOUT_MS = 7 * 24 * 3600 * 1000


def of_message(msg: Any) -> Headers:
    """A confluent-kafka message's headers, names as text.

    Raises (``SystemError``, in confluent-kafka 2.16) for a header name that is not UTF-8:
    confluent-kafka then leaves the name out of its list with the decoding error pending. If
    the garbage collector runs during the call (the list's allocations can start it) and a
    finalizer clears that error, the broken list is returned as if all were well and touching
    it crashes the process, which the end-to-end test saw. With the collector held off for
    the call, the error always surfaces as an exception the consumer handles."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        raw = msg.headers()
    finally:
        if enabled:
            gc.enable()
    return [(k if isinstance(k, str) else k.decode("utf-8", "replace"), v) for k, v in (raw or [])]


def value(headers: Headers, name: str) -> bytes | None:
    """The last value of header ``name``."""
    found: bytes | None = None
    for key, v in headers:
        if key == name:
            found = v
    return found


def ranged(headers: Headers, name: str, low: int, high: int) -> int | None:
    raw = value(headers, name)
    if raw is None:
        return None
    text = raw.decode("utf-8", "replace").strip()
    if not text.isdigit() or not text.isascii() or int(text) <= 0:
        return None
    return min(max(int(text), low), high)


def attempt(headers: Headers) -> int:
    return ranged(headers, "kr-attempt", 1, MAX_ATTEMPT) or 1


def timeout_ms(headers: Headers) -> int | None:
    return ranged(headers, "kr-timeout-ms", MIN_TIMEOUT_MS, MAX_TIMEOUT_MS)


def max_deliveries(headers: Headers) -> int | None:
    return ranged(headers, "kr-max-deliveries", 1, MAX_ATTEMPT)


def original(headers: Headers) -> Source | None:
    """The first delivery's coordinates, on a copy the tracker made."""
    topic = value(headers, "kr-original-topic")
    partition = value(headers, "kr-original-partition")
    offset = value(headers, "kr-original-offset")
    if topic is None or partition is None or offset is None:
        return None
    try:
        return Source(topic.decode("utf-8"), int(partition), int(offset))
    except ValueError:
        return None
