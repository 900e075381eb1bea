"""The codec against docs/marker-vectors.json, the vectors the Rust tests check too."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from kafka_redelivery import markers as m

VECTORS: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[3] / "docs" / "marker-vectors.json").read_text()
)


def _hex(text: str) -> bytes:
    return bytes.fromhex(text.replace(" ", ""))


def _opt_hex(value: str | None) -> bytes | None:
    return None if value is None else bytes.fromhex(value)


def _marker(d: dict[str, Any]) -> m.Marker:
    kind = d["type"]
    if kind == "start_batch":
        return m.StartBatch(
            d["topic"],
            d["partition"],
            d["timeout_ms"],
            d["offsets"],
            [(o, a) for o, a in d["attempts"]],
            [(o, t) for o, t in d["timeouts"]],
        )
    if kind == "settle":
        return m.Settle(
            d["topic"],
            d["partition"],
            [(o, t) for o, t in d["keep_alives"]],
            [(o, t) for o, t in d["nacks"]],
            [(o, r) for o, r in d["rejects"]],
            d["ends"],
        )
    if kind == "tick":
        return m.Tick(d["nonce"])
    if kind == "schedule":
        r = d["record"]
        record = m.ScheduledRecord(
            r["topic"],
            r["partition"],
            _opt_hex(r["key"]),
            _opt_hex(r["value"]),
            [(name, _opt_hex(value)) for name, value in r["headers"]],
        )
        return m.Schedule(d["not_before_ms"], d["delay_ms"], record)
    source = m.Source(d["topic"], d["partition"], d["offset"])
    if kind == "start":
        return m.Start(source, d["timeout_ms"], d["attempt"])
    if kind == "keep_alive":
        return m.KeepAlive(source, d["timeout_ms"])
    if kind == "end":
        return m.End(source)
    if kind == "nack":
        return m.Nack(source, d["delay_ms"])
    if kind == "reject":
        return m.Reject(source, d["reason"])
    raise AssertionError(f"unknown type {kind}")


@pytest.mark.parametrize("vector", VECTORS["markers"], ids=lambda v: v["name"])
def test_encodes_and_decodes_every_documented_vector(vector: dict[str, Any]) -> None:
    marker = _marker(vector["marker"])
    assert m.encode(marker) == _hex(vector["hex"])
    assert m.decode(_hex(vector["hex"])) == marker


@pytest.mark.parametrize("vector", VECTORS["rejections"], ids=lambda v: v["name"])
def test_refuses_every_documented_bad_input_with_its_kind(vector: dict[str, Any]) -> None:
    with pytest.raises(m.DecodeError) as err:
        m.decode(_hex(vector["hex"]))
    assert err.value.kind == vector["kind"]
    assert err.value.kind in m.DECODE_ERROR_KINDS


@pytest.mark.parametrize("p", VECTORS["partitions"], ids=lambda p: f"{p['topic']}-{p['partition']}")
def test_picks_the_documented_markers_partition(p: dict[str, Any]) -> None:
    assert m.fnv1a32(p["topic"].encode() + p["partition"].to_bytes(4, "big")) == p["fnv1a"]
    assert (
        m.markers_partition(p["topic"], p["partition"], p["partitions"]) == p["markers_partition"]
    )


def test_empty_input_is_empty() -> None:
    with pytest.raises(m.DecodeError) as err:
        m.decode(b"")
    assert err.value.kind == "empty"


def test_batches_round_trip_through_the_wire() -> None:
    rng = random.Random(7)
    for _ in range(300):
        offsets = sorted(rng.sample(range(10_000), rng.randint(1, 60)))
        batch = m.StartBatch(
            "t",
            rng.randint(0, 99),
            rng.randint(0, 2**32 - 1),
            offsets,
            [(o, rng.randint(2, 8191)) for o in offsets if rng.random() < 0.2],
            [(o, rng.randint(0, 2**32 - 1)) for o in offsets if rng.random() < 0.2],
        )
        assert m.decode(m.encode(batch)) == batch
        settle = m.Settle(
            "t",
            1,
            [(o, rng.randint(0, 2**32 - 1)) for o in offsets if rng.random() < 0.2],
            [(o, rng.randint(0, 2**64 - 1)) for o in offsets if rng.random() < 0.2],
            [(o, "why é") for o in offsets if rng.random() < 0.1],
            [o for o in offsets if rng.random() < 0.5] or [offsets[0]],
        )
        assert m.decode(m.encode(settle)) == settle


def test_garbage_gives_typed_errors_only() -> None:
    rng = random.Random(11)
    for _ in range(5_000):
        data = bytes(rng.randint(0, 255) for _ in range(rng.randint(0, 40)))
        if rng.random() < 0.5 and data:
            data = bytes([rng.choice([1, 2])]) + data[1:]
        try:
            m.decode(data)
        except m.DecodeError as e:
            assert e.kind in m.DECODE_ERROR_KINDS
