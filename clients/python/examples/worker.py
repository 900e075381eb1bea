"""A worker on the Python client, with switches to misbehave on purpose.

    python examples/worker.py --brokers 127.0.0.1:39092 --topic orders \
        --markers-topic orders.markers --unsettled-rate 0.1 --reject-rate 0.01

One JSON line per delivery on stdout: ``{"key", "topic", "partition", "offset", "attempt",
"outcome"}`` with outcome ``received`` (with ``--log-received``), ``ack``, ``reject``,
``unsettled`` (left to time out) or ``held`` (``--hold``: kept unsettled, for kill tests).
"""

from __future__ import annotations

import argparse
import json
import random
import sys

from kafka_redelivery import Delivery, RedeliveryConsumer


def line(d: Delivery, outcome: str) -> None:
    key = (d.key or b"").decode("utf-8", "replace")
    fields = {"key": key, "topic": d.topic, "partition": d.partition, "offset": d.offset}
    print(json.dumps({**fields, "attempt": d.attempt, "outcome": outcome}), flush=True)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--brokers", default="localhost:9092")
    p.add_argument("--topic", required=True)
    p.add_argument("--markers-topic", required=True)
    p.add_argument("--group", default="python-worker")
    p.add_argument("--timeout", type=float, default=10.0, help="delivery timeout, seconds")
    p.add_argument("--max-unsettled", type=int, default=100)
    p.add_argument("--unsettled-rate", type=float, default=0.0)
    p.add_argument("--reject-rate", type=float, default=0.0)
    p.add_argument("--hold", action="store_true", help="settle nothing")
    p.add_argument("--log-received", action="store_true")
    p.add_argument("--marker-format", type=int, choices=(1, 2), default=2)
    p.add_argument(
        "-X",
        dest="config",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka setting (repeatable), e.g. session.timeout.ms=6000",
    )
    args = p.parse_args()
    config = dict(kv.split("=", 1) for kv in args.config)
    consumer = RedeliveryConsumer(
        args.brokers,
        args.group,
        [args.topic],
        args.markers_topic,
        timeout_s=args.timeout,
        max_unsettled=args.max_unsettled,
        marker_format=args.marker_format,
        config=config,
    )
    held = []
    try:
        for d in consumer:
            if args.log_received:
                line(d, "received")
            roll = random.random()
            if args.hold:
                held.append(d)
            elif roll < args.unsettled_rate:
                d.abandon()
                line(d, "unsettled")
            elif roll < args.unsettled_rate + args.reject_rate:
                d.reject("python worker: rejected on purpose")
                line(d, "reject")
            else:
                d.ack()
                line(d, "ack")
    except KeyboardInterrupt:
        pass
    finally:
        consumer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
