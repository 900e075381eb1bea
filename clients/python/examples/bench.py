"""The Python client's cost per record next to a plain confluent-kafka consumer.

    python examples/bench.py --brokers 127.0.0.1:39092 --records 50000

Each consumer runs alone on its own preloaded topic (100-byte records, 4 partitions): plain
(confluent-kafka, auto-commit), ours acking each polled batch with ``ack_many()``, ours acking
each record with ``ack()`` from one thread (each waits for its own marker), and ours acking
each record with ``ack()`` from a pool of ``--threads`` threads (their settlements gathered
into shared markers). Prints records/s, CPU seconds per million records of this process
(librdkafka's threads included) and, for ours, markers written per record (Starts included);
no tracker runs, since it is not on the consumer's path.
"""

from __future__ import annotations

import argparse
import resource
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

from kafka_redelivery import RedeliveryConsumer


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def topics(brokers: str, n: int, size: int) -> tuple[str, str]:
    name = f"pybench-{uuid.uuid4().hex[:8]}"
    markers = f"{name}.markers"
    admin = AdminClient({"bootstrap.servers": brokers})
    new = [
        NewTopic(name, num_partitions=4),
        NewTopic(markers, num_partitions=4, config={"message.timestamp.type": "LogAppendTime"}),
    ]
    for f in admin.create_topics(new).values():
        f.result(timeout=30)
    p = Producer({"bootstrap.servers": brokers, "linger.ms": 5})
    value = b"x" * size
    for i in range(n):
        while True:
            try:
                p.produce(name, key=str(i).encode(), value=value)
                break
            except BufferError:
                p.poll(0.05)
    p.flush(60)
    return name, markers


def drop(brokers: str, *names: str) -> None:
    """Deletes a run's topics, so that benchmark runs do not fill the broker's disk."""
    admin = AdminClient({"bootstrap.servers": brokers})
    for f in admin.delete_topics(list(names)).values():
        f.result(timeout=30)


def plain(brokers: str, topic: str, n: int) -> tuple[float, float]:
    c = Consumer({"bootstrap.servers": brokers, "group.id": topic, "auto.offset.reset": "earliest"})
    c.subscribe([topic])
    got = 0
    start = c0 = 0.0
    while got < n:
        batch = c.consume(num_messages=500, timeout=1.0)
        if batch and not start:
            start, c0 = time.monotonic(), cpu()
        got += sum(1 for m in batch if m.error() is None)
    took, used = time.monotonic() - start, cpu() - c0
    c.close()
    return n / took, used / n * 1e6


def markers_written(brokers: str, markers: str) -> int:
    """Records in the markers topic: every marker the run wrote."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": f"{markers}.count"})
    parts = c.list_topics(markers, timeout=10).topics[markers].partitions
    total = 0
    for p in parts:
        low, high = c.get_watermark_offsets(TopicPartition(markers, p), timeout=10)
        total += high - low
    c.close()
    return total


def ours(
    brokers: str, topic: str, markers: str, n: int, how: str, threads: int = 1
) -> tuple[float, float, float]:
    c = RedeliveryConsumer(brokers, topic, [topic], markers, max_unsettled=2000, max_batch=500)
    pool = ThreadPoolExecutor(threads)
    got = 0
    start = c0 = 0.0
    while got < n:
        batch = c.poll_batch(1.0)
        if batch and not start:
            start, c0 = time.monotonic(), cpu()
        if how == "many":
            c.ack_many(batch)
        elif how == "pool":
            list(pool.map(lambda d: d.ack(), batch))
        else:
            for d in batch:
                d.ack()
        got += len(batch)
    took, used = time.monotonic() - start, cpu() - c0
    pool.shutdown()
    c.close()
    return n / took, used / n * 1e6, markers_written(brokers, markers) / n


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--brokers", default="127.0.0.1:39092")
    p.add_argument("--records", type=int, default=50_000)
    p.add_argument("--size", type=int, default=100)
    p.add_argument("--threads", type=int, default=16)
    args = p.parse_args()
    n = args.records
    t, _ = topics(args.brokers, n, args.size)
    rate, per = plain(args.brokers, t, n)
    drop(args.brokers, t, f"{t}.markers")
    print(f"plain confluent-kafka    {rate:10.0f} records/s  {per:6.1f} CPU s per million")
    small = min(n, 2_000)
    runs = [
        ("ours, ack_many per batch", n, "many"),
        ("ours, ack() each", small, "each"),
        (f"ours, ack() on {args.threads} threads", min(n, 20_000), "pool"),
    ]
    for label, count, how in runs:
        t, m = topics(args.brokers, count, args.size)
        rate, per, markers = ours(args.brokers, t, m, count, how, args.threads)
        drop(args.brokers, t, m)
        print(
            f"{label:<24} {rate:10.0f} records/s  {per:6.1f} CPU s per million  "
            f"{markers:5.3f} markers per record"
        )


if __name__ == "__main__":
    main()
