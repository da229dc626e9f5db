"""Which Celery worker processes ``aptix worker`` runs: one per group of queues, each on its right pool.

The queues do different work. ``pipeline`` steps are short and CPU-bound, and ``tools`` steps
run server tools (each under its own timeout): together, one process with a threads pool of 2 (a
larger pool holds more batch steps ahead of an interactive turn's next one: under a batch, an
interactive turn's p95 was 16x its idle p95 with 8 threads, 18x with 4, 3x with 2, for 7 % less
throughput than 8). ``llm`` steps wait on the model: a gevent pool that keeps thousands of calls
in flight in one process; ``webhooks`` deliveries (POSTs to clients' endpoints) wait on the network
too and share that process. With no ``--pool``, ``aptix worker`` starts these two processes for the
queues it is asked for (a prefork pool holding one model call per child was the default that made
a new deployment 6x slower than it should be). Measured with ``aptix bench`` on 2 cores, two
``aptix worker``: a server-tool turn cost 54 ms of CPU with a prefork pipeline of one child per
core and a tools process apart, 54 ms with a threads process per core, and 37 ms with this plan:
on a busy host, every extra Celery process costs each task more than a process per core gains.
Scale across cores with more ``aptix worker`` processes (or ``--processes``). With ``--pool``, it
runs one worker for all the queues, as ``celery worker`` would.

:func:`plan` is pure; :func:`run_group` starts and watches the processes, and :func:`end_children`
ends them within a bound when they are told to stop (``aptix_cli.worker_stop``).
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from aptix_cli.worker_stop import KILL_MARGIN_SECONDS

__all__ = ["GROUPS", "Group", "WorkerSpec", "end_children", "node_name", "plan", "run_group"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """One Celery worker process: its name within the group, queues, pool and concurrency."""

    group: str
    queues: str
    pool: str
    concurrency: int


@dataclass(frozen=True, slots=True)
class Group:
    """Queues one Celery worker process serves when ``aptix worker`` is given no ``--pool``."""

    name: str
    queues: tuple[str, ...]
    pool: str
    concurrency: int


GROUPS: tuple[Group, ...] = (
    Group("pipeline", ("pipeline", "tools"), "threads", 2),
    Group("llm", ("llm", "webhooks"), "gevent", 2000),
)
"""The worker processes of ``aptix worker`` with no ``--pool``, for the queues it is asked for."""
DEFAULT_QUEUES = "pipeline,llm,tools,webhooks"
"""The queues of ``aptix worker`` with no ``--queues``: every queue."""


def plan(
    queues: str, pool: str | None = None, concurrency: int | None = None, processes: int | None = None
) -> list[WorkerSpec]:
    """The worker processes that serve ``queues``.

    Args:
        queues: comma-separated queue names.
        pool: the pool of one worker for all the queues; None runs each group of queues on its own.
        concurrency: the concurrency of each process; with no ``pool``, allowed only for one group.
        processes: processes of the ``pipeline`` group (default 1).

    Raises:
        ValueError: an unknown queue, no queue, ``concurrency`` for several groups, or fewer than
            one process.
    """
    names = list(dict.fromkeys(name.strip() for name in queues.split(",") if name.strip()))
    known = [queue for group in GROUPS for queue in group.queues]
    unknown = sorted(set(names) - set(known))
    if unknown or not names:
        raise ValueError(f"unknown queue(s) {', '.join(unknown) or '(none)'}; the queues are {', '.join(known)}")
    if processes is not None and processes < 1:
        raise ValueError("--processes must be at least 1")
    if pool is not None:
        return [WorkerSpec(group=names[0], queues=",".join(names), pool=pool, concurrency=concurrency or _cores())]
    chosen = [(group, [queue for queue in group.queues if queue in names]) for group in GROUPS]
    chosen = [(group, members) for group, members in chosen if members]
    if concurrency is not None and len(chosen) > 1:
        raise ValueError("--concurrency applies to one group of queues: give --pool too, or fewer --queues")
    specs = []
    for group, members in chosen:
        copies = (processes or 1) if group.name == "pipeline" else 1
        for index in range(copies):
            name = group.name if copies == 1 else f"{group.name}{index + 1}"
            specs.append(WorkerSpec(name, ",".join(members), group.pool, concurrency or group.concurrency))
    return specs


def node_name(spec: WorkerSpec, hostname: str | None, *, pid: int, grouped: bool) -> str:
    """The Celery node name of the worker process that runs ``spec``: distinct for every process on a host.

    Args:
        spec: the process's queues and group.
        hostname: ``aptix worker --hostname`` (Celery expands ``%h`` to the host's name), or None.
        pid: the process id of ``aptix worker``.
        grouped: whether it is one of several processes of one ``aptix worker``.

    Returns:
        Grouped: ``<group>.<hostname>``, by default ``<group>.<pid>@%h``. Alone: ``hostname`` as
        given, by default ``<group>.<pid>@%h``. Never Celery's own default ``celery@<host>``, which
        every worker on a host would share (Flower then warns ``DuplicateNodenameWarning`` and shows
        one of them).
    """
    if grouped:
        return f"{spec.group}.{hostname or f'{pid}@%h'}"
    return hostname or f"{spec.group}.{pid}@%h"


def run_group(
    specs: Sequence[WorkerSpec],
    *,
    hostname: str | None,
    loglevel: str,
    reconciler: bool,
    scheduler: bool = True,
    metrics_dir: Path | None = None,
    stop_seconds: float,
) -> int:
    """Run one ``aptix worker`` process per spec until one of them ends or this process is told to stop.

    Each child gets node name ``<group>.<name>`` (so two groups never share a Celery node name),
    writes its heartbeat as ``<group>`` (``aptix worker-health`` checks every child), and only the
    first runs a copy of the reconciler and of the admission scheduler. With ``metrics_dir``, each
    counts its metrics in that directory and serves none: this process serves their sum (``aptix_cli.metrics_export``).
    SIGTERM and SIGINT are passed on (Celery's warm shutdown; each child ends itself within
    ``stop_seconds``: ``aptix_cli.worker_stop``); a child that exits stops the others, so the
    orchestrator restarts the whole worker; a child still running ``stop_seconds`` plus
    ``KILL_MARGIN_SECONDS`` after the stop began is killed (SIGKILL, with its process group); and the
    children are sent SIGTERM if this process dies (Linux).

    Args:
        stop_seconds: ``APTIX_WORKER_STOP_SECONDS``.

    Returns:
        The exit code of the child that ended first (0 when stopped by a signal).
    """
    children: list[subprocess.Popen[bytes]] = []
    stopping = False

    def stop(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        for child in children:
            if child.poll() is None:
                child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for index, spec in enumerate(specs):
        name = node_name(spec, hostname, pid=os.getpid(), grouped=True)
        argv = [
            sys.executable, "-m", "aptix_cli", "worker", "--queues", spec.queues, "--pool", spec.pool,
            "--concurrency", str(spec.concurrency), "--hostname", name, "--loglevel", loglevel,
            "--heartbeat-name", spec.group,
        ]  # fmt: skip
        if index > 0 or not reconciler:
            argv.append("--no-reconciler")
        if index > 0 or not scheduler:
            argv.append("--no-scheduler")
        if metrics_dir is not None:
            argv += ["--metrics-dir", str(metrics_dir)]
        children.append(subprocess.Popen(argv, start_new_session=True, preexec_fn=_die_with_parent))
    started = zip(specs, children, strict=True)
    summary = "; ".join(f"{s.queues} on {s.pool} x{s.concurrency} (pid {c.pid})" for s, c in started)
    logger.info("aptix worker: %s", summary)
    code = 0
    while not stopping:
        ended = [child for child in children if child.poll() is not None]
        if ended:
            code = ended[0].returncode
            logger.warning("aptix worker: process %d exited (%s); stopping the others", ended[0].pid, code)
            stop(signal.SIGTERM, None)
            break
        time.sleep(0.5)
    end_children(children, within=stop_seconds + KILL_MARGIN_SECONDS)
    return code if code and code > 0 else 0


def end_children(children: Sequence[subprocess.Popen[bytes]], *, within: float) -> None:
    """Wait up to ``within`` seconds for ``children``, told to stop, to exit; then kill each that remains
    with its process group (SIGKILL; each leads a session of its own), and reap them all."""
    deadline = time.monotonic() + within
    while any(child.poll() is None for child in children) and time.monotonic() < deadline:
        time.sleep(0.1)
    for child in children:
        if child.poll() is None:  # still unreaped: its pid, and so its group id, cannot have been reused
            logger.warning("aptix worker: process %d still running %gs after the stop; killing it", child.pid, within)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.pid, signal.SIGKILL)
        child.wait()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _die_with_parent() -> None:
    """In the child, before exec: receive SIGTERM when the parent dies (Linux ``PR_SET_PDEATHSIG``)."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
