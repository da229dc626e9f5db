"""Workers that die mid-step, with real worker processes (issue 25): a step that kills its worker on every
delivery is given up once it did so ``APTIX_STEP_MAX_DELIVERIES`` times while it ran alone in its worker
process (its turn fails ``worker_lost``, the workers stop dying, the session takes a new turn), whether
the message comes back through the broker's visibility timeout (a threads pool: the process dies, a
supervisor starts another) or a prefork pool's requeue (only the child dies); and a worker killed while
it relays a streamed answer leaves no text twice on the turn's event stream."""

from __future__ import annotations

import json
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from aptix_cli.launcher import ManagedProcess
from scripted_llm import ScriptedServer
from shared.state.keys import claim_key
from tests.integration.conftest import System, own_system
from tests.support.sse import SseEvent, iter_sse
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

DIE_TOOL = {
    "name": "die", "description": "Kills the worker running it.", "handler": "tests.support.tools:die",
    "idempotent": True,
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
}  # fmt: skip
MAX_DELIVERIES = 3
"""``APTIX_STEP_MAX_DELIVERIES``'s default, which these systems run with."""
RUNS = MAX_DELIVERIES
"""The runs of a poison step: one per lost delivery, the last of them alone in its worker process."""


@pytest.fixture(scope="module")
def poison_catalog(modes_file: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test catalog plus ``die``, offered in mode general."""
    catalog = yaml.safe_load(modes_file.read_text())
    catalog["tools"] = [*catalog["tools"], DIE_TOOL]
    for mode in catalog["modes"]:
        if mode["name"] == "general":
            mode["tools"] = [*mode["tools"], DIE_TOOL["name"]]
    path = tmp_path_factory.mktemp("poison") / "modes.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


@pytest.fixture
def poisoned(
    database_url: str, scripted_llm: ScriptedServer, poison_catalog: Path
) -> Iterator[tuple[LocalStack, System]]:
    """A gateway on Redis databases of its own (no worker yet), with ``die`` in its catalog."""
    with own_system(database_url=database_url, llm=scripted_llm, modes_file=poison_catalog) as (stack, system):
        try:
            yield stack, system
        finally:
            system.http.close()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_step_that_kills_its_worker_on_every_delivery_fails_its_turn_worker_lost(
    poisoned: tuple[LocalStack, System], pool: str
) -> None:
    stack, system = poisoned
    key = f"poison-{pool}-{uuid.uuid4().hex[:8]}"
    # Given a turn whose model calls a server tool that kills the process running it, every time
    first = system.post_turn({"input": f"[[call:die {json.dumps({'key': key})}]] {key}"})
    assert first.status_code == 202, first.text
    turn_id = first.json()["turn_id"]

    # When workers run it, a dead worker replaced as a supervisor would (a prefork parent replaces its child)
    worker, restarts, turn = _supervise(stack, system, turn_id, pool=pool)

    # Then the step ran MAX_DELIVERIES times, the last alone, and was given up: the turn failed worker_lost
    assert turn["status"] == "failed", turn
    assert turn["error"]["code"] == "worker_lost", turn
    assert f"on each of its {MAX_DELIVERIES} deliveries, 1 of them while it ran alone" in turn["error"]["message"]
    assert system.tool_calls(key) == RUNS
    assert restarts == (RUNS if pool == "threads" else 0)
    # and the session takes a new turn, run by the worker that is still alive, which the poison no longer reaches
    follow_up = system.run_turn({"input": f"still there? {key}", "session_id": turn["session_id"]})
    assert follow_up["status"] == "completed", follow_up
    assert follow_up["output_text"] == f"Echo: still there? {key}"
    assert worker.alive() and system.tool_calls(key) == RUNS
    events = [event.event for event in _events(system, turn_id)]
    assert events[-1] == "turn.failed"


def _supervise(stack: LocalStack, system: System, turn_id: str, *, pool: str) -> tuple[ManagedProcess, int, Any]:
    """Keep one worker running until the turn ends, starting a new one each time the last one died.

    Returns:
        The worker running at the end, how many times one was started again, and the ended turn.
    """
    worker = _start(stack, f"p{pool[0]}0", pool)
    restarts = 0
    deadline = time.monotonic() + 150
    while time.monotonic() < deadline:
        turn = system.http.get(f"/v1/turns/{turn_id}", headers=system.headers()).json()
        if turn["status"] not in ("queued", "running"):
            return worker, restarts, turn
        if not worker.alive():
            restarts += 1
            worker = _start(stack, f"p{pool[0]}{restarts}", pool)
        time.sleep(0.2)
    raise AssertionError(f"turn {turn_id} did not end in 150 s ({restarts} worker restarts)")


def _start(stack: LocalStack, name: str, pool: str) -> ManagedProcess:
    """A worker on ``pool`` (2 slots); one that the poison killed before it said "ready" is returned dead."""
    try:
        return stack.start_worker(name, pool=pool, concurrency=2)
    except RuntimeError:
        process = stack.processes[-1]
        assert process.name == name and not process.alive(), process.log()[-2000:]
        return process


def _events(system: System, turn_id: str) -> list[SseEvent]:
    """The turn's whole event stream, as a client reads it (it ends with the turn)."""
    with system.http.stream("GET", f"/v1/turns/{turn_id}/events", headers=system.headers()) as answer:
        assert answer.status_code == 200, answer.read()
        return [item for item in iter_sse(answer) if isinstance(item, SseEvent)]


@pytest.mark.timeout(180)
def test_a_worker_killed_while_it_relays_a_streamed_answer_leaves_no_text_twice(
    poisoned: tuple[LocalStack, System],
) -> None:
    stack, system = poisoned
    client = redis.Redis.from_url(system.env["APTIX_REDIS_URL"])
    workers = {name: stack.start_worker(name) for name in ("sa", "sb")}
    marker = f"m{uuid.uuid4().hex[:8]}"
    text = " ".join(f"{marker}-word{index}" for index in range(30))
    # Given a streamed turn whose model writes its answer slowly
    body = {"input": f"[[drip:100]] [[say:{text}]]", "stream": True}
    seen: list[SseEvent] = []
    with system.http.stream("POST", "/v1/turns", json=body, headers=system.headers()) as answer:
        assert answer.status_code == 200, answer.read()
        turn_id = answer.headers["aptix-turn-id"]
        for item in iter_sse(answer):
            if not isinstance(item, SseEvent):
                continue
            seen.append(item)
            # When the worker relaying the answer is killed (SIGKILL, by its pid) after three deltas
            if sum(event.event == "output_text.delta" for event in seen) == 3 and len(workers) == 2:
                holder = _lease_holder(client, turn_id, "request_handler")  # the entry's task makes the call
                workers.pop(holder).kill(signal.SIGKILL)

    # Then the other worker ran the call again, and the stream the client read (and a replay of it)
    # joins, its resets applied, to the turn's text, shown once
    assert len(workers) == 1, "the worker was never killed"
    turn = system.http.get(f"/v1/turns/{turn_id}", headers=system.headers()).json()
    assert turn["status"] == "completed", turn
    assert turn["output_text"] == text
    assert seen[-1].event == "turn.completed"
    assert _joined(seen) == text
    assert _joined(_events(system, turn_id)) == text
    assert any(event.event == "output_text.reset" and event.data["deltas"] >= 3 for event in seen)
    assert len(system.llm_requests(marker)) == 2


def _lease_holder(client: redis.Redis, turn_id: str, step: str) -> str:
    """The name of the worker holding the lease of the turn's ``step`` (``<name>@<host>:<uuid>``)."""

    def holder() -> str | None:
        for key in client.keys(claim_key(turn_id, f"*{step}*")):
            owner = client.get(key)
            if isinstance(owner, bytes):
                return owner.decode().split("@")[0]
        return None

    return wait_for(holder, what=f"the lease of {step}", seconds=5)


def _joined(events: list[SseEvent]) -> str:
    """The deltas joined, the last N dropped at each ``output_text.reset``."""
    kept: list[str] = []
    for event in events:
        if event.event == "output_text.delta":
            kept.append(event.data["delta"])
        elif event.event == "output_text.reset":
            del kept[len(kept) - event.data["deltas"] :]
    return "".join(kept)
