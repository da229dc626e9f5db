"""Real Flower, started as docs/operations.md says, against the running gateway and workers: every task of a
turn is found through its API with the turn id in what it returns, a failed turn is found by Flower's
Failed filter, and nothing answers without the password."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import httpx
import pytest

from tests.integration.conftest import System
from tests.integration.events import TaskEventRecorder
from tests.support.flower import Flower
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

SERVER_TOOL_TURN = ["aptix.step.entry", "aptix.step.execute_server_tools", "aptix.step.llm_call"]
"""The tasks of a turn with one server tool call, in order (the default ``APTIX_TASK_BOUNDARIES=call``: a task per call,
the entry's making the first model call; ``tests/integration/test_task_boundaries.py`` has the other settings)."""
EVERY_STEP = [
    "request_handler", "session_creator", "session_context_resolver", "context_provider_initializer", "reasoner",
    "compose", "llm_call", "reasoner", "execute_server_tools", "reasoner", "compose", "llm_call", "reasoner", "persist",
]  # fmt: skip
"""The steps of that turn, in order: what the tasks' results list, each with its time."""


def test_flower_lists_every_task_of_a_turn_with_its_turn_id_when_a_server_tool_turn_runs(
    system: System, flower: Flower, task_events: TaskEventRecorder
) -> None:
    # Given Flower watching the workers
    # When a turn with one server tool call runs
    key = uuid.uuid4().hex
    turn = system.run_turn({"input": f"[[call:record_call {json.dumps({'key': key})}]] {key}"})
    assert turn["status"] == "completed"
    turn_id = turn["turn_id"]
    # Then Flower's API finds every task of the turn by its id, each one succeeded, with the turn id in its args
    tasks = wait_for(
        lambda: _succeeded(flower.tasks(search=turn_id), len(SERVER_TOOL_TURN)), what="Flower to list the turn's tasks"
    )
    in_order = sorted(tasks.values(), key=lambda t: t["received"])
    assert [task["name"] for task in _without_early_starts(in_order)] == SERVER_TOOL_TURN
    assert all(turn_id in task["args"] for task in tasks.values())
    assert all(task["worker"] and task["worker"].startswith("w1@") for task in tasks.values())
    # And Flower's Result column lists every step each task ran, those run inline included
    results = [str(task["result"]) for task in _without_early_starts(in_order)]
    assert [step for result in results for step in re.findall(r"(\w+) [\d.]+ ms", result)] == EVERY_STEP, results
    # And they are the very tasks the workers ran (as an independent listener saw them)
    assert set(tasks) == set(task_events.task_events(turn_id))


def test_flower_failed_filter_finds_the_task_that_failed_a_turn(system: System, flower: Flower) -> None:
    # Given a turn whose server tool raises
    marker = f"m{uuid.uuid4().hex[:10]}"
    turn = system.run_turn({"input": f"[[call:explode {json.dumps({'reason': marker})}]] {marker}"})
    assert turn["status"] == "failed" and turn["error"]["code"] == "tool_failed"
    # When Flower's tasks are filtered to the failed ones
    failed = wait_for(
        lambda: flower.tasks(state="FAILURE", search=turn["turn_id"]), what="Flower to list the failed task"
    )
    # Then the step that failed the turn is there, with the turn id and the turn's error code
    [task] = failed.values()
    assert task["name"] == "aptix.step.execute_server_tools"
    assert turn["turn_id"] in task["args"]
    assert "tool_failed" in task["exception"] and marker in task["exception"]


def test_flower_answers_nothing_without_its_password(flower: Flower) -> None:
    for path in ("/api/tasks", "/api/workers", "/tasks", "/"):
        assert httpx.get(f"{flower.url}{path}", timeout=10).status_code == 401, path
        wrong = httpx.get(f"{flower.url}{path}", auth=(flower.user, "not-the-password"), timeout=10)
        assert wrong.status_code == 401, path
    assert flower.get("/api/tasks").status_code == 200


def test_flower_password_is_not_on_its_command_line(flower: Flower) -> None:
    with open(f"/proc/{flower.process.pid}/cmdline", "rb") as cmdline:
        argv = cmdline.read().decode().split("\0")
    assert not [arg for arg in argv if flower.password in arg or "basic" in arg.lower()]
    assert "--tasks_columns=name,uuid,state,args,result,received,started,runtime,worker" in argv


def _without_early_starts(tasks: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tasks`` without the first steps that came too early and were sent again.

    The gateway sends a turn's first message just before it commits the turn: a worker that takes it
    within that millisecond does not find the turn yet and sends the same step again as its next
    attempt (``workers.retry``, ``turn_not_recorded``). Each such try is a task of its own in Flower.
    Only that is allowed: the same step, each try the previous one's next attempt.
    """
    first = 0
    while first + 1 < len(tasks) and tasks[first + 1]["name"] == tasks[0]["name"] == "aptix.step.entry":
        assert f"'attempt': {first + 1}" in tasks[first + 1]["args"], tasks[first + 1]["args"]
        first += 1
    return tasks[first:]


def _succeeded(tasks: dict[str, dict[str, Any]], count: int) -> dict[str, dict[str, Any]]:
    """``tasks`` once ``count`` of them succeeded, the turn's last (the one that ran ``persist``) among them, else an
    empty dict."""
    done = [task for task in tasks.values() if task["state"] == "SUCCESS"]
    last = any("persist" in str(task.get("result")) for task in done)
    return tasks if len(done) >= count and last else {}
