"""A step that fails its turn is a FAILED task (what Flower shows), run once and acknowledged, on real workers."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest

from tests.integration.conftest import System
from tests.integration.events import TaskEventRecorder
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def test_step_that_fails_its_turn_is_one_failed_task_run_once_when_a_server_tool_raises(
    system: System, task_events: TaskEventRecorder
) -> None:
    # Given a turn whose model calls the server tool that always raises
    marker = f"m{uuid.uuid4().hex[:10]}"
    call = json.dumps({"reason": f"disk on fire {marker}"})
    # When it runs
    turn = system.run_turn({"input": f"[[call:explode {call}]] {marker}"})
    # Then the turn records its failure as before
    assert turn["status"] == "failed" and turn["error"]["code"] == "tool_failed"
    assert f"disk on fire {marker}" in turn["error"]["message"]
    # (the default APTIX_TASK_BOUNDARIES=call: the entry with the first model call, execute_server_tools, and the
    # persistence of the failure: a step that fails its turn ends its task)
    tasks = wait_for(
        lambda: _finished_tasks(task_events, turn["turn_id"], count=3), what="the 3 tasks of the failed turn"
    )
    # And exactly the task of the step that failed the turn is FAILED, with the turn's code and no more
    failed = {task_id: events for task_id, events in tasks.items() if _ends(events) == "task-failed"}
    assert [_name(events) for events in failed.values()] == ["aptix.step.execute_server_tools"]
    [(failed_id, failed_events)] = failed.items()
    failure = next(event for event in failed_events if event["type"] == "task-failed")
    assert "TurnFailed" in failure["exception"] and "tool_failed" in failure["exception"]
    assert marker in failure["exception"], "the message is the turn's, which says what failed"
    assert "Traceback" not in failure["exception"]
    # And every other task, the persist that records the failure included, succeeded
    others = sorted(_name(events) for task_id, events in tasks.items() if task_id != failed_id)
    assert all(_ends(events) == "task-succeeded" for task_id, events in tasks.items() if task_id != failed_id)
    assert "aptix.step.persist" in others
    # And it ran exactly once: one delivery of that task, and no other tools task for this turn
    assert [event["type"] for event in failed_events].count("task-received") == 1
    assert sum(_name(events) == "aptix.step.execute_server_tools" for events in tasks.values()) == 1
    # And its message was acknowledged: it is neither held unacknowledged nor back in a queue, so it
    # is never redelivered
    wait_for(lambda: not _in_broker(system, failed_id), what="the failed task's message to be acknowledged")
    # And the worker logged the failure in one line, without Celery's traceback for an unexpected error
    worker_log = _worker_log(system)
    assert f"turn {turn['turn_id']} failed at execute_server_tools: tool_failed" in worker_log
    assert f"[{failed_id}] raised unexpected" not in worker_log


def test_model_call_that_fails_its_turn_is_the_failed_task_that_made_it(
    system: System, task_events: TaskEventRecorder
) -> None:
    # Given a turn whose model call is refused for good (400: not retried)
    marker = f"m{uuid.uuid4().hex[:10]}"
    turn = system.run_turn({"input": f"[[fail:400]] {marker}"})
    assert turn["status"] == "failed" and turn["error"]["code"] == "llm_error"
    tasks = wait_for(  # the entry, which makes the first model call, and the persistence of the failure
        lambda: _finished_tasks(task_events, turn["turn_id"], count=2), what="the 2 tasks of the failed turn"
    )
    # Then the task that made the call is the one FAILED task of the turn, with the model call's error
    failed = {_name(events): events for events in tasks.values() if _ends(events) == "task-failed"}
    assert list(failed) == ["aptix.step.entry"]
    failure = next(event for event in failed["aptix.step.entry"] if event["type"] == "task-failed")
    assert "llm_error" in failure["exception"]


def _finished_tasks(recorder: TaskEventRecorder, turn_id: str, *, count: int) -> dict[str, list[dict[str, Any]]]:
    """The turn's tasks once ``count`` of them have ended (succeeded or failed), else an empty dict."""
    tasks = recorder.task_events(turn_id)
    ended = [events for events in tasks.values() if _ends(events) in ("task-succeeded", "task-failed")]
    return tasks if len(ended) >= count else {}


def _ends(events: list[dict[str, Any]]) -> str:
    """How a task ended: its succeeded or failed event ('' while it has neither)."""
    kinds = [event["type"] for event in events]
    return next((kind for kind in kinds if kind in ("task-succeeded", "task-failed")), "")


def _name(events: list[dict[str, Any]]) -> str:
    return str(next(event["name"] for event in events if event["type"] == "task-received"))


def _in_broker(system: System, task_id: str) -> bool:
    """Whether a message of ``task_id`` is unacknowledged or waiting in any queue of the broker."""
    import redis

    broker = redis.Redis.from_url(system.env["APTIX_BROKER_URL"])
    if any(task_id.encode() in value for value in broker.hvals("unacked")):
        return True
    lists = list(broker.scan_iter(_type="list"))
    return any(task_id.encode() in item for key in lists for item in broker.lrange(key, 0, -1))


def _worker_log(system: System) -> str:
    return "\n".join(process.log() for process in system.stack.processes if process.name == "w1")
