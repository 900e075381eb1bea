#!/usr/bin/env python3
"""Builds every test binary once, then runs several of them at a time.

`cargo test` runs its test binaries one after another. Ours spend most of their time waiting
on a broker, a timeout or a killed process, so running a few binaries side by side cuts the
wall time without changing what any test does. Each binary still runs its own tests in
parallel, exactly as `cargo test` would (same working directory, same arguments).

Output: one line when a binary starts and ends, then its full output once it has finished
(never interleaved), the doctests, a table of each binary's wall time (slowest first), and a
closing `tests: N passed, N failed, N skipped` line (skipped: `#[ignore]`d). Exit status 1 when any binary failed.

Usage: run-tests.py [CARGO_TEST_ARGS...] [-- TEST_ARGS...]
Environment: TEST_JOBS (binaries at once, default 4).
"""

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

# Wall time in seconds of the slow binaries as last measured. They start first so the run is
# not left waiting on one long binary at the end; unknown binaries count as quick.
EXPECTED_SECONDS = {
    "outage": 169,
    "faults": 149,
    "bench_suite": 137,
    "security": 95,
    "schedule": 66,
    "snapshot": 64,
    "crash": 60,
    "crash_points": 57,
    "settle": 32,
    "hostile": 29,
}

RESULT = re.compile(
    r"test result: (\w+)\. (\d+) passed; (\d+) failed; (\d+) ignored"
)


def build(cargo_args):
    """Compiles the test binaries; returns [(name, path)] in cargo's order."""
    cmd = ["cargo", "test", "--no-run", "--message-format=json-render-diagnostics"]
    proc = subprocess.run(cmd + cargo_args, stdout=subprocess.PIPE, check=False)
    if proc.returncode != 0:
        sys.exit(proc.returncode)
    binaries = []
    for line in proc.stdout.splitlines():
        msg = json.loads(line)
        if msg.get("reason") != "compiler-artifact" or not msg.get("executable"):
            continue
        if not msg["profile"]["test"]:
            continue
        target = msg["target"]
        name = target["name"]
        if "lib" in target["kind"]:
            # The crate's own unit tests are "lib"; a workspace member's, "lib <name>".
            name = "lib" if name == "kafka_redelivery" else f"lib {name}"
        elif "bin" in target["kind"]:
            name = "bin " + name
        binaries.append((name, msg["executable"]))
    return binaries


def main():
    args = sys.argv[1:]
    if "--" in args:
        split = args.index("--")
        cargo_args, test_args = args[:split], args[split + 1:]
    else:
        cargo_args, test_args = args, []
    jobs = int(os.environ.get("TEST_JOBS", "4"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    os.chdir(root)

    binaries = build(cargo_args)
    binaries.sort(key=lambda b: -EXPECTED_SECONDS.get(b[0], 0))
    lock = threading.Lock()
    outcomes = {}
    started = time.monotonic()

    def run(binary):
        name, path = binary
        with lock:
            print(f"test-run: start {name}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        proc = subprocess.run(
            [path] + test_args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
        took = time.monotonic() - t0
        out = proc.stdout.decode("utf-8", "replace")
        with lock:
            print(f"\n===== {name} ({path}) exit {proc.returncode}, {took:.1f} s", flush=True)
            sys.stdout.write(out)
            sys.stdout.flush()
        outcomes[name] = (proc.returncode, took, out)

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(run, binaries))

    # Doctests need rustdoc and are quick; cargo runs them itself, unless the caller picked
    # targets (`--test crash`), which cargo refuses to mix with `--doc`.
    selecting = {"--test", "--tests", "--lib", "--bin", "--bins", "--example", "--bench"}
    if not selecting.intersection(cargo_args):
        t0 = time.monotonic()
        doc = subprocess.run(
            ["cargo", "test", "--doc"] + cargo_args + ["--"] + test_args,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            check=False,
        )
        doc_out = doc.stdout.decode("utf-8", "replace")
        print("\n===== doctests", flush=True)
        sys.stdout.write(doc_out)
        outcomes["doctests"] = (doc.returncode, time.monotonic() - t0, doc_out)

    passed = failed = ignored = 0
    broken = []
    print("\ntest-run: wall time per binary (several run at once)")
    for name, (code, took, out) in sorted(outcomes.items(), key=lambda o: -o[1][1]):
        counts = [m.groups() for m in RESULT.finditer(out)]
        passed += sum(int(c[1]) for c in counts)
        failed += sum(int(c[2]) for c in counts)
        ignored += sum(int(c[3]) for c in counts)
        if code != 0:
            broken.append(name)
        print(f"  {took:7.1f} s  {name}{'  FAILED' if code != 0 else ''}")
    print(f"test-run: {time.monotonic() - started:.0f} s in all, {jobs} binaries at once")
    if broken and failed == 0:
        # A binary that died before its summary line still counts as a failure.
        failed = len(broken)
    print(f"tests: {passed} passed, {failed} failed, {ignored} skipped")
    sys.exit(1 if broken else 0)


if __name__ == "__main__":
    main()
