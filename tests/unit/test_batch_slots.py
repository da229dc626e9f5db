"""BatchSlots on real threads (what gevent's patched ``threading`` makes of greenlets): batch tasks past the slots
wait, in turn; an interactive task never does; a task waiting on the model gives its slot to another meanwhile."""

from __future__ import annotations

import threading
import time

import pytest

from shared.models.envelope import BATCH_PRIORITY, BATCH_START_PRIORITY, INTERACTIVE_PRIORITY
from workers.batch_slots import BatchSlots, green


def _in_thread(target: object) -> threading.Thread:
    thread = threading.Thread(target=target, daemon=True)  # type: ignore[arg-type]
    thread.start()
    return thread


def test_a_batch_task_past_the_slots_waits_for_one_and_an_interactive_task_does_not() -> None:
    slots = BatchSlots(1)
    inside, leave, ran = threading.Event(), threading.Event(), []

    def first_batch_task() -> None:
        with slots.held(BATCH_PRIORITY):
            inside.set()
            leave.wait(5)

    def second_batch_task() -> None:
        with slots.held(BATCH_START_PRIORITY):
            ran.append("batch")

    def interactive_task() -> None:
        with slots.held(INTERACTIVE_PRIORITY):
            assert not slots.holding()
            ran.append("interactive")

    first = _in_thread(first_batch_task)
    assert inside.wait(5)
    second, interactive = _in_thread(second_batch_task), _in_thread(interactive_task)
    interactive.join(5)
    time.sleep(0.05)
    assert ran == ["interactive"]  # the second batch task still waits for the slot
    leave.set()
    for thread in (first, second):
        thread.join(5)
    assert ran == ["interactive", "batch"]


def test_a_batch_task_waiting_on_the_model_lets_another_run_and_takes_a_slot_again_after() -> None:
    slots = BatchSlots(1)
    waiting, answered, order = threading.Event(), threading.Event(), []

    def calling_task() -> None:
        with slots.held(BATCH_PRIORITY):
            assert slots.holding()
            with slots.released():
                assert not slots.holding()
                waiting.set()
                answered.wait(5)  # the model's answer
            assert slots.holding()
            order.append("after the answer")

    def other_task() -> None:
        with slots.held(BATCH_PRIORITY):
            order.append("other")
            answered.set()

    calling = _in_thread(calling_task)
    assert waiting.wait(5)
    _in_thread(other_task).join(5)
    calling.join(5)
    assert order == ["other", "after the answer"]


def test_a_task_holding_no_slot_waits_on_the_model_as_it_is_and_slots_must_be_at_least_one() -> None:
    slots = BatchSlots(1)
    with slots.released():  # an interactive task's, or outside any task
        assert not slots.holding()
    with slots.held(BATCH_PRIORITY):
        assert slots.holding()
    assert not slots.holding()
    with pytest.raises(ValueError, match="at least one slot"):
        BatchSlots(0)
    assert green() is False  # the unit tests' process runs on threads, and builds no slots
