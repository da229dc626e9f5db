"""ProcessGate (issue 25): ordinary steps share a worker process; a suspect step runs alone in it, waits
for the steps running there, goes before the ordinary steps that arrive after it, and gives up waiting
after its timeout. With real threads, and with greenlets in a gevent-patched process."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable

from workers.process_gate import ProcessGate

_LONG = 30.0
"""A timeout no test reaches (a wait that hangs fails through pytest-timeout instead)."""


def _start(target: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread


def test_ordinary_steps_run_together() -> None:
    gate = ProcessGate()
    both_inside = threading.Barrier(2, timeout=_LONG)

    def ordinary() -> None:
        with gate.shared():
            both_inside.wait()  # broken (an exception) unless the other is inside at the same time

    threads = [_start(ordinary) for _ in range(2)]
    for thread in threads:
        thread.join(_LONG)
    assert not both_inside.broken


def test_a_suspect_waits_for_the_running_steps_and_goes_before_the_steps_that_arrive_after_it() -> None:
    gate = ProcessGate()
    order: list[str] = []
    release_running = threading.Event()
    running = threading.Event()

    def running_step() -> None:
        with gate.shared():
            running.set()
            release_running.wait(_LONG)
            order.append("running ends")

    def suspect() -> None:
        with gate.alone(timeout=_LONG) as alone:
            order.append(f"suspect alone={alone}")

    def late_step() -> None:
        with gate.shared():
            order.append("late step")

    # Given an ordinary step running
    threads = [_start(running_step)]
    running.wait(_LONG)
    # When a suspect comes, then another ordinary step
    threads.append(_start(suspect))
    _wait_until(lambda: gate._waiting == 1)
    threads.append(_start(late_step))
    release_running.set()
    for thread in threads:
        thread.join(_LONG)

    # Then the suspect ran alone once the running step ended, and the late step only after it
    assert order == ["running ends", "suspect alone=True", "late step"]


def test_a_suspect_that_waited_past_its_timeout_does_not_run_and_lets_the_ordinary_steps_go() -> None:
    gate = ProcessGate()
    with gate.shared():
        with gate.alone(timeout=0.05) as alone:
            assert alone is False
        entered = threading.Event()

        def late_step() -> None:
            with gate.shared():
                entered.set()

        _start(late_step).join(_LONG)
        assert entered.is_set()  # not held back by the suspect that gave up


def test_suspects_run_alone_one_at_a_time() -> None:
    gate = ProcessGate()
    inside = 0
    most = 0
    lock = threading.Lock()

    def suspect() -> None:
        nonlocal inside, most
        with gate.alone(timeout=_LONG) as alone:
            assert alone
            with lock:
                inside += 1
                most = max(most, inside)
            threading.Event().wait(0.01)
            with lock:
                inside -= 1

    threads = [_start(suspect) for _ in range(4)]
    for thread in threads:
        thread.join(_LONG)
    assert most == 1


def test_the_gate_works_between_greenlets_once_gevent_patched_the_process() -> None:
    # Given a process gevent patched before building the gate (as ``aptix worker --pool gevent`` does)
    script = """
from gevent import monkey; monkey.patch_all()
import gevent
from workers.process_gate import ProcessGate
gate, order = ProcessGate(), []
def running():
    with gate.shared():
        gevent.sleep(0.05)
        order.append('running ends')
def suspect():
    with gate.alone(timeout=30) as alone:
        order.append('suspect alone=%s' % alone)
def late():
    with gate.shared():
        order.append('late step')
first = gevent.spawn(running); gevent.sleep(0)
second = gevent.spawn(suspect); gevent.sleep(0)
third = gevent.spawn(late)
gevent.joinall([first, second, third], timeout=30)
print(order)
"""
    # When an ordinary greenlet runs, a suspect comes, then another ordinary one
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)

    # Then the greenlets wait for one another as threads do (a real lock would block the hub instead)
    assert done.stdout.strip() == "['running ends', 'suspect alone=True', 'late step']", done.stderr


def _wait_until(condition: Callable[[], bool]) -> None:
    pause = threading.Event()
    for _ in range(3000):
        if condition():
            return
        pause.wait(0.01)
    raise AssertionError("the condition never held")
