"""Individual acknowledgement and timeout redelivery on plain Kafka: the Python client.

It speaks the marker format of the repository's docs/markers.md (version 2 by default) to the
same ``redelivery-tracker`` the Rust client uses.
"""

from .consumer import Delivery, RedeliveryConsumer
from .markers import DecodeError, Source
from .retry import RetryPolicy
from .scheduler import BeyondRetentionError, CancelOutcome, ScheduleId, Scheduler, scheduled
from .writer import RedeliveryError

__all__ = [
    "BeyondRetentionError",
    "CancelOutcome",
    "DecodeError",
    "Delivery",
    "RedeliveryConsumer",
    "RedeliveryError",
    "RetryPolicy",
    "ScheduleId",
    "Scheduler",
    "Source",
    "scheduled",
]
