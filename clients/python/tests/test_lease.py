"""Records held back for a rebalance (the lease module), kept alive through the real
keep-alive thread with a writer that only records."""

from __future__ import annotations

import time

import pytest
from confluent_kafka import KafkaError, KafkaException
from test_keepalive import keeper, kept_alive, wait_for

from kafka_redelivery import lease
from kafka_redelivery import markers as m
from kafka_redelivery.consumer import moved_by_rebalance
from kafka_redelivery.lease import Leases


def src(offset: int) -> m.Source:
    return m.Source("t", 0, offset)


def test_held_records_are_kept_alive_until_the_group_settles() -> None:
    w, keep = keeper()
    leases = Leases(keep)
    leases.hold([(src(1), 30), (src(2), 30)])
    wait_for("two rounds of KeepAlives", lambda: kept_alive(w, 1) >= 2 and kept_alive(w, 2) >= 2)
    leases.group_settled()
    assert len(leases) == 0
    time.sleep(0.05)  # a round already taken off the heap may still be written
    after = kept_alive(w, 1)
    time.sleep(0.1)  # ten timeouts' thirds
    assert kept_alive(w, 1) == after, "kept alive after the group settled"
    assert leases.count == 2


def test_a_record_handed_out_ends_its_own_lease_only() -> None:
    w, keep = keeper()
    leases = Leases(keep)
    leases.hold([(src(1), 30), (src(2), 30)])
    leases.handed_out([src(1), src(9)])
    assert len(leases) == 1
    wait_for("the other kept alive", lambda: kept_alive(w, 2) >= 2)
    assert kept_alive(w, 1) <= 1, "a record handed out was kept alive on"


def test_refused_again_a_record_keeps_its_first_lease() -> None:
    _, keep = keeper()
    leases = Leases(keep)
    leases.hold([(src(1), 30_000)])
    leases.hold([(src(1), 30_000), (src(2), 30_000)])
    assert len(leases) == 2
    assert leases.count == 2, "a record refused twice counted twice"


def test_a_lease_ends_at_the_limit_however_long_the_rebalance(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    w, keep = keeper()
    leases = Leases(keep)
    monkeypatch.setattr(lease, "LEASE_LIMIT_S", 0.1)
    leases.hold([(src(1), 30)])
    time.sleep(0.15)
    stopped = kept_alive(w, 1)
    time.sleep(0.1)
    assert kept_alive(w, 1) <= stopped + 1, "kept alive past the lease limit"
    leases.hold([])  # forgets ended leases
    assert len(leases) == 0


def test_only_the_errors_of_a_group_that_moved_on_hold_a_batch_back() -> None:
    for code in (
        KafkaError.ILLEGAL_GENERATION,
        KafkaError.UNKNOWN_MEMBER_ID,
        KafkaError.REBALANCE_IN_PROGRESS,
        KafkaError._ASSIGNMENT_LOST,
    ):
        assert moved_by_rebalance(KafkaException(KafkaError(code)))
    for code in (KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError._TIMED_OUT):
        assert not moved_by_rebalance(KafkaException(KafkaError(code)))
    assert not moved_by_rebalance(KafkaException("no error object"))
