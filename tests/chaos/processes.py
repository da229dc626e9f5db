"""Child processes of the chaos harness: each in its own session, logged to a file, killed by group.

Every process the harness starts is a :class:`ChildProcess`; the harness ends only those, by their
process group id (``os.killpg``), never by name.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from aptix_cli.stack import free_port

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


def http_ok(url: str) -> bool:
    """Whether ``GET url`` answers 200 within a second."""
    try:
        return httpx.get(url, timeout=1.0).status_code == 200
    except httpx.HTTPError:
        return False
