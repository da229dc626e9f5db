"""Child processes: a free port, one logged child process, and a group of them sharing an environment.

The bench starts the system this way (``aptix_cli.bench.processes``), and so do the integration
tests (``tests.support.stack.LocalStack``) and the chaos harness (``tests.chaos``). Every child is
stopped by its own pid (or, started in a session of its own, by its process group id), never by
name.
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

__all__ = ["ManagedProcess", "ProcessGroup", "answers", "free_port", "wait_until"]


def free_port(host: str = "127.0.0.1") -> int:
    """A free TCP port below the kernel's ephemeral range, never handed out before in this process.

    A process restarted on its old port must find it free: a port from the ephemeral range could
    meanwhile be the local end of some outgoing connection, one below it cannot.

    Args:
        host: The address the port must be free on.

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
                sock.bind((host, port))
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
    """One child process with its log file (``<log_dir>/<name>.log``).

    Args:
        name: Unique among the processes sharing ``log_dir`` (the log file's stem).
        argv: The command.
        env: Its whole environment.
        log_dir: Where its log goes (stdout and stderr together).
        cwd: Its working directory (default: this process's).
        own_session: Start it in a session of its own with no stdin, so that :meth:`kill` ends
            the whole process group it leads (the chaos harness kills workers with their children).
        stdin_pipe: Give it a pipe as stdin (``popen.stdin``), for a process driven by lines.
    """

    def __init__(
        self,
        name: str,
        argv: list[str],
        env: dict[str, str],
        log_dir: Path,
        *,
        cwd: Path | None = None,
        own_session: bool = False,
        stdin_pipe: bool = False,
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._own_session = own_session
        self._log = self.log_path.open("wb")
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.PIPE if stdin_pipe else subprocess.DEVNULL if own_session else None,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=own_session,
        )
        self.started_at = time.monotonic()
        """When it was started (``time.monotonic()``)."""

    @property
    def pid(self) -> int:
        """The process id (with ``own_session``, also its process group id)."""
        return self.popen.pid

    def log(self) -> str:
        """Everything the process printed so far."""
        return self.log_path.read_text(errors="replace")

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (to the process group with ``own_session``) and wait for the process to end.

        A process already gone is fine.
        """
        # Signal only while the process is unreaped: its pid (and group id) cannot be reused yet.
        if self.alive():
            try:
                if self._own_session:
                    os.killpg(self.pid, sig)
                else:
                    os.kill(self.pid, sig)
            except ProcessLookupError:
                pass
        self.popen.wait(timeout=30)
        self._log.close()

    def stop(self, timeout: float = 15.0) -> None:
        """SIGTERM, then SIGKILL after ``timeout``."""
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout=10)
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        self._log.close()


class ProcessGroup:
    """Starts processes sharing one environment and log folder, and stops every one it started.

    Args:
        env: Settings every process gets on top of this process's environment.
        log_dir: Where the logs go (default: a new temporary folder).
    """

    def __init__(self, env: dict[str, str], *, log_dir: Path | None = None) -> None:
        self.env = {**os.environ, **env}
        self.log_dir = log_dir or Path(tempfile.mkdtemp(prefix="aptix-stack-"))
        self.processes: list[ManagedProcess] = []
        """The processes started and not stopped through the group, oldest first."""

    def start(
        self, name: str, argv: list[str], env: dict[str, str] | None = None, *, stdin_pipe: bool = False
    ) -> ManagedProcess:
        """Start ``argv`` as ``name``, with ``env`` overriding the group's environment for it only (and a
        pipe as its stdin with ``stdin_pipe``)."""
        process = ManagedProcess(name, argv, {**self.env, **(env or {})}, self.log_dir, stdin_pipe=stdin_pipe)
        self.processes.append(process)
        return process

    def start_gateway(
        self, *, port: int | None = None, timeout: float = 30.0, env: dict[str, str] | None = None
    ) -> tuple[ManagedProcess, str]:
        """Start ``aptix gateway`` and wait until ``/healthz`` answers. Returns the process and base URL.

        Args:
            port: Its port (default: :func:`free_port`).
            timeout: Seconds to wait for ``/healthz``.
            env: Overrides the group's environment for this process only.

        Raises:
            RuntimeError: it exited or did not answer in time (with its log).
        """
        port = port or free_port()
        argv = [sys.executable, "-m", "aptix_cli", "gateway", "--host", "127.0.0.1", "--port", str(port)]
        process = self.start(f"gateway-{port}", argv, env)
        url = f"http://127.0.0.1:{port}"
        wait_until([process], lambda: answers(f"{url}/healthz"), timeout)
        return process, url

    def stop(self, processes: Sequence[ManagedProcess], *, timeout: float = 15.0) -> None:
        """Stop some of the processes (SIGTERM, then SIGKILL after ``timeout``), each by its pid."""
        for process in processes:
            process.stop(timeout=timeout)
            if process in self.processes:
                self.processes.remove(process)

    def stop_all(self) -> None:
        """Stop every process this group started, newest first."""
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


def wait_until(processes: Sequence[ManagedProcess], ready: Callable[[], bool], timeout: float) -> None:
    """Return once ``ready()``.

    Raises:
        RuntimeError: one of ``processes`` exited first, or ``timeout`` seconds passed (with their logs).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in processes:
            if not process.alive():
                code = process.popen.returncode
                raise RuntimeError(f"{process.name} exited early (code {code}):\n{process.log()[-4000:]}")
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
