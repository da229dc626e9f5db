"""A stop of ``aptix worker`` is bounded: each Celery process's StopDeadline (a fake clock, threads run
in place) and the group's end_children (real child processes, one that ignores SIGTERM)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
from collections.abc import Callable

import pytest

from aptix_cli.worker_group import end_children
from aptix_cli.worker_stop import COLD_STOP_SECONDS, EXIT_CODE, StopDeadline


class _Process:
    """A fake clock that sleeping advances, threads kept to be run by the test, and an exit to record."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.threads: list[Callable[[], None]] = []
        self.exits: list[tuple[float, int]] = []

    def sleep(self, seconds: float) -> None:
        assert seconds > 0
        self.now += seconds

    def deadline(self, stop_seconds: float) -> StopDeadline:
        return StopDeadline(
            stop_seconds, clock=lambda: self.now, sleep=self.sleep, start_thread=self.threads.append,
            end=lambda code: self.exits.append((self.now, code)),
        )  # fmt: skip

    def run_threads(self) -> None:
        while self.threads:
            self.threads.pop(0)()


def test_a_warm_shutdown_ends_the_process_stop_seconds_after_it_began() -> None:
    process = _Process()
    deadline = process.deadline(50.0)
    assert deadline.deadline is None and process.threads == []
    assert deadline.request("Warm") == 1050.0
    process.now += 10
    assert deadline.request("Warm") == 1050.0  # a second SIGTERM changes nothing
    assert len(process.threads) == 1  # one watch
    process.run_threads()
    ((ended_at, code),) = process.exits
    assert ended_at == pytest.approx(1050.0) and code == EXIT_CODE


def test_a_cold_shutdown_brings_the_end_forward_never_back() -> None:
    process = _Process()
    deadline = process.deadline(50.0)
    deadline.request("Warm")
    process.now += 10
    assert deadline.request("Cold") == 1010.0 + COLD_STOP_SECONDS
    process.now += COLD_STOP_SECONDS - 1
    assert deadline.request("Cold") == 1010.0 + COLD_STOP_SECONDS  # not pushed back by a later one
    process.run_threads()
    ((ended_at, code),) = process.exits
    assert ended_at == pytest.approx(1010.0 + COLD_STOP_SECONDS) and code == EXIT_CODE


def test_stop_seconds_shorter_than_the_cold_bound_holds_for_a_cold_shutdown_too() -> None:
    process = _Process()
    assert process.deadline(2.0).request("Cold") == 1002.0


def test_the_watch_logs_why_it_ends_the_process(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="aptix_cli.worker_stop")
    process = _Process()
    process.deadline(3.0).request("Warm")
    assert "have 3s to finish" in caplog.text and "APTIX_WORKER_STOP_SECONDS" in caplog.text
    process.run_threads()
    assert "still stopping 3.0s after it was told to" in caplog.text and "redelivered" in caplog.text


def _child(*, ignore_sigterm: bool) -> subprocess.Popen[bytes]:
    """A Python child in a session of its own that says "ready" once its SIGTERM disposition is set."""
    code = (
        "import signal, sys, time\n"
        f"signal.signal(signal.SIGTERM, signal.SIG_IGN if {ignore_sigterm} else signal.SIG_DFL)\n"
        "sys.stdout.write('ready\\n'); sys.stdout.flush(); time.sleep(600)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True)
    assert child.stdout is not None and child.stdout.readline() == b"ready\n"
    return child


def test_end_children_kills_a_child_that_ignores_the_stop_and_reaps_every_one() -> None:
    stubborn, polite = _child(ignore_sigterm=True), _child(ignore_sigterm=False)
    try:
        for child in (stubborn, polite):
            child.send_signal(signal.SIGTERM)
        end_children([stubborn, polite], within=0.5)
        assert (stubborn.returncode, polite.returncode) == (-signal.SIGKILL, -signal.SIGTERM)
    finally:
        for child in (stubborn, polite):
            if child.poll() is None:
                child.kill()
                child.wait()
            assert child.stdout is not None
            child.stdout.close()
