"""StepSlots on real threads: the bound, and who goes first when a slot frees (priority, then arrival)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from tests.support.waiting import wait_for
from workers.step_slots import StepSlots, green


def _waiters(slots: StepSlots, priorities: list[int], order: list[int]) -> list[threading.Thread]:
    """A thread per priority, started one after another (each waiting before the next starts)."""
    threads = []
    for index, priority in enumerate(priorities):

        def run(index: int = index, priority: int = priority) -> None:
            with slots.held(priority):
                order.append(index)

        thread = threading.Thread(target=run)
        thread.start()
        wait_for(lambda n=index + 1: len(slots._waiting) == n or None, what="the waiter to queue", seconds=5)
        threads.append(thread)
    return threads


def test_a_freed_slot_goes_to_the_lowest_priority_number_then_to_the_earliest_arrival() -> None:
    slots = StepSlots(1)
    order: list[int] = []
    with slots.held(3):  # a batch step holds the one slot
        threads = _waiters(slots, [3, 3, 0, 3, 0], order)
    for thread in threads:
        thread.join(5)
    assert order == [2, 4, 0, 1, 3]  # both interactive steps first, each priority in order of arrival


def test_no_more_than_the_slots_run_at_once() -> None:
    slots = StepSlots(2)
    running, most = 0, 0
    lock = threading.Lock()

    def step() -> None:
        nonlocal running, most
        with slots.held(3):
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.01)
            with lock:
                running -= 1

    threads = [threading.Thread(target=step) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert most == 2


def test_a_step_that_raises_gives_its_slot_back() -> None:
    slots = StepSlots(1)
    with pytest.raises(RuntimeError), slots.held(0):
        raise RuntimeError("the step failed")
    with slots.held(3):
        assert slots._free == 0
    assert slots._free == 1


def test_slots_need_at_least_one_and_a_plain_process_is_not_green() -> None:
    with pytest.raises(ValueError):
        StepSlots(0)
    assert green() is False


_UNDER_GEVENT = """
from gevent import monkey
monkey.patch_all()
import gevent
from workers.step_slots import StepSlots, green

slots, order = StepSlots(1), []

def step(name, priority):
    with slots.held(priority):
        order.append(name)
        gevent.sleep(0.001)  # a round trip: the hub runs the others meanwhile

first = gevent.spawn(step, "batch-0", 3)
gevent.sleep(0)
rest = [gevent.spawn(step, name, priority) for name, priority in
        [("batch-1", 3), ("batch-2", 3), ("interactive", 0), ("batch-3", 3)]]
gevent.joinall([first, *rest], timeout=5)
print(green(), order)
"""


def test_under_gevent_the_slots_are_cooperative_and_let_an_interactive_step_in_first() -> None:
    done = subprocess.run([sys.executable, "-c", _UNDER_GEVENT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True ['batch-0', 'interactive', 'batch-1', 'batch-2', 'batch-3']"
