"""Each ``APTIX_TASK_BOUNDARIES`` with real processes: an ``aptix worker`` with no flags (its ``pipeline,tools``
threads process and its ``llm,webhooks`` gevent process), the gateway and the scripted model. With ``layer``
every layer is a task; with ``queue`` a task runs every following step on its queue and a message goes only
where the queue changes, so each hop crosses from one process to the other; with ``call`` (the default) a
message goes only to a model or tool call, the pipeline's steps run in the task before them, and the entry's
task (on the ``llm`` queue) makes the round's first model call. Celery's
task events (what Flower shows) are the hops, and each task's result lists the steps it ran; the turn's
trace still has every step, with its time and worker."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripted_llm import ScriptedServer
from tests.integration.conftest import OPEN_FILE, System, own_system
from tests.integration.events import TaskEventRecorder, recording
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["layer", "queue", "call"])
def queue_system(
    request: pytest.FixtureRequest, database_url: str, scripted_llm: ScriptedServer, modes_file: Path
) -> Iterator[System]:
    """A gateway and one ``aptix worker`` with no flags, tasks bounded by layer, by queue or by call, on Redis
    databases of their own."""
    bounds = {"APTIX_TASK_BOUNDARIES": request.param}
    with own_system(database_url=database_url, llm=scripted_llm, modes_file=modes_file, env=bounds) as (stack, system):
        stack.start_worker("wq", pool=None, queues="pipeline,llm,tools,webhooks")
        yield system


@pytest.fixture(scope="module")
def queue_events(queue_system: System) -> Iterator[TaskEventRecorder]:
    with recording(queue_system.env["APTIX_BROKER_URL"]) as recorder:
        yield recorder


def _call(name: str, arguments: dict[str, Any] | None = None) -> str:
    return f"[[call:{name} {json.dumps(arguments or {})}]]"


def _hops(events: TaskEventRecorder, turn_id: str, count: int) -> list[str]:
    def every_hop() -> list[str] | None:
        names = events.succeeded_hops(turn_id)
        return names if len(names) >= count else None

    return wait_for(every_hop, what="the events of the turn's tasks", seconds=15, interval=0.2)


_ENTRY_STEPS = ["request_handler", "session_creator", "session_context_resolver", "context_provider_initializer"]
SERVER_TOOL_TURN = {
    "layer": (
        [
            "aptix.step.entry",
            "aptix.step.reasoner",
            "aptix.step.compose",
            "aptix.step.llm_call",
            "aptix.step.reasoner",
            "aptix.step.execute_server_tools",
            "aptix.step.reasoner",
            "aptix.step.compose",
            "aptix.step.llm_call",
            "aptix.step.reasoner",
            "aptix.step.persist",
        ],
        _ENTRY_STEPS,
    ),
    "queue": (
        [
            "aptix.step.entry",  # and the reasoner and the composition after it (pipeline)
            "aptix.step.llm_call",
            "aptix.step.reasoner",
            "aptix.step.execute_server_tools",
            "aptix.step.reasoner",  # and the composition
            "aptix.step.llm_call",
            "aptix.step.reasoner",  # and the persistence
        ],
        [*_ENTRY_STEPS, "reasoner", "compose", "compose"],
    ),
    "call": (
        [
            "aptix.step.entry",  # and the reasoner, the composition, the first model call and the reasoner
            "aptix.step.execute_server_tools",  # and the reasoner and the composition
            "aptix.step.llm_call",  # and the reasoner and the persistence
        ],
        [*_ENTRY_STEPS, "reasoner", "compose", "llm_call", "reasoner", "reasoner", "compose", "reasoner"],
    ),
}
"""Task boundaries -> a server-tool turn's tasks, and the steps its trace records as run inline."""
CLIENT_TOOL_ROUND = {
    "layer": [
        "aptix.step.entry",
        "aptix.step.reasoner",
        "aptix.step.compose",
        "aptix.step.llm_call",
        "aptix.step.reasoner",
        "aptix.step.persist",
    ],
    "queue": ["aptix.step.entry", "aptix.step.llm_call", "aptix.step.reasoner"],
    "call": ["aptix.step.entry"],
}
"""Task boundaries -> the tasks of each round of a client-tool turn."""


def test_a_server_tool_turn_is_a_task_per_boundary_each_running_the_steps_after_it(
    queue_system: System, queue_events: TaskEventRecorder
) -> None:
    hops, inline_steps = SERVER_TOOL_TURN[queue_system.env["APTIX_TASK_BOUNDARIES"]]
    turn = queue_system.run_turn({"input": f"{_call('get_current_time')} what time is it {uuid.uuid4().hex}"})
    assert turn["status"] == "completed", turn
    assert turn["output_text"].startswith("Tool results: get_current_time=20")
    assert _hops(queue_events, turn["turn_id"], len(hops)) == hops
    trace = queue_system.trace(turn["turn_id"])
    inline = [step for step in trace if step["kind"] == "layer_step"]
    assert [step["step"] for step in inline] == inline_steps
    assert all(step["duration_ms"] is not None and "@" in step["worker"] for step in inline)
    assert [s["data"]["tool"] for s in trace if s["kind"] == "tool_execution"] == ["get_current_time"]
    # Flower's Result column: each task lists the steps it ran, inline ones included, and the step it sent next
    results = queue_events.succeeded_results(turn["turn_id"])
    assert len(results) == len(hops), results
    ran = [re.findall(r"(\w+) [\d.]+ ms", result) for result in results]
    first = [hop.removeprefix("aptix.step.").replace("entry", _ENTRY_STEPS[0]) for hop in hops]
    assert [steps[0] for steps in ran] == first
    assert [step for steps in ran for step in steps if step in ("reasoner", "compose", "persist")][-1] == "persist"
    assert sum(steps.count("reasoner") for steps in ran) == 4  # after the entry, each call, and the tool
    assert [re.search(r"next (\w+)", result)[1] for result in results[:-1]] == first[1:]  # type: ignore[index]
    assert "next" not in results[-1]
    received = [e for events in queue_events.task_events(turn["turn_id"]).values() for e in events]
    hosts = {e["name"]: e["hostname"] for e in received if e["type"] == "task-received"}
    if queue_system.env["APTIX_TASK_BOUNDARIES"] == "call":  # the entry ran where model calls run: the llm process
        assert hosts["aptix.step.entry"] == hosts["aptix.step.llm_call"] != hosts["aptix.step.execute_server_tools"]
    else:
        assert hosts["aptix.step.entry"] == hosts["aptix.step.execute_server_tools"] != hosts["aptix.step.llm_call"]


def test_a_client_tool_turn_pauses_and_its_resumed_round_has_the_same_tasks(
    queue_system: System, queue_events: TaskEventRecorder
) -> None:
    tasks = CLIENT_TOOL_ROUND[queue_system.env["APTIX_TASK_BOUNDARIES"]]
    paused = queue_system.run_turn(
        {"input": f"{_call('open_file', {'path': 'a.txt'})} {uuid.uuid4().hex}", "tools": [OPEN_FILE]}
    )
    assert paused["status"] == "requires_client_tools", paused
    (pending,) = paused["pending_tool_calls"]
    assert _hops(queue_events, paused["turn_id"], len(tasks)) == tasks
    done = queue_system.resume(paused["turn_id"], [{"call_id": pending["call_id"], "output": "hello from a.txt"}])
    assert done["status"] == "completed", done
    assert done["output_text"] == "Tool results: open_file=hello from a.txt"
    # round 1: the re-entry (entry, reasoner, compose), the model call, the reasoner and the persistence
    assert _hops(queue_events, paused["turn_id"], 2 * len(tasks))[len(tasks) :] == tasks
