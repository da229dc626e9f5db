"""LocalStack: gateway and worker processes started as plain processes (the demo and the tests).

Everything ``docker compose up`` starts can also be started this way; each process is stopped by
its own PID.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx

__all__ = ["LocalStack", "ManagedProcess", "answers", "free_port", "wait_until"]


def free_port() -> int:
    """A free TCP port below the kernel's ephemeral range, never handed out before in this process.

    A process restarted on its old port must find it free: a port from the ephemeral range could
    meanwhile be the local end of some outgoing connection, one below it cannot.

    Raises:
        RuntimeError: no free port found in 1,000 tries.
    """
    low, high = _port_range()
    for _ in range(1000):
        port = random.randint(low, high)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    raise RuntimeError(f"no free TCP port between {low} and {high}")


_HANDED_OUT: set[int] = set()
"""Ports :func:`free_port` returned (a restart reuses its port; no two processes may get the same)."""


@functools.cache
def _port_range() -> tuple[int, int]:
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    return 20000, max(ephemeral_low - 1, 20001)


class ManagedProcess:
    """One child process with its log file."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(argv, env=env, stdout=self._log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        """The process id."""
        return self.popen.pid

    def log(self) -> str:
        """Everything the process printed so far."""
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` and wait for the process to end."""
        if self.alive():
            os.kill(self.pid, sig)
        self.popen.wait(timeout=30)

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        self._log.close()


class LocalStack:
    """Starts and stops Aptix processes sharing one environment."""

    def __init__(self, env: dict[str, str], *, log_dir: Path | None = None) -> None:
        self.env = {**os.environ, **env}
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="aptix-stack-"))
        self.processes: list[ManagedProcess] = []

    def start_worker(
        self,
        name: str,
        *,
        queues: str = "pipeline,llm,tools",
        pool: str | None = "threads",
        concurrency: int | None = 4,
        timeout: float = 60.0,
    ) -> ManagedProcess:
        """Start ``aptix worker`` as node ``name@<host>`` and wait until it is ready.

        With ``pool=None`` it gets no ``--pool`` (nor ``--concurrency``): one Celery worker per queue
        group, each on its own pool (``aptix_cli.worker_group``), named ``<group>.name@<host>``; it
        is ready when all of them are.
        """
        from aptix_cli.worker_group import plan

        argv = [sys.executable, "-m", "aptix_cli", "worker", "--queues", queues, "--hostname", f"{name}@%h"]
        if pool is not None:
            argv += ["--pool", pool, "--concurrency", str(concurrency or 1)]
        processes = 1 if pool is not None else len(plan(queues))
        process = self._start(name, argv)
        wait_until([process], lambda: process.log().count("ready.") >= processes, timeout)
        return process

    def start_gateway(
        self, *, port: int | None = None, timeout: float = 30.0, env: dict[str, str] | None = None
    ) -> tuple[ManagedProcess, str]:
        """Start ``aptix gateway`` and wait until ``/healthz`` answers. Returns the process and base URL.

        ``env`` overrides the stack's environment for this process only.
        """
        port = port or free_port()
        argv = [sys.executable, "-m", "aptix_cli", "gateway", "--host", "127.0.0.1", "--port", str(port)]
        process = self._start(f"gateway-{port}", argv, env)
        url = f"http://127.0.0.1:{port}"
        wait_until([process], lambda: answers(f"{url}/healthz"), timeout)
        return process, url

    def stop_all(self) -> None:
        """Stop every process this stack started."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()

    def _start(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> ManagedProcess:
        process = ManagedProcess(name, argv, {**self.env, **(env or {})}, self.log_dir)
        self.processes.append(process)
        return process


def wait_until(processes: Sequence[ManagedProcess], ready: Callable[[], bool], timeout: float) -> None:
    """Return once ``ready()``; raise with the processes' logs if one exits first or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            if not process.alive():
                raise RuntimeError(f"{process.name} exited early:\n{process.log()[-4000:]}")
        if ready():
            return
        time.sleep(0.1)
    if len(processes) == 1:
        raise RuntimeError(f"{processes[0].name} was not ready after {timeout:g}s:\n{processes[0].log()[-4000:]}")
    logs = "\n".join(f"--- {p.name}:\n{p.log()[-2000:]}" for p in processes)
    raise RuntimeError(f"not ready after {timeout:g}s:\n{logs}")


def answers(url: str) -> bool:
    """Whether ``url`` answers 200 within a second."""
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
