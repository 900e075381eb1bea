"""The Python client with the Rust tracker, on the real broker."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer
from conftest import (
    Topics,
    Tracker,
    binary,
    produce,
    produce_with_raw_header,
    read_all,
    unique,
)

import kafka_redelivery.consumer as consumer_module
import kafka_redelivery.markers as m
from kafka_redelivery import (
    BeyondRetentionError,
    CancelOutcome,
    Delivery,
    RedeliveryConsumer,
    ScheduleId,
    Scheduler,
    scheduled,
)

WORKER = Path(__file__).resolve().parents[1] / "examples" / "worker.py"


def consumer(t: Topics, group: str | None = None, timeout_s: float = 2.0) -> RedeliveryConsumer:
    return RedeliveryConsumer(
        t.brokers, group or unique("py-group"), [t.source], t.markers, timeout_s=timeout_s
    )


def take(c: RedeliveryConsumer, n: int, within_s: float = 60.0) -> list[Delivery]:
    out: list[Delivery] = []
    deadline = time.monotonic() + within_s
    while len(out) < n:
        assert time.monotonic() < deadline, f"only {len(out)} of {n} deliveries came"
        d = c.poll(0.5)
        if d is not None:
            out.append(d)
    return out


def key(d: Delivery) -> str:
    return (d.key or b"").decode()


def test_unsettled_records_come_back_from_the_rust_tracker(
    topics: Topics, tracker: Tracker
) -> None:
    keys = [f"u-{i}" for i in range(10)]
    produce(topics, keys)
    c = consumer(topics)
    first = take(c, 10)
    assert all(d.attempt == 1 for d in first)
    for d in first[:5]:
        d.ack()
    left = {key(d): d for d in first[5:]}
    for d in left.values():
        d.abandon()
    again = take(c, 5)
    assert {key(d) for d in again} == set(left)
    for d in again:
        assert d.attempt == 2
        original = left[key(d)].source
        assert d.original == original, "a copy names the first delivery"
        d.ack()
    assert c.poll(3.0) is None, "an acked record came back"
    c.close()


def test_deliveries_let_go_of_unsettled_are_released_at_once_and_free_their_places(
    topics: Topics, tracker: Tracker
) -> None:
    produce(topics, [f"g-{i}" for i in range(5)])
    c = RedeliveryConsumer(
        topics.brokers, unique("py-group"), [topics.source], topics.markers, max_unsettled=5
    )
    first = take(c, 5)
    keys = {key(d) for d in first}
    assert c.unsettled == 5
    del first  # let go of, none settled
    assert c.unsettled == 0, "their places under the bound are free"
    # Back long before their 30 s timeout: released by the next poll, redelivered at once.
    again = take(c, 5, within_s=20)
    assert {key(d) for d in again} == keys
    assert all(d.attempt == 2 for d in again)
    c.ack_many(again)
    c.close()


def test_deliveries_that_time_out_before_the_application_takes_them_are_not_handed_out(
    topics: Topics, tracker: Tracker
) -> None:
    # One key, so one partition: the five come in one batch, and after the first is taken the
    # other four wait in the consumer.
    p = Producer({"bootstrap.servers": topics.brokers, "enable.idempotence": True})
    for i in range(5):
        p.produce(topics.source, key=b"x", value=f"x-{i}".encode())
    assert p.flush(30) == 0
    c = RedeliveryConsumer(
        topics.brokers, unique("py-group"), [topics.source], topics.markers, timeout_s=1.0
    )
    first = take(c, 1)[0]
    first.ack()
    waiting = {m.Source(first.topic, first.partition, first.offset + i) for i in range(1, 5)}
    assert {d.source for d in c._ready} == waiting, "the batch came whole"
    time.sleep(1.5)
    copies = take(c, 4)
    assert all(d.attempt == 2 for d in copies), "an expired original was handed out"
    assert {d.original for d in copies} == waiting
    assert c.expired_before_handout == 4
    c.ack_many(copies)
    assert c.poll(2.0) is None
    c.close()


def test_deliveries_kept_alive_automatically_outlast_their_timeout(
    topics: Topics, tracker: Tracker
) -> None:
    produce(topics, [f"k-{i}" for i in range(3)])
    c = RedeliveryConsumer(
        topics.brokers,
        unique("py-group"),
        [topics.source],
        topics.markers,
        timeout_s=1.5,
        auto_keep_alive=True,
    )
    held = take(c, 3)
    # Three timeouts long, held and unsettled: kept alive, none comes back.
    assert c.poll(4.5) is None, "a delivery kept alive was redelivered"
    c.ack_many(held)
    assert c.poll(2.0) is None, "an acked record came back"
    c.close()


class RefusingCommits:
    """The consumer's Kafka consumer, with its commits refused as a rebalance refuses a
    member's whose generation the group moved past, while ``refusing`` is set."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.refusing = True
        self.refused = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def commit(self, *args: Any, **kwargs: Any) -> Any:
        if self.refusing:
            self.refused += 1
            raise KafkaException(KafkaError(KafkaError.ILLEGAL_GENERATION))
        return self._inner.commit(*args, **kwargs)


def refusing_commits(c: RedeliveryConsumer) -> RefusingCommits:
    refusing = RefusingCommits(c._consumer)
    c._consumer = refusing  # type: ignore[assignment]
    return refusing


def test_a_batch_whose_commit_a_rebalance_refuses_is_kept_alive_and_polled_again(
    topics: Topics, tracker: Tracker
) -> None:
    produce(topics, [f"k-{i}" for i in range(3)])
    c = consumer(topics, timeout_s=1.0)
    refusing = refusing_commits(c)
    deadline = time.monotonic() + 30
    while refusing.refused == 0:
        assert time.monotonic() < deadline, "nothing was polled"
        assert c.poll(0.2) is None, "a batch whose commit was refused was handed out"
    # Not polling for three timeouts, as while a rebalance waits for a member that is stuck:
    # without the lease the tracker would redeliver the batch meanwhile.
    time.sleep(3.5)
    refusing.refusing = False
    got = take(c, 3)
    assert sorted(key(d) for d in got) == ["k-0", "k-1", "k-2"]
    assert all(d.attempt == 1 for d in got)
    assert c.held_through_rebalances >= 1
    c.ack_many(got)
    assert c.poll(3.0) is None, "a record held back for the rebalance was redelivered"
    c.close()


def test_commits_refused_past_the_grace_hand_the_batch_out_uncommitted(
    topics: Topics, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(consumer_module, "REFUSED_GRACE_S", 1.0)
    produce(topics, [f"k-{i}" for i in range(3)])
    c = consumer(topics)
    refusing = refusing_commits(c)
    started = time.monotonic()
    got = take(c, 3)
    assert time.monotonic() - started >= 1.0, "handed out before the grace was over"
    assert sorted(key(d) for d in got) == ["k-0", "k-1", "k-2"]
    assert refusing.refused >= 2, "the batch was not polled again while refused"
    c.ack_many(got)
    c.close()


def test_a_consumer_taking_over_inside_a_producer_batch_gets_the_rest_of_it(
    topics: Topics,
) -> None:
    # One producer batch of 40 on one partition; the first consumer takes 5 (its commit then
    # lies inside the batch) and leaves. Apache Kafka answers the second consumer's fetch at
    # that offset with the whole batch; Tansu answers with the next one, or nothing at the end
    # of the log, and without the resume check the 35 unstarted records were never delivered.
    p = Producer({"bootstrap.servers": topics.brokers, "linger.ms": 100})
    for i in range(40):
        p.produce(topics.source, key=f"b-{i}".encode(), value=b"v", partition=0)
    assert p.flush(30) == 0
    group = unique("py-group")
    first = RedeliveryConsumer(topics.brokers, group, [topics.source], topics.markers, max_batch=5)
    taken = take(first, 5)
    assert [d.offset for d in taken] == list(range(5))
    first.ack_many(taken)
    first.close()
    second = consumer(topics, group)
    rest = take(second, 35)
    assert [d.offset for d in rest] == list(range(5, 40)), "the rest of the batch, in order"
    second.ack_many(rest)
    assert second.poll(1.0) is None
    second.close()


def test_a_partition_paused_when_taken_away_is_fetched_when_it_comes_back(
    topics: Topics,
) -> None:
    # librdkafka keeps a paused partition paused after it is taken away, and resuming the
    # assignment does not reach it: before the fix, a partition revoked while back-pressure
    # paused fetching came back paused for good, and its records were never delivered.
    produce(topics, [f"p-{i}" for i in range(20)])
    group = unique("py-group")
    first = RedeliveryConsumer(
        topics.brokers, group, [topics.source], topics.markers, max_unsettled=2, max_batch=2
    )
    held = take(first, 2)
    assert first.poll(0.5) is None, "a delivery past max_unsettled"  # and fetching pauses
    second = consumer(topics, group)
    got = None
    deadline = time.monotonic() + 60
    while got is None:
        assert time.monotonic() < deadline, "the second member never got a partition"
        got = second.poll(0.2)
        assert first.poll(0.05) is None, "a delivery past max_unsettled"
    got.ack()
    second.close()
    first.ack_many(held)
    produce(topics, [f"later-{i}" for i in range(20)])
    later: set[str] = set()
    deadline = time.monotonic() + 60
    while len(later) < 20 and time.monotonic() < deadline:
        d = first.poll(0.5)
        if d is not None:
            if key(d).startswith("later-"):
                later.add(key(d))
            d.ack()
    assert len(later) == 20, f"only {len(later)} of the 20 records produced later came"
    first.close()


def test_poll_batch_and_ack_many_settle_a_batch_with_one_marker_per_partition(
    topics: Topics, tracker: Tracker
) -> None:
    produce(topics, [f"b-{i}" for i in range(40)])
    c = consumer(topics)
    batch: list[Delivery] = []
    deadline = time.monotonic() + 60
    while len(batch) < 40:
        assert time.monotonic() < deadline, f"only {len(batch)} of 40 deliveries came"
        got = c.poll_batch(0.5)
        assert len(got) <= c.max_batch
        batch.extend(got)
    assert c.poll_batch(0.0) == [], "a batch hands out each delivery once"
    c.ack_many(batch)
    assert c.unsettled == 0
    assert c.poll(3.0) is None, "an acked record came back"
    c.close()


def test_acks_from_a_pool_of_threads_are_gathered_and_settle_every_record(
    topics: Topics, tracker: Tracker
) -> None:
    produce(topics, [f"p-{i}" for i in range(60)])
    c = consumer(topics)
    got = take(c, 60)
    errors: list[BaseException] = []

    def ack_all(part: list[Delivery]) -> None:
        try:
            for d in part:
                d.ack()
        except BaseException as e:  # reported by the assertion below
            errors.append(e)

    threads = [threading.Thread(target=ack_all, args=(got[i::6],)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    assert c.unsettled == 0
    assert c.poll(3.0) is None, "a record acked from a thread came back"
    c.close()


def test_a_python_reject_lands_in_the_dead_letter_topic(topics: Topics, tracker: Tracker) -> None:
    produce(topics, ["bad"])
    c = consumer(topics)
    (d,) = take(c, 1)
    d.reject("no such customer")
    (dead,) = read_all(topics.brokers, topics.dlq, 1)
    heads: dict[str, bytes] = {k: v for k, v in dead.headers()}  # type: ignore[attr-defined]
    assert heads["kr-dlq-reason"] == b"rejected"
    assert heads["kr-dlq-detail"] == b"no such customer"
    c.close()


def test_nack_without_a_delay_follows_the_policy_to_the_dead_letter_topic(
    topics: Topics, tracker: Tracker
) -> None:
    produce(topics, ["n"], headers=[("kr-max-deliveries", b"2")])
    c = consumer(topics)
    (d,) = take(c, 1)
    d.nack(0.0)
    (again,) = take(c, 1)
    assert again.attempt == 2
    again.nack()  # the record's limit is 2: this one goes to the dead-letter topic
    (dead,) = read_all(topics.brokers, topics.dlq, 1)
    heads: dict[str, bytes] = {k: v for k, v in dead.headers()}  # type: ignore[attr-defined]
    assert heads["kr-dlq-reason"] == b"rejected"
    assert b"retry policy allows 2" in heads["kr-dlq-detail"]
    c.close()


def lines(proc: subprocess.Popen[str], into: list[dict[str, Any]]) -> threading.Thread:
    def read() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            into.append(json.loads(raw))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    return t


def python_worker(t: Topics, group: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(WORKER), "--brokers", t.brokers, "--topic", t.source]
        + ["--markers-topic", t.markers, "--group", group, "--timeout", "3"]
        + ["-X", "session.timeout.ms=6000", *extra],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )


def test_a_python_worker_killed_with_sigkill_loses_nothing(
    topics: Topics, tracker: Tracker
) -> None:
    keys = [f"k-{i}" for i in range(40)]
    produce(topics, keys)
    group = unique("py-workers")
    seen: list[dict[str, Any]] = []
    worker = python_worker(topics, group, "--hold", "--log-received", "--max-unsettled", "20")
    lines(worker, seen)
    deadline = time.monotonic() + 60
    while len(seen) < 20:
        assert time.monotonic() < deadline, f"the worker received only {len(seen)}"
        time.sleep(0.1)
    worker.kill()
    worker.wait()
    held = {s["key"] for s in seen}
    c = consumer(topics, group)
    got: dict[str, list[int]] = {}
    deadline = time.monotonic() + 90
    while set(got) != set(keys):
        assert time.monotonic() < deadline, f"missing {sorted(set(keys) - set(got))[:10]}"
        d = c.poll(0.5)
        if d is not None:
            got.setdefault(key(d), []).append(d.attempt)
            d.ack()
    for k in held:
        assert max(got[k]) >= 2, f"{k} was held by the killed worker but came back as {got[k]}"
    c.close()


def test_a_rust_and_a_python_worker_share_one_group_and_one_tracker(
    topics: Topics, tracker: Tracker
) -> None:
    keys = [f"s-{i}" for i in range(300)]
    group = unique("mixed")
    py_lines: list[dict[str, Any]] = []
    rust_lines: list[dict[str, Any]] = []
    py = python_worker(topics, group, "--unsettled-rate", "0.1")
    rust = subprocess.Popen(
        [str(binary("examples/worker")), "--brokers", topics.brokers, "--topic", topics.source]
        + ["--markers-topic", topics.markers, "--group", group, "--timeout", "3s"]
        + ["--unsettled-rate", "0.1", "-X", "session.timeout.ms=6000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines(py, py_lines)
    lines(rust, rust_lines)
    time.sleep(3)  # both join the group before the records arrive
    produce(topics, keys)
    deadline = time.monotonic() + 120
    try:
        while True:
            acked = {s["key"] for s in py_lines + rust_lines if s["outcome"] == "ack"}
            if acked >= set(keys):
                break
            # Left unsettled three times in a row: dead-lettered by the tracker, not lost.
            missing = set(keys) - acked
            if len(missing) < 10:
                dead = read_all(topics.brokers, topics.dlq, len(missing), wait_s=1.0)
                dead_keys = {m.key().decode() for m in dead}  # type: ignore[attr-defined]
                if missing <= dead_keys:
                    break
            assert time.monotonic() < deadline, f"{len(acked)} of {len(keys)} acked"
            time.sleep(0.5)
        assert any(s["outcome"] == "ack" for s in py_lines), "the Python worker acked nothing"
        assert any(s["outcome"] == "ack" for s in rust_lines), "the Rust worker acked nothing"
    finally:
        py.kill()
        rust.kill()
        py.wait()
        rust.wait()


def test_python_schedules_are_delivered_by_the_rust_tracker_or_cancelled(
    topics: Topics, tracker: Tracker
) -> None:
    s = Scheduler(topics.brokers, topics.markers)
    soon = s.send_after(scheduled(topics.source, b"soon", key=b"s-1", partition=1), 0.5)
    later = s.send_at(scheduled(topics.source, b"later", key=b"s-2"), time.time() + 120)
    assert s.cancel(later) is CancelOutcome.CANCELLED
    assert s.cancel(later) is CancelOutcome.ALREADY_CANCELLED
    assert s.cancel(ScheduleId(0, 10**9)) is CancelOutcome.NOT_FOUND
    # (That the tracker never delivers a cancelled schedule is tests/schedule.rs's to show.)
    got = read_all(topics.brokers, topics.source, 1, wait_s=30)
    assert [(msg.key(), msg.value(), msg.partition()) for msg in got] == [  # type: ignore[attr-defined]
        (b"s-1", b"soon", 1)
    ], "delivered to the partition it names"
    header = dict(got[0].headers() or [])[  # type: ignore[attr-defined]
        "kr-schedule-id"
    ].decode()
    assert ScheduleId.parse(header) == soon
    assert s.cancel(soon) is CancelOutcome.ALREADY_DELIVERED
    horizon = s.horizon_s
    if horizon is not None:
        with pytest.raises(BeyondRetentionError):
            s.send_after(scheduled(topics.source, b"too late"), horizon + 3600)
    s.close()


def test_a_record_whose_header_name_is_not_utf8_goes_to_the_dead_letter_topic_not_stuck(
    topics: Topics, tracker: Tracker
) -> None:
    # confluent-kafka cannot hand such headers to Python (Message.headers() raises), so the
    # record cannot be delivered as written: it is started, then rejected with the reason,
    # and the tracker's dead-letter copy carries the header byte for byte.
    produce(topics, ["before"])
    produce_with_raw_header(topics, b"odd", b"\xff\xfekey", b"\x80\x00")
    produce(topics, ["after"])
    c = consumer(topics)
    got = take(c, 2, within_s=60)
    assert sorted(key(d) for d in got) == ["after", "before"]
    c.ack_many(got)
    dlq = read_all(topics.brokers, topics.dlq, 1, wait_s=30)
    assert [msg.key() for msg in dlq] == [b"odd"]  # type: ignore[attr-defined]
    assert c.poll(1.0) is None
    c.close()
