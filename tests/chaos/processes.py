"""Child processes of the chaos harness: each in its own session, logged to a file, killed by group.

Every process the harness starts is a :class:`ChildProcess`; the harness ends only those, by their
process group id (``os.killpg``), never by name.
"""

from __future__ import annotations

import functools
import os
import random
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

__all__ = ["ChildProcess", "StartupError", "free_port", "http_ok"]

REPO_ROOT = Path(__file__).resolve().parents[2]
"""The checkout: every child runs here, so ``tests.support.tools`` imports as an operator tool."""


class StartupError(RuntimeError):
    """A child process exited, or was not ready in time, while the harness waited for it."""


class ChildProcess:
    """One child process in a session of its own, its output appended to ``<log_dir>/<name>.log``."""

    def __init__(self, name: str, argv: list[str], *, env: dict[str, str], log_dir: Path) -> None:
        self.name = name
        """A name unique within the fault (the log file's stem)."""
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("ab")
        self.popen = subprocess.Popen(
            argv,
            env=env,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.started_at = time.monotonic()

    @property
    def pid(self) -> int:
        """The process id, also its process group id (it leads its own session)."""
        return self.popen.pid

    def alive(self) -> bool:
        """Whether the process still runs."""
        return self.popen.poll() is None

    def log_text(self) -> str:
        """Everything the process printed so far."""
        return self.log_path.read_text(errors="replace")

    def wait_ready(self, ready: Callable[[], bool], *, timeout: float) -> None:
        """Poll ``ready`` until it is true.

        Raises:
            StartupError: the process exited first, or ``timeout`` seconds passed.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.alive():
                raise StartupError(f"{self.name} exited with {self.popen.returncode}:\n{self._tail()}")
            if ready():
                return
            time.sleep(0.1)
        raise StartupError(f"{self.name} was not ready after {timeout:.0f} s:\n{self._tail()}")

    def kill(self) -> None:
        """SIGKILL the process group and reap the process; a process already gone is fine."""
        # Signal the group only while the leader is unreaped: its pid (the group id) cannot be reused yet.
        if self.popen.poll() is None:
            try:
                os.killpg(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.popen.wait(timeout=30)
        self._log.close()

    def _tail(self) -> str:
        return self.log_text()[-3000:]


def free_port() -> int:
    """A free TCP port below the kernel's ephemeral range, never handed out before in this process.

    A process restarted on its old port must find it free: a port from the ephemeral range could
    meanwhile be the local end of some outgoing connection, one below it cannot.
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


def http_ok(url: str) -> bool:
    """Whether ``GET url`` answers 200 within a second."""
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False


_HANDED_OUT: set[int] = set()
"""Ports :func:`free_port` returned (a restart reuses its port; no two processes may get the same)."""


@functools.cache
def _port_range() -> tuple[int, int]:
    try:
        ephemeral_low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral_low = 32768
    return 20000, max(ephemeral_low - 1, 20001)
