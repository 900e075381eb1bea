"""Writing markers to the markers partition of their source partition, and waiting for them."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from . import markers as m

#: How long a marker write may take before it counts as failed: librdkafka's own delivery
#: timeout (``delivery.timeout.ms``, 300 s by default) plus a margin.
WRITE_WAIT_S = 310.0


class RedeliveryError(Exception):
    """A marker could not be written, the markers topic is unusable, or the consumer stopped."""


@dataclass
class Write:
    """One marker on its way: ``done`` is set once the broker answered, ``error`` says why it
    failed (``None`` once it is durable), ``offset`` is where it landed."""

    done: threading.Event
    error: str | None = None
    offset: int | None = None


def durable_producer(config: dict[str, Any]) -> Producer:
    """A producer for markers: idempotent, acknowledged by all in-sync replicas, so that a
    marker it reports as delivered is durable. ``config`` (brokers, the user's settings) may
    change anything."""
    return Producer(
        {
            "enable.idempotence": True,
            "acks": "all",
            # Every write here is waited for at once (a batch's Starts, a settlement, a
            # schedule), so lingering only delays it: at 2 ms a lone ack() took 2.4 ms and a
            # poll batch's handout waited as long (BENCHMARKS.md). Writes from several threads
            # still share requests while one is in flight.
            "linger.ms": 0,
            "compression.type": "none",
            **config,
        }
    )


class MarkerWriter:
    """Writes markers to the markers partition of their source partition and waits for them."""

    def __init__(self, producer: Any, topic: str, partitions: int) -> None:
        self.producer = producer
        self.topic = topic
        self.partitions = partitions

    def send(self, marker: m.Marker, topic: str, partition: int) -> Write:
        """Sends ``marker`` to the markers partition of source ``topic``/``partition``."""
        target = m.markers_partition(topic, partition, self.partitions)
        return self.send_to(m.encode(marker), target)

    def send_to(self, payload: bytes, target: int) -> Write:
        """Sends ``payload`` to markers partition ``target``."""
        write = Write(threading.Event())

        def delivered(err: KafkaError | None, msg: Message | None) -> None:
            if err is not None:
                write.error = str(err)
            elif msg is not None:
                write.offset = msg.offset()
            write.done.set()

        while True:
            try:
                self.producer.produce(
                    self.topic, value=payload, partition=target, on_delivery=delivered
                )
                return write
            except BufferError:
                # librdkafka's queue is full: let it drain.
                self.producer.poll(0.01)

    def wait(self, writes: list[Write]) -> None:
        """Serves delivery reports until every write in ``writes`` has its answer."""
        deadline = time.monotonic() + WRITE_WAIT_S
        for w in writes:
            while not w.done.is_set():
                if time.monotonic() > deadline:
                    w.error = w.error or "no answer from the broker in time"
                    break
                self.producer.poll(0.005)
