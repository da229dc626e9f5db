"""Fair admission with real processes: two organisations' batches run side by side, an interactive turn
does not wait for them, and the admission scheduler killed with SIGKILL mid-batch loses no turn and
runs none twice.

Workers run with ``--no-scheduler`` and the scheduler apart (``aptix scheduler``), with a small
``APTIX_ORG_MAX_IN_FLIGHT`` so the organisations contend for the workers' slots. Every assertion
counts (turns, model calls, their order in the scripted model's journal); none reads a clock.
"""

from __future__ import annotations

import signal
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripted_llm import ScriptedServer
from tests.conftest import KEY_A, KEY_B
from tests.integration.conftest import System, own_system
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

TURNS = 300
"""Turns in each organisation's batch."""
CAP = 6
"""``APTIX_ORG_MAX_IN_FLIGHT``: 2 x 6 batch turns in flight leave idle slots among the workers' 16."""


@pytest.fixture
def admission_system(
    database_url: str, scripted_llm: ScriptedServer, modes_file: Path
) -> Iterator[tuple[LocalStack, System]]:
    """A gateway and two worker processes without a scheduler, on their own broker and state store."""
    with own_system(database_url=database_url, llm=scripted_llm, modes_file=modes_file) as (stack, system):
        stack.env["APTIX_ORG_MAX_IN_FLIGHT"] = str(CAP)
        for name in ("fa1", "fa2"):
            stack.start_worker(name, concurrency=8, args=["--no-scheduler"])
        yield stack, system


def _counts(system: System, batch_id: str, key: str) -> dict[str, int]:
    response = system.http.get(f"/v1/batches/{batch_id}", headers=system.headers(key))
    assert response.status_code == 200, response.text
    counts: dict[str, int] = response.json()["counts"]
    return counts


def _submit(system: System, key: str, inputs: list[str]) -> str:
    response = system.http.post(
        "/v1/batches", json={"requests": [{"input": text} for text in inputs]}, headers=system.headers(key)
    )
    assert response.status_code == 202, response.text
    return str(response.json()["batch_id"])


def test_two_organisations_share_the_workers_and_a_killed_scheduler_loses_no_turn(
    admission_system: tuple[LocalStack, System],
) -> None:
    stack, system = admission_system
    marker = uuid.uuid4().hex[:8]
    inputs = {org: [f"[[sleep:60]] fair {org} {i} {marker}" for i in range(TURNS)] for org in ("a", "b")}
    # Given no scheduler yet: both batches are held, none starts
    batch_a = _submit(system, KEY_A, inputs["a"])
    batch_b = _submit(system, KEY_B, inputs["b"])
    assert _counts(system, batch_a, KEY_A)["queued"] == TURNS
    # When the scheduler runs, both batches run side by side
    scheduler = stack.start_scheduler("scheduler-1")
    seen: list[tuple[int, int]] = []

    def progress(until: int) -> tuple[int, int] | None:
        done = (_counts(system, batch_a, KEY_A)["completed"], _counts(system, batch_b, KEY_B)["completed"])
        seen.append(done)
        return done if min(done) >= until or max(done) == TURNS else None

    wait_for(lambda: progress(TURNS // 5), what="both batches to be under way", seconds=120, interval=0.2)
    # An interactive turn submitted while both run starts before the batches drained
    interactive_input = f"[[sleep:60]] interactive {marker}"
    at_submit = seen[-1]
    interactive = system.post_turn({"input": interactive_input}, key=KEY_B).json()
    # The scheduler is killed mid-batch (SIGKILL: between a release and its sends, perhaps) and restarted
    scheduler.kill(signal.SIGKILL)
    stack.processes.remove(scheduler)
    assert system.wait_turn(interactive["turn_id"], key=KEY_B)["status"] == "completed"
    stack.start_scheduler("scheduler-2")
    first_done = wait_for(lambda: progress(TURNS), what="a batch to complete", seconds=300, interval=0.2)
    for batch_id, key in ((batch_a, KEY_A), (batch_b, KEY_B)):
        wait_for(
            lambda b=batch_id, k=key: _counts(system, b, k)["completed"] == TURNS or None,  # type: ignore[misc]
            what=f"batch {batch_id} to complete",
            seconds=300,
            interval=0.5,
        )

    # Fairness: when the first batch completed, the other had completed most of its turns too
    assert min(first_done) >= 0.6 * TURNS, f"completed (a, b) when the first batch ended: {first_done}"
    # Every turn completed, and every turn's model call was made exactly once (none lost, none run twice)
    journal = system.llm.requests(marker)
    calls = Counter(_input_of(entry["body"]) for entry in journal)
    expected = [*inputs["a"], *inputs["b"], interactive_input]
    assert {text: calls[text] for text in expected} == dict.fromkeys(expected, 1)
    for batch_id, key in ((batch_a, KEY_A), (batch_b, KEY_B)):
        assert _counts(system, batch_id, key) == {
            "queued": 0, "running": 0, "requires_client_tools": 0, "completed": TURNS, "failed": 0, "cancelled": 0
        }  # fmt: skip
    # The interactive turn did not wait for the batches: most batch turns unfinished at its submission
    # made their model call after it (at most the turns in flight then, and a few more, came first)
    order = {_input_of(entry["body"]): entry["seq"] for entry in journal}
    remaining = 2 * TURNS - sum(at_submit)
    after = sum(1 for text in [*inputs["a"], *inputs["b"]] if order[text] > order[interactive_input])
    assert after >= remaining - 4 * CAP - 10, f"{after} of {remaining} unfinished batch turns called after it"


def _input_of(body: dict[str, Any]) -> str:
    """The user input of a Responses API request body (its last user message's text)."""
    items = body["input"] if isinstance(body["input"], list) else [{"role": "user", "content": body["input"]}]
    for item in reversed(items):
        if item.get("role") == "user":
            content = item["content"]
            if isinstance(content, str):
                return content
            return "".join(part.get("text", "") for part in content)
    return ""
