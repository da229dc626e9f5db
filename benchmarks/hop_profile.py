"""Where a durable turn's CPU goes in the workers: a sampled profile of `aptix bench`'s production shape.

Runs ``aptix bench --scenario server-tool`` (the gateway and two ``aptix worker`` with no flags on real
Redis and PostgreSQL), and once its warm-up is done attaches py-spy to every Celery worker process
(the ``pipeline,tools`` threads pool and the ``llm,webhooks`` gevent pool of each ``aptix worker``) until the
scenario's figures are printed. Each sample on a CPU is put in one cost class by its stack (rules
below, first match wins: the cross-cutting classes, then our modules from the innermost frame out,
then the libraries), and each class's share of a queue group's samples times the bench's CPU per
turn of that group is its milliseconds per turn. A second table splits the same samples by the
layer (step module) on the stack. Run from the repo root (root or ``ptrace`` rights for py-spy)::

    .venv/bin/python benchmarks/hop_profile.py                  # 2,000 turns, 100 samples/s
    .venv/bin/python benchmarks/hop_profile.py --turns 4000 --rate 200

Samples whose innermost frame waits (a lock, the event loop's poll, an idle pool thread, the gevent
hub) are not CPU and are left out. py-spy sees Python frames only: the time a C call spends (a
socket send, hiredis parsing, psycopg's libpq) counts for the Python frame that made the call.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

_FRAME = re.compile(r"^(?P<function>.*) \((?P<file>[^:]+):\d+\)$")
_WAITING = frozenset(
    ["Condition.wait", "Event.wait", "_epoll.poll", "poll.poll", "_worker", "_socket_can_read", "select", "wait"]
)
"""Innermost functions of a thread that waits rather than runs (an empty stack is the gevent hub's)."""

_CROSS_CUTTING = (
    ("logging/", "logging"),
    ("shared/logs", "logging"),
    ("prometheus_client/", "metrics hooks"),
    ("shared/metrics", "metrics hooks"),
    ("workers/metrics", "metrics hooks"),
    ("opentelemetry/", "telemetry"),
    ("shared/telemetry", "telemetry"),
    ("sqlalchemy/", "database transactions"),
    ("psycopg/", "database transactions"),
    ("psycopg_pool/", "database transactions"),
    ("httpx/", "model call HTTP"),
    ("httpcore/", "model call HTTP"),
    ("h11/", "model call HTTP"),
)
"""Classes that win wherever they are on the stack (a database call from the state store is the database's)."""
_OURS = (
    ("breaker", "breaker and limiter checks"),
    ("limiter", "breaker and limiter checks"),
    ("workers/trace", "trace and event records"),
    ("shared/events", "trace and event records"),
    ("turn_events", "trace and event records"),
    ("text_relay", "trace and event records"),
    ("shared/step_sender", "sending the next step (kombu, Redis)"),
    ("shared/broker_transport", "sending the next step (kombu, Redis)"),
    ("shared/state/", "state load and save (Redis, JSON)"),
    ("workers/leases", "state load and save (Redis, JSON)"),
    ("workers/liveness", "background threads (heartbeat, scheduler, reconciler)"),
    ("workers/scheduler", "background threads (heartbeat, scheduler, reconciler)"),
    ("workers/reconciler", "background threads (heartbeat, scheduler, reconciler)"),
    ("workers/llm", "model call (ours: request, parse)"),
    ("shared/llm", "model call (ours: request, parse)"),
    ("workers/", "step code (ours)"),
    ("shared/", "step code (ours)"),
)
"""Our modules, matched from the innermost frame out: the innermost of ours that matches names the class."""
_LIBRARIES = (
    ("celery/", "Celery's own (task receipt, trace, ack)"),
    ("kombu/", "Celery's own (task receipt, trace, ack)"),
    ("billiard/", "Celery's own (task receipt, trace, ack)"),
    ("redis/", "Celery's own (task receipt, trace, ack)"),
    ("pydantic", "step code (ours)"),
    ("gevent/", "gevent"),
)
_STEP = re.compile(r"workers/steps/(?P<step>\w+)\.py$")


def parse(path: Path) -> Iterator[tuple[list[tuple[str, str]], int]]:
    """Each stack of a py-spy ``--format raw`` file as (function, file) frames, outermost first, with its count."""
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames = []
        for text in stack.split(";"):
            match = _FRAME.match(text)
            frames.append((match["function"], match["file"]) if match else (text, ""))
        yield frames, int(count)


def cost_class(frames: list[tuple[str, str]]) -> str | None:
    """The cost class of one stack; None when it waits (or is the gevent hub's loop, which py-spy cannot
    tell waiting from running: its poll is C code)."""
    if not frames or frames[-1][0] in _WAITING:
        return None
    if all("gevent/" in file or not file for _, file in frames):
        return None
    files = [file for _, file in reversed(frames)]
    for rules in (_CROSS_CUTTING, _OURS, _LIBRARIES):
        for file in files:
            for fragment, name in rules:
                if fragment in file:
                    return name
    return "other"


def layer(frames: list[tuple[str, str]]) -> str:
    """The step module on the stack, innermost (the layer a sample was spent for), else "outside any step"."""
    for _, file in reversed(frames):
        match = _STEP.search(file)
        if match:
            return match["step"]
    return "outside any step (Celery, driver, background)"


def tally(paths: Iterable[Path]) -> tuple[collections.Counter[str], collections.Counter[str]]:
    """Samples per cost class and per layer over the files, waits left out."""
    classes: collections.Counter[str] = collections.Counter()
    layers: collections.Counter[str] = collections.Counter()
    for path in paths:
        for frames, count in parse(path):
            name = cost_class(frames)
            if name is not None:
                classes[name] += count
                layers[layer(frames)] += count
    return classes, layers


def _celery_workers(bench_pid: int) -> dict[str, list[int]]:
    """The Celery worker processes under the bench, by queue group (their ``--queues``, as the bench names them)."""
    groups: dict[str, list[int]] = collections.defaultdict(list)
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--heartbeat-name" in argv and _descends(int(entry.name), bench_pid):
            groups[argv[argv.index(b"--queues") + 1].decode()].append(int(entry.name))
    return groups


def _descends(pid: int, ancestor: int) -> bool:
    while pid > 1:
        if pid == ancestor:
            return True
        try:
            pid = int((Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            return False
    return False


_CPU_LINE = re.compile(r"^\s*CPU per turn, ms:\s*(?P<cells>.*)$")
_QUEUE_LINE = re.compile(r"^\s*workers by queue, ms:\s*(?P<cells>.*)$")
_CELL = re.compile(r"(?P<name>[\w,-]+) (?P<ms>\d+(?:\.\d+)?)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=100, help="py-spy samples per second")
    parser.add_argument("--keep", type=Path, default=None, help="keep py-spy's raw files in this directory")
    args = parser.parse_args()
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(py_spy).exists():
        sys.exit("py-spy is not installed: .venv/bin/pip install py-spy")
    out = args.keep or Path(tempfile.mkdtemp(prefix="aptix-hop-profile-"))
    out.mkdir(parents=True, exist_ok=True)
    aptix = str(Path(sys.executable).parent / "aptix")
    bench = subprocess.Popen(
        [aptix, "bench", "--scenario", "server-tool", "--turns", str(args.turns)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert bench.stdout is not None
    spies: list[tuple[str, subprocess.Popen[bytes], Path]] = []
    report: list[str] = []
    try:
        for line in bench.stdout:
            report.append(line)
            if "warm-up:" in line and not spies:
                for group, pids in _celery_workers(bench.pid).items():
                    for pid in pids:
                        raw = out / f"{group}-{pid}.txt"
                        argv = [py_spy, "record", "--pid", str(pid), "--format", "raw", "--nonblocking"]
                        argv += ["--rate", str(args.rate), "-o", str(raw)]
                        spies.append(
                            (group, subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL), raw)
                        )
            if spies and _QUEUE_LINE.match(line):
                break  # the scenario's figures are out: the bare chain runs next
        for _, spy, _ in spies:
            spy.send_signal(signal.SIGINT)
        for _, spy, _ in spies:
            spy.wait(timeout=60)
        for line in bench.stdout:
            report.append(line)
    finally:
        if bench.poll() is None:
            bench.send_signal(signal.SIGINT)
        bench.wait()
    sys.stdout.write("".join(line for line in report if "[" not in line[:2]))
    _print_tables(report, spies)
    if args.keep is None:
        shutil.rmtree(out, ignore_errors=True)


def _print_tables(report: list[str], spies: list[tuple[str, subprocess.Popen[bytes], Path]]) -> None:
    per_turn: dict[str, float] = {}
    for line in report:
        for pattern in (_CPU_LINE, _QUEUE_LINE):
            match = pattern.match(line)
            if match:
                for cell in _CELL.finditer(match["cells"]):
                    per_turn.setdefault(cell["name"], float(cell["ms"]))
    groups = sorted({group for group, _, _ in spies})
    print(f"\nprofile: py-spy over the measured run (process {os.getpid()}); CPU per turn by queue group: {per_turn}")
    tallies = {group: tally(raw for name, _, raw in spies if name == group and raw.exists()) for group in groups}
    for title, index in (("cost class", 0), ("layer", 1)):
        names = sorted({name for counts in tallies.values() for name in counts[index]})
        rows = []
        for name in names:
            cells, total_ms = [], 0.0
            for group in groups:
                counts = tallies[group][index]
                share = counts[name] / max(1, sum(counts.values()))
                ms = share * per_turn.get(group, 0.0)
                total_ms += ms
                cells.append(f"{share:6.1%} {ms:6.2f}")
            rows.append((total_ms, name, cells))
        print(f"\n| {title} | " + " | ".join(f"{g}: share, ms/turn" for g in groups) + " | ms/turn |")
        print("|---|" + "---|" * (len(groups) + 1))
        for total_ms, name, cells in sorted(rows, reverse=True):
            print(f"| {name} | " + " | ".join(cells) + f" | {total_ms:.2f} |")


if __name__ == "__main__":
    main()
