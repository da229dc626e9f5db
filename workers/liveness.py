"""Worker liveness: every Celery process of ``aptix worker`` keeps a heartbeat file, and ``aptix
worker-health`` reads them and says whether each process is alive and making progress.

A process is **hung** (docs/operations.md, "Worker health") when any of these holds:

- its heartbeat is older than ``APTIX_WORKER_HEARTBEAT_STALE_SECONDS``: the process is stopped
  (SIGSTOP, a frozen container) or every thread is blocked (under gevent: the hub is blocked);
- its event loop, which takes messages from the broker, has not run for that long while the
  process is connected to the broker (a worker reconnecting to a broker that is down is waiting,
  not hung: restarting it would not help, and would turn an outage into a crash loop);
- one task has run longer than ``APTIX_WORKER_TASK_STUCK_SECONDS`` (no step may take that long:
  a model call is bounded by ``APTIX_LLM_TIMEOUT_SECONDS``, a tool by its ``timeout_seconds``), so
  a pool slot is held for good and its turn's lease is renewed forever;
- every tool thread is held by a handler that overran its timeout: no server tool can run here.

A thread of the heartbeat's own writes the file every ``interval`` seconds (atomically); the event
loop stamps its progress through a timer entry (:meth:`Heartbeat.tick`, scheduled on the worker's
timer by ``workers.app``). Times are ``time.monotonic()``: the check runs on the same host, and a
wall-clock step cannot fake a hang. ``aptix worker`` writes ``workers.json`` in the directory first,
naming the processes it starts, so a process that never wrote a heartbeat is seen too.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

from shared.settings import Settings

__all__ = [
    "Heartbeat",
    "HeartbeatReport",
    "ProcessHealth",
    "RunningTask",
    "assess",
    "check_workers",
    "health_dir",
    "heartbeat_path",
    "limit_warnings",
    "prepare_health_dir",
]

logger = logging.getLogger(__name__)

_MANIFEST = "workers.json"


@dataclass(frozen=True, slots=True)
class RunningTask:
    """A task a worker process is running: its name, id and start (``time.time()``, as Celery keeps it)."""

    name: str
    task_id: str
    started_at: float


class HeartbeatReport(BaseModel):
    """What one heartbeat file says about its process."""

    name: str
    """The process's name within its ``aptix worker`` (``pipeline``, ``llm``, ``pipeline2`` ...)."""
    hostname: str
    """The Celery node name."""
    pid: int
    """The process id."""
    written_at: float
    """``time.monotonic()`` when the file was written."""
    loop_at: float
    """``time.monotonic()`` when the event loop last ran its heartbeat timer."""
    connected: bool
    """Whether the process is connected to the broker (its event loop runs only then)."""
    stopping: bool
    """The worker is shutting down (warm shutdown: finishing the tasks in hand)."""
    loop_runs_tasks: bool
    """The pool runs tasks on the event loop's own thread (``solo``): a running task stops the loop."""
    oldest_task: str | None
    """``name[id]`` of the task running longest, if any."""
    oldest_task_seconds: float
    """How long it has run."""
    tools_overrunning: int
    """Tool handlers that overran their timeout and still hold a tool thread."""
    tool_threads: int
    """The process's tool threads (``APTIX_TOOL_THREADS``)."""
    stale_seconds: float
    """The process's ``APTIX_WORKER_HEARTBEAT_STALE_SECONDS``."""
    task_stuck_seconds: float
    """The process's ``APTIX_WORKER_TASK_STUCK_SECONDS``."""


@dataclass(frozen=True, slots=True)
class ProcessHealth:
    """The verdict on one worker process."""

    name: str
    ok: bool
    message: str


def health_dir(settings: Settings) -> Path:
    """The folder of this host's heartbeats: ``APTIX_WORKER_HEALTH_DIR``, else ``<tmp>/aptix-worker-health``."""
    if settings.worker_health_dir:
        return Path(settings.worker_health_dir)
    return Path(tempfile.gettempdir()) / "aptix-worker-health"


def limit_warnings(settings: Settings) -> list[str]:
    """Messages for limits that would call a healthy worker hung (a model call may last its timeout)."""
    if settings.worker_task_stuck_seconds > settings.llm_timeout_seconds:
        return []
    return [
        f"APTIX_WORKER_TASK_STUCK_SECONDS ({settings.worker_task_stuck_seconds:g}) is not above "
        f"APTIX_LLM_TIMEOUT_SECONDS ({settings.llm_timeout_seconds:g}): a slow model call will fail "
        "`aptix worker-health`"
    ]


def heartbeat_path(directory: Path, name: str) -> Path:
    """The heartbeat file of the process ``name``."""
    return directory / f"{name}.heartbeat.json"


def prepare_health_dir(directory: Path, names: Sequence[str]) -> None:
    """Start afresh: remove old heartbeats and name the processes about to start (``workers.json``).

    A heartbeat left by an earlier run (a restarted container keeps its ``/tmp`` volume) must not
    stand for a process of this one.

    Raises:
        PermissionError: the folder belongs to another user (who could write heartbeats for us).
    """
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    if hasattr(os, "getuid") and directory.stat().st_uid != os.getuid():
        raise PermissionError(f"{directory} belongs to another user; set APTIX_WORKER_HEALTH_DIR to a folder of yours")
    for old in directory.glob("*.heartbeat.json"):
        old.unlink(missing_ok=True)
    _write_atomically(directory / _MANIFEST, json.dumps({"workers": list(names), "pid": os.getpid()}))


def check_workers(directory: Path, *, now: float | None = None) -> list[ProcessHealth]:
    """The health of every process ``workers.json`` in ``directory`` names.

    Args:
        directory: the heartbeat folder (:func:`health_dir`).
        now: ``time.monotonic()`` of the check; tests fix it.

    Returns:
        One verdict per process; a single failed verdict when no ``aptix worker`` wrote the folder.
    """
    now = time.monotonic() if now is None else now
    try:
        names = json.loads((directory / _MANIFEST).read_text())["workers"]
    except (OSError, ValueError, KeyError, TypeError):
        return [ProcessHealth("aptix worker", False, f"no aptix worker has started with its heartbeats in {directory}")]
    verdicts = []
    for name in names:
        try:
            report = HeartbeatReport.model_validate_json(heartbeat_path(directory, name).read_text())
        except FileNotFoundError:
            report = None
        except (OSError, ValidationError) as exc:
            verdicts.append(ProcessHealth(name, False, f"{name}: unreadable heartbeat ({type(exc).__name__})"))
            continue
        verdicts.append(assess(report, name=name, now=now))
    return verdicts


def assess(report: HeartbeatReport | None, *, name: str, now: float) -> ProcessHealth:
    """Whether the process behind ``report`` is alive and making progress (the module docstring's rules).

    Args:
        report: the process's last heartbeat; None when it wrote none yet.
        name: the process's name, for the message.
        now: ``time.monotonic()`` of the check.
    """
    if report is None:
        return ProcessHealth(name, False, f"{name}: no heartbeat yet (the process is starting or never started)")
    who = f"{name} ({report.hostname}, pid {report.pid})"
    silent = now - report.written_at
    if silent > report.stale_seconds:
        return ProcessHealth(
            name, False,
            f"{who}: no heartbeat for {silent:.0f}s (limit {report.stale_seconds:g}s): "
            "the process is stopped, or every thread is blocked",
        )  # fmt: skip
    if report.stopping:
        return ProcessHealth(name, True, f"{who}: shutting down, finishing the tasks in hand")
    if report.oldest_task and report.oldest_task_seconds > report.task_stuck_seconds:
        return ProcessHealth(
            name, False,
            f"{who}: task {report.oldest_task} has run {report.oldest_task_seconds:.0f}s "
            f"(limit {report.task_stuck_seconds:g}s, APTIX_WORKER_TASK_STUCK_SECONDS)",
        )  # fmt: skip
    if report.tool_threads and report.tools_overrunning >= report.tool_threads:
        return ProcessHealth(
            name, False,
            f"{who}: all {report.tool_threads} tool threads are held by handlers that overran their timeouts",
        )  # fmt: skip
    loop_idle = report.written_at - report.loop_at
    blocked_by_task = report.loop_runs_tasks and report.oldest_task is not None
    if report.connected and loop_idle > report.stale_seconds and not blocked_by_task:
        return ProcessHealth(
            name, False,
            f"{who}: its event loop has not run for {loop_idle:.0f}s (limit {report.stale_seconds:g}s) "
            "while connected to the broker",
        )  # fmt: skip
    if not report.connected:
        return ProcessHealth(name, True, f"{who}: alive, not connected to the broker (connecting or reconnecting)")
    running = f", oldest task {report.oldest_task_seconds:.1f}s" if report.oldest_task else ""
    return ProcessHealth(name, True, f"{who}: alive, event loop ran {max(loop_idle, 0.0):.1f}s ago{running}")


class Heartbeat:
    """Writes one worker process's heartbeat file from a thread of its own."""

    def __init__(
        self,
        path: Path,
        *,
        name: str,
        hostname: str,
        settings: Settings,
        running: Callable[[], list[RunningTask]],
        connected: Callable[[], bool],
        tools: Callable[[], tuple[int, int]],
        loop_runs_tasks: bool = False,
    ) -> None:
        """Prepare the heartbeat; nothing is written until :meth:`start`.

        Args:
            path: the file (:func:`heartbeat_path`).
            name: the process's name within its ``aptix worker``.
            hostname: the Celery node name.
            settings: the worker's settings (the two limits).
            running: the tasks the process runs now.
            connected: whether the process is connected to the broker.
            tools: (handlers overrunning their timeout, tool threads) of the process's tool executor.
            loop_runs_tasks: the pool runs tasks on the event loop's thread (``solo``).
        """
        self._path = path
        self._name = name
        self._hostname = hostname
        self._stale = settings.worker_heartbeat_stale_seconds
        self._stuck = settings.worker_task_stuck_seconds
        self._running = running
        self._connected = connected
        self._tools = tools
        self._loop_runs_tasks = loop_runs_tasks
        self._loop_at = time.monotonic()
        self._was_connected = False
        self._stopping = False
        self._failing = False
        self._thread: threading.Thread | None = None

    @property
    def interval(self) -> float:
        """Seconds between two writes (and two event-loop ticks): a third of the stale limit, at most 2 s."""
        return min(2.0, self._stale / 3)

    def tick(self) -> None:
        """The event loop ran: called from a timer entry of the loop."""
        self._loop_at = time.monotonic()

    def start(self) -> None:
        """Write the first heartbeat and start the writer thread."""
        self.write()
        self._thread = threading.Thread(target=self._run, name="aptix-heartbeat", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """The worker is shutting down: say so, and keep writing until the process ends."""
        self._stopping = True
        self.write()

    def report(self) -> HeartbeatReport:
        """The heartbeat as it would be written now."""
        now = time.monotonic()
        connected = self._connected()
        if connected and not self._was_connected:
            self._loop_at = max(self._loop_at, now)  # the loop restarts with the connection: time it from here
        self._was_connected = connected
        running = self._running()
        oldest = min(running, key=lambda task: task.started_at, default=None)
        overrunning, threads = self._tools()
        return HeartbeatReport(
            name=self._name,
            hostname=self._hostname,
            pid=os.getpid(),
            written_at=now,
            loop_at=self._loop_at,
            connected=connected,
            stopping=self._stopping,
            loop_runs_tasks=self._loop_runs_tasks,
            oldest_task=None if oldest is None else f"{oldest.name}[{oldest.task_id}]",
            oldest_task_seconds=0.0 if oldest is None else max(time.time() - oldest.started_at, 0.0),
            tools_overrunning=overrunning,
            tool_threads=threads,
            stale_seconds=self._stale,
            task_stuck_seconds=self._stuck,
        )

    def write(self) -> None:
        """Write the heartbeat file now (a failure is logged once, then retried at the next beat)."""
        try:
            _write_atomically(self._path, self.report().model_dump_json())
        except OSError as exc:
            if not self._failing:
                logger.error("cannot write the heartbeat %s: %s; aptix worker-health will fail", self._path, exc)
            self._failing = True
            return
        self._failing = False

    def _run(self) -> None:
        pause = threading.Event()  # never set: a pause that works the same under gevent
        while not pause.wait(self.interval):
            try:
                self.write()
            except Exception:  # the heartbeat must outlive any surprise (a report that fails to build)
                logger.exception("the heartbeat failed a round")


def _write_atomically(path: Path, text: str) -> None:
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    partial.write_text(text)
    os.replace(partial, path)
