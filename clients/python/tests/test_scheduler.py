"""The scheduler's rules that need no broker: ids, the retention margin, what a Schedule
marker can carry, due times and what an End before us means."""

from __future__ import annotations

import pytest

from kafka_redelivery import CancelOutcome, ScheduleId, scheduled
from kafka_redelivery import markers as m
from kafka_redelivery.scheduler import due_at, ended_before_us, retention_margin_ms


def test_a_schedule_id_is_partition_at_offset_with_an_optional_topic() -> None:
    sid = ScheduleId.parse("3@42")
    assert (sid.partition, sid.offset) == (3, 42)
    assert str(sid) == "3@42"
    assert ScheduleId.parse("orders.markers/3@42") == sid
    for bad in ["3-42", "3@", "@4", "-1@4", "3@-4", "x@y", ""]:
        with pytest.raises(ValueError, match="not a schedule id"):
            ScheduleId.parse(bad)


def test_the_margin_is_a_tenth_of_retention_at_most_an_hour() -> None:
    assert retention_margin_ms(600_000) == 60_000
    assert retention_margin_ms(7 * 24 * 3_600_000) == 3_600_000


def test_records_a_schedule_marker_cannot_carry_are_refused() -> None:
    r = scheduled("orders", b"v", key=b"k", headers=[("h", b"1")], max_deliveries=3)
    assert r.headers == [("h", b"1"), ("kr-max-deliveries", b"3")]
    assert m.decode(m.encode(m.Schedule(0, 10, r))) == m.Schedule(0, 10, r)
    for topic, kwargs in [
        ("", {}),
        ("x" * 250, {}),
        ("orders", {"partition": -3}),
        ("orders", {"max_deliveries": 0}),
        ("orders", {"headers": [("n" * 65_536, None)]}),
    ]:
        with pytest.raises(ValueError):
            scheduled(topic, **kwargs)  # type: ignore[arg-type]


def test_a_schedule_is_due_after_its_delay_and_not_before_its_time() -> None:
    r = scheduled("t")
    assert due_at(m.Schedule(0, 500, r), 1_000) == 1_500
    assert due_at(m.Schedule(9_000, 0, r), 1_000) == 9_000
    assert due_at(m.End(m.Source("t", 0, 1)), 1_000) is None


def test_an_end_before_the_due_time_is_a_cancel_and_after_it_a_delivery() -> None:
    assert ended_before_us(999, 1_000) is CancelOutcome.ALREADY_CANCELLED
    assert ended_before_us(1_000, 1_000) is CancelOutcome.ALREADY_DELIVERED
