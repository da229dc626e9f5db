"""The durable peers of ``aptix bench --peers``: the server-tool turn in DBOS Transact and in LangGraph.

Each peer is a script in ``benchmarks/`` (``peer_dbos.py``, ``peer_langgraph.py``) that runs the
same turn as the ``server-tool`` scenario (model call, ``get_current_time``, model call) against the
run's scripted model, durably, on a PostgreSQL database of its own, in one process. It runs in a
virtualenv of its own under the cache folder (``--peers-dir``), made with pinned requirements on
first use and made again when they change, so its dependencies never meet ours.

:func:`run_peer` drives a peer by the protocol of ``benchmarks/peer_turn.py``: it starts the
script, waits for ``ready`` (after the peer's warm-up), samples the CPU of the peer's process tree
and of PostgreSQL (its server processes and the peer database's backends), says go, and samples
again when the peer prints its ``result`` line, before the peer shuts down.
"""

from __future__ import annotations

import fcntl
import json
import subprocess
import sys
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from aptix_cli.bench.cpu import CpuMeter, Group, ProcessTable, descendants
from aptix_cli.launcher import ManagedProcess, ProcessGroup, wait_until

__all__ = ["CONCURRENCY", "PEERS", "Peer", "PeerResult", "peer_python", "repo_root", "run_peer"]

CONCURRENCY = 64
"""Turns a peer runs at once (its model calls keep one connection each)."""
_READY_SECONDS = 600.0
_RESULT_SECONDS = 3600.0
_END_SECONDS = 30.0


@dataclass(frozen=True, slots=True)
class Peer:
    """One durable peer: its script and what its virtualenv holds."""

    name: str
    """Its virtualenv's folder name under the cache folder, and its processes' log name."""
    title: str
    """How the report names it."""
    script: str
    """Its script, relative to the checkout."""
    requirements: tuple[str, ...]
    """What ``pip install`` puts in its virtualenv (exact versions, so runs compare)."""


PEERS = (
    Peer(
        "dbos",
        "DBOS Transact, 3 steps",
        "benchmarks/peer_dbos.py",
        ("dbos==3.4.0", "httpx==0.28.1"),
    ),
    Peer(
        "langgraph",
        "LangGraph + Postgres saver",
        "benchmarks/peer_langgraph.py",
        ("langgraph==1.2.22", "langgraph-checkpoint-postgres==3.2.0", "psycopg[binary]==3.3.9", "httpx==0.28.1"),
    ),
)
"""Every peer, in the order the bench runs them."""


@dataclass(frozen=True, slots=True)
class PeerResult:
    """A peer's measured run."""

    peer: Peer
    turns: int
    completed: int
    """Turns that ended with the model's text answer."""
    seconds: float
    """Wall time of the run, from the first turn started to the last ended (the peer's own clock)."""
    cpu_ms: dict[str, float | None]
    """CPU per turn, ms: ``peer`` (its process tree) and ``postgres`` (server processes and its backends)."""

    @property
    def rate(self) -> float:
        """Turns per second."""
        return self.completed / self.seconds if self.seconds > 0 else 0.0

    @property
    def all_completed(self) -> bool:
        """Whether every turn answered."""
        return self.completed == self.turns


def repo_root() -> Path:
    """The checkout ``aptix_cli`` runs from (``benchmarks/`` is beside it; the install is editable)."""
    return Path(__file__).resolve().parents[2]


def peer_python(peer: Peer, cache_dir: Path, *, progress: TextIO) -> Path:
    """The peer's virtualenv's interpreter, the virtualenv made (or made again) first if needed.

    A lock file makes two runs sharing the cache folder take turns. The requirements installed are
    kept in the virtualenv; when they differ from the peer's, it is made anew.

    Raises:
        RuntimeError: ``pip install`` failed (with its output).
    """
    venv = cache_dir / peer.name
    python = venv / "bin" / "python"
    stamp = venv / "aptix-peer-requirements.txt"
    wanted = "\n".join(peer.requirements) + "\n"
    cache_dir.mkdir(parents=True, exist_ok=True)
    with (cache_dir / f"{peer.name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if python.exists() and stamp.exists() and stamp.read_text() == wanted:
            return python
        progress.write(f"aptix bench: installing {peer.name} in {venv} ({', '.join(peer.requirements)})\n")
        progress.flush()
        stamp.unlink(missing_ok=True)
        _check([sys.executable, "-m", "venv", "--clear", str(venv)])
        _check([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *peer.requirements])
        stamp.write_text(wanted)
    return python


def run_peer(
    peer: Peer,
    python: Path,
    group: ProcessGroup,
    *,
    model_url: str,
    dsn: str,
    postgres: Callable[[ProcessTable], Collection[int]],
    turns: int,
    warm_up: int,
    directive: str,
) -> PeerResult:
    """Run ``turns`` server-tool turns in the peer and measure them.

    Args:
        peer: the peer.
        python: its virtualenv's interpreter (:func:`peer_python`).
        group: starts (and, on failure, stops) the peer's process.
        model_url: the scripted model's base URL.
        dsn: the peer's own PostgreSQL database (``postgresql://...``).
        postgres: PostgreSQL's processes to count with the peer (server processes and the peer's backends).
        turns: turns measured.
        warm_up: turns run first, not measured.
        directive: what the user text asks the scripted model for (the server-tool scenario's).

    Raises:
        RuntimeError: the peer exited early or did not answer in time (with its log).
    """
    argv = [
        str(python), str(repo_root() / peer.script), "--model-url", model_url, "--database-url", dsn,
        "--turns", str(turns), "--warm-up", str(warm_up), "--concurrency", str(CONCURRENCY), "--directive", directive,
    ]  # fmt: skip
    process = group.start(f"peer-{peer.name}", argv, stdin_pipe=True)
    try:
        meter = CpuMeter(
            [
                Group("peer", lambda table: descendants(table, [process.pid]), tree=True),
                Group("postgres", postgres, tree=True),
            ]
        )
        wait_until([process], lambda: _said(process, "ready") is not None, _READY_SECONDS)
        before = meter.sample()
        _tell(process, "go\n")
        wait_until([process], lambda: _said(process, "result ") is not None, _RESULT_SECONDS)
        after = meter.sample()
        said = _said(process, "result ")
        assert said is not None
        figures = json.loads(said)
        used = meter.used(before, after)
        _end(process)
    finally:
        group.stop([process])
    return PeerResult(
        peer=peer,
        turns=turns,
        completed=int(figures["completed"]),
        seconds=float(figures["seconds"]),
        cpu_ms={name: seconds * 1000 / turns for name, seconds in used.items()},
    )


def _said(process: ManagedProcess, prefix: str) -> str | None:
    """What follows ``prefix`` on the first line of the peer's output that starts with it (None: no such line)."""
    for line in process.log().splitlines():
        if line.startswith(prefix):
            return line.removeprefix(prefix)
    return None


def _tell(process: ManagedProcess, text: str) -> None:
    stdin = process.popen.stdin
    assert stdin is not None, "a peer is started with a stdin pipe"
    stdin.write(text.encode())
    stdin.flush()


def _end(process: ManagedProcess) -> None:
    """Close the peer's stdin, which tells it to shut down, and give it the time to (stopped after that)."""
    if process.popen.stdin is not None:
        process.popen.stdin.close()
    try:
        process.popen.wait(timeout=_END_SECONDS)
    except subprocess.TimeoutExpired:
        return


def _check(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(argv[:4])} ... failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}"
        )
