"""A plain turn end to end: gateway -> Celery chain of steps -> scripted model -> PostgreSQL."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import Engine, func, select

from shared.broker import create_producer
from shared.db.tables import SessionRow, TranscriptItemRow, TurnRow
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings
from shared.state import MemoryStateStore
from shared.step_sender import CeleryBroker, StepSender
from shared.task_names import StepName
from tests.integration.conftest import System
from tests.integration.events import TaskEventRecorder
from tests.responses_fixtures import validate_request_bodies
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def _marker() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def test_new_turn_completes_with_the_scripted_answer_when_posted(system: System) -> None:
    # Given a new session's first turn
    marker = _marker()
    # When it runs
    turn = system.run_turn({"input": f"hello {marker}"})
    # Then it completed with the model's text, in mode general, and GET returns the same
    assert turn["status"] == "completed"
    assert turn["output_text"] == f"Echo: hello {marker}"
    assert turn["mode"] == "general"
    assert turn["usage"]["llm_calls"] == 1
    assert turn["usage"]["input_tokens"] > 0
    assert turn["completed_at"] is not None
    again = system.http.get(f"/v1/turns/{turn['turn_id']}", headers=system.headers()).json()
    assert again == turn
    session = system.http.get(f"/v1/sessions/{turn['session_id']}", headers=system.headers())
    assert session.status_code == 200, session.text
    assert session.json()["mode"] == "general"
    assert [t["turn_id"] for t in session.json()["turns"]] == [turn["turn_id"]]


def test_first_call_carries_mode_prompt_layer_and_welcome_when_session_is_new(system: System) -> None:
    marker = _marker()
    system.run_turn({"input": f"first {marker}"})
    (request,) = system.llm_requests(marker)
    assert "general" in request["instructions"]
    texts = [item["content"] for item in request["input"] if item.get("role") == "developer"]
    assert texts and texts[0].startswith("Welcome to Aptix")
    assert [tool["name"] for tool in request["tools"]] == [
        "get_current_time",
        "record_call",
        "explode",
        "sleepy",
        "whoami",
        "agent_change_mode",
    ]
    assert request["store"] is False
    validate_request_bodies([request])


def test_requested_mode_is_honoured_when_the_catalog_knows_it(system: System) -> None:
    marker = _marker()
    turn = system.run_turn({"input": f"draft a record {marker}", "mode": "ddr-authoring"})
    assert turn["mode"] == "ddr-authoring"
    (request,) = system.llm_requests(marker)
    assert "ddr-authoring" in request["instructions"]
    assert any("DDR authoring mode" in str(item["content"]) for item in request["input"])
    session = system.http.get(f"/v1/sessions/{turn['session_id']}", headers=system.headers()).json()
    assert session["mode"] == "ddr-authoring"


def test_unknown_mode_is_422_when_starting_a_session(system: System) -> None:
    response = system.post_turn({"input": "hi", "mode": "no-such-mode"})
    assert response.status_code == 422
    error = response.json()["error"]
    assert error["code"] == "invalid_request"
    assert "no-such-mode" in error["message"] and "general" in error["message"]


def test_follow_up_turn_sends_earlier_turns_and_keeps_the_persisted_mode(system: System) -> None:
    # Given a session in ddr-authoring with one completed turn
    first_marker, second_marker = _marker(), _marker()
    first = system.run_turn({"input": f"one {first_marker}", "mode": "ddr-authoring"})
    # When a follow-up turn asks for another mode
    second = system.run_turn(
        {"session_id": first["session_id"], "input": f"two {second_marker}", "mode": "rag-indexing"}
    )
    # Then the persisted mode wins and the LLM request carries the earlier input and answer
    assert second["status"] == "completed"
    assert second["mode"] == "ddr-authoring"
    (request,) = system.llm_requests(second_marker)
    contents = [(item.get("role"), item.get("content")) for item in request["input"]]
    assert contents[:3] == [
        ("user", f"one {first_marker}"),
        ("assistant", f"Echo: one {first_marker}"),
        ("user", f"two {second_marker}"),
    ]
    assert "ddr-authoring" in request["instructions"]
    assert not any(role == "developer" for role, _ in contents), "the welcome text was sent again"
    validate_request_bodies([request])


def test_a_plain_turn_is_one_task_and_every_step_is_still_in_its_trace(
    system: System, task_events: TaskEventRecorder
) -> None:
    turn = system.run_turn({"input": f"tasks {_marker()}"})
    # A plain turn is 1 hop by default (APTIX_TASK_BOUNDARIES=call; tests/integration/test_task_boundaries.py has
    # the others): the entry's task runs the AGN-032 entry steps, the reasoner, the composition, the model call,
    # and the reasoner and the persistence after it ...
    hops = ["aptix.step.entry"]

    def every_hop() -> list[str] | None:
        # Task events come through the broker from several threads: one may arrive after a later one's.
        # A hop sent again (the entry message may come before the gateway's commit is visible) counts once.
        names = task_events.succeeded_hops(turn["turn_id"])
        return names if len(names) >= len(hops) else None

    assert wait_for(every_hop, what="the events of the turn's tasks", seconds=15, interval=0.2) == hops
    # ... and each of its steps is still in the trace, with its duration and worker (but the persistence: its commit
    # is the trace's last durable write)
    fused = [step for step in system.trace(turn["turn_id"]) if step["kind"] == "layer_step"]
    assert [step["step"] for step in fused] == [
        "request_handler", "session_creator", "session_context_resolver", "context_provider_initializer",
        "reasoner", "compose", "llm_call", "reasoner",
    ]  # fmt: skip
    assert all(step["duration_ms"] is not None and "@" in step["worker"] for step in fused)


def test_redelivered_steps_change_nothing_when_the_turn_already_ran(
    system: System, task_events: TaskEventRecorder, engine: Engine
) -> None:
    # Given a completed follow-up turn
    marker = _marker()
    first = system.run_turn({"input": f"base {_marker()}"})
    turn = system.run_turn({"session_id": first["session_id"], "input": f"dup {marker}"})
    before = _row_counts(engine, turn["session_id"])
    # When every step message of the turn is delivered again
    producer = create_producer(Settings(broker_url=system.env["APTIX_BROKER_URL"]))
    sender = StepSender(CeleryBroker(producer, retry=False), timers=MemoryStateStore(), park_after=30)
    steps = [
        (StepName.REQUEST_HANDLER, 0),
        (StepName.SESSION_RESTORER, 0),
        (StepName.SESSION_CONTEXT_RESOLVER, 0),
        (StepName.CONTEXT_PROVIDER_INITIALIZER, 0),
        (StepName.REASONER, 0),
        (StepName.COMPOSE, 1),
        (StepName.LLM_CALL, 1),
        (StepName.REASONER, 1),
        (StepName.PERSIST, 1),
    ]
    for hop, (step, iteration) in enumerate(steps):
        envelope = TurnEnvelope(turn_id=turn["turn_id"], step=step, hop=hop, iteration=iteration)
        sender.send([envelope])
        sender.send([envelope])
    _wait_for_tasks(task_events, turn["turn_id"], at_least=1 + 2 * len(steps))  # the turn's own 1, and these
    # Then there is still one LLM call, and the rows and the turn are unchanged
    assert len(system.llm_requests(marker)) == 1
    assert _row_counts(engine, turn["session_id"]) == before
    after = system.http.get(f"/v1/turns/{turn['turn_id']}", headers=system.headers()).json()
    assert after == turn


def _row_counts(engine: Engine, session_id: str) -> tuple[int, int, int]:
    with engine.connect() as conn:
        sessions = conn.scalar(select(func.count()).select_from(SessionRow).where(SessionRow.session_id == session_id))
        turns = conn.scalar(select(func.count()).select_from(TurnRow).where(TurnRow.session_id == session_id))
        items = conn.scalar(
            select(func.count()).select_from(TranscriptItemRow).where(TranscriptItemRow.session_id == session_id)
        )
    return int(sessions or 0), int(turns or 0), int(items or 0)


def _wait_for_tasks(task_events: TaskEventRecorder, turn_id: str, *, at_least: int) -> None:
    wait_for(
        lambda: len(task_events.succeeded_tasks(turn_id)) >= at_least,
        what=f"{at_least} tasks of {turn_id} to succeed",
        interval=0.2,
    )
