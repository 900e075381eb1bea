"""What the end-to-end tests share: the real broker, topics, and a Rust tracker process."""

from __future__ import annotations

import contextlib
import ctypes
import os
import subprocess
import tempfile
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.cimpl import NewTopic

ROOT = Path(__file__).resolve().parents[3]


def binary(name: str) -> Path:
    """A binary of the Rust workspace; `scripts/test` builds them before these tests run."""
    path = ROOT / "target" / "debug" / name
    assert path.exists(), f"{path} is not built: run `cargo build --all-features --examples` first"
    return path


@pytest.fixture(scope="session")
def brokers() -> str:
    """The broker's address: KAFKA_BOOTSTRAP, or the one `scripts/kafka start` starts."""
    addr = os.environ.get("KAFKA_BOOTSTRAP")
    if addr:
        return addr
    out = subprocess.run(
        [str(ROOT / "scripts" / "kafka"), "start"], check=True, capture_output=True, text=True
    )
    return out.stdout.strip().splitlines()[-1]


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


@dataclass
class Topics:
    source: str
    markers: str
    dlq: str
    brokers: str


@pytest.fixture
def topics(brokers: str) -> Iterator[Topics]:
    source = unique("py-src")
    markers = f"{source}.markers"
    admin = AdminClient({"bootstrap.servers": brokers})
    for f in admin.create_topics([NewTopic(source, num_partitions=4)]).values():
        f.result(timeout=30)
    subprocess.run(
        [str(binary("redelivery-tracker")), "topics", "create", "--brokers", brokers]
        + ["--markers-topic", markers, "--source-topic", source, "--partitions", "2"],
        check=True,
        capture_output=True,
    )
    yield Topics(source, markers, f"{source}.dlq", brokers)
    names = [source, markers, f"{source}.dlq", f"{markers}.snapshots"]
    for f in admin.delete_topics(names).values():
        with contextlib.suppress(Exception):  # cleanup only
            f.result(timeout=30)


class Tracker:
    """A `redelivery-tracker run` process, ready when constructed, killed when closed."""

    def __init__(self, t: Topics, max_deliveries: int = 3) -> None:
        self.dir = tempfile.TemporaryDirectory()
        address_file = Path(self.dir.name) / "admin"
        self.log = open(Path(self.dir.name) / "tracker.log", "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [str(binary("redelivery-tracker")), "run", "--brokers", t.brokers]
            + ["--markers-topic", t.markers, "--group-id", unique("tracker")]
            + ["--commit-interval", "200ms", "--max-deliveries", str(max_deliveries)]
            + ["--admin-listen", "127.0.0.1:0", "--admin-address-file", str(address_file)],
            stdout=subprocess.DEVNULL,
            stderr=self.log,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"the tracker exited:\n{self.log_text()}"
            if address_file.exists() and address_file.read_text().strip():
                url = f"http://{address_file.read_text().strip()}/readyz"
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            return
                except OSError:
                    pass
            time.sleep(0.2)
        raise AssertionError(f"the tracker did not become ready within 60 s:\n{self.log_text()}")

    def log_text(self) -> str:
        """The tracker's log so far: what a failed test shows to explain itself."""
        self.log.flush()
        return (Path(self.dir.name) / "tracker.log").read_text(errors="replace")[-20000:]

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        self.dir.cleanup()


@pytest.fixture
def tracker(topics: Topics) -> Iterator[Tracker]:
    t = Tracker(topics)
    yield t
    t.close()


def produce(
    t: Topics, keys: list[str], headers: list[tuple[str, str | bytes | None]] | None = None
) -> None:
    p = Producer({"bootstrap.servers": t.brokers, "enable.idempotence": True})
    for k in keys:
        p.produce(t.source, key=k.encode(), value=f"value of {k}".encode(), headers=headers)
    assert p.flush(30) == 0


def read_all(brokers: str, topic: str, n: int, wait_s: float = 30.0) -> list[object]:
    """Up to `n` records of `topic` from its start, waiting at most `wait_s`."""
    c = Consumer({"bootstrap.servers": brokers, "group.id": unique("reader")})
    md = c.list_topics(topic, timeout=10)
    parts = md.topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    out: list[object] = []
    deadline = time.monotonic() + wait_s
    while len(out) < n and time.monotonic() < deadline:
        msg = c.poll(0.2)
        if msg is not None and msg.error() is None:
            out.append(msg)
    c.close()
    return out


def produce_with_raw_header(t: Topics, key: bytes, name: bytes, value: bytes) -> None:
    """Produces one record to partition 0 of the source topic whose header name is the bytes
    ``name``, which need not be UTF-8 (the C, Go and Java clients write such names). Through
    librdkafka itself, with ctypes: confluent-kafka's produce() turns a bytes name into its
    repr."""
    import confluent_kafka

    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    lib = ctypes.CDLL(str(next(libs.glob("librdkafka*.so*"))))
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_conf_set.argtypes = [ctypes.c_void_p] + [ctypes.c_char_p] * 3 + [ctypes.c_size_t]
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_headers_new.restype = ctypes.c_void_p
    lib.rd_kafka_headers_new.argtypes = [ctypes.c_size_t]
    lib.rd_kafka_header_add.argtypes = [
        ctypes.c_void_p,
        ctypes.c_char_p,
        ctypes.c_ssize_t,
        ctypes.c_char_p,
        ctypes.c_ssize_t,
    ]
    lib.rd_kafka_flush.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_destroy.argtypes = [ctypes.c_void_p]
    err = ctypes.create_string_buffer(512)
    conf = lib.rd_kafka_conf_new()
    assert lib.rd_kafka_conf_set(conf, b"bootstrap.servers", t.brokers.encode(), err, 512) == 0
    rk = lib.rd_kafka_new(0, conf, err, 512)  # 0: a producer
    assert rk, err.value
    headers = lib.rd_kafka_headers_new(1)
    assert lib.rd_kafka_header_add(headers, name, len(name), value, len(value)) == 0
    # rd_kafka_producev's (type, value) pairs: TOPIC 1, PARTITION 3, VALUE 4, KEY 5,
    # HEADERS 10, MSGFLAGS 7 (2: copy the payload), END 0.
    c_int, c_ptr, c_size = ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t
    status = lib.rd_kafka_producev(
        ctypes.c_void_p(rk),
        c_int(1),
        c_ptr(t.source.encode()),
        c_int(3),
        ctypes.c_int32(0),
        c_int(4),
        c_ptr(key),
        c_size(len(key)),
        c_int(5),
        c_ptr(key),
        c_size(len(key)),
        c_int(10),
        ctypes.c_void_p(headers),
        c_int(7),
        c_int(2),
        c_int(0),
    )
    assert status == 0, status
    assert lib.rd_kafka_flush(rk, 10_000) == 0
    lib.rd_kafka_destroy(rk)
