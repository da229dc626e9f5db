"""TurnEnvelope's counters: the example turn its docstring walks through is the turn the driver runs."""

from __future__ import annotations

import json
from datetime import timedelta

from shared.db.turns import NewTurn
from shared.errors import LlmError
from shared.models.envelope import TurnEnvelope
from shared.task_names import StepName
from tests.unit.fakes import FIXED_NOW, Clock, FakeLlm, catalog_with_counted_tool, make_context
from workers.context import StepContext
from workers.driver import Dispatch, run_step
from workers.llm.types import FunctionCall, LlmResponse

TURN_ID = "turn_" + "2" * 32


def _calls(name: str, call_id: str, arguments: str) -> LlmResponse:
    return LlmResponse(
        response_id=f"r_{call_id}", output_text=None, function_calls=(FunctionCall(call_id, name, arguments),)
    )


def _drive(ctx: StepContext, clock: Clock, env: TurnEnvelope) -> list[tuple[str, int]]:
    """Every message of one chain, as (step key, attempt), waiting out each countdown."""
    sent: list[tuple[str, int]] = []
    dispatch: Dispatch | None = Dispatch(env)
    while dispatch is not None:
        sent.append((dispatch.envelope.step_key, dispatch.envelope.attempt))
        clock.now += timedelta(seconds=dispatch.countdown)
        dispatch = run_step(ctx, dispatch.envelope)
    return sent


def test_counters_advance_as_the_envelope_docstring_shows_for_a_server_tool_turn_with_a_client_tool_pause() -> None:
    # Given a turn whose model calls a server tool, is rate-limited once, calls a client tool, then answers
    clock = Clock()
    llm = FakeLlm(
        _calls("counted_tool", "call_server", json.dumps({"key": "envelope-example"})),
        LlmError("slow down", status_code=429, retryable=True, retry_after=1.0),
        _calls("open_file", "call_client", "{}"),
        LlmResponse(response_id="r_answer", output_text="done", function_calls=()),
    )
    ctx = make_context(llm, clock=clock, catalog=catalog_with_counted_tool())
    ctx.turns.create(
        NewTurn(turn_id=TURN_ID, session_id="sess_" + "2" * 32, org_id="o", user_id="u", new_session=True,
                requested_mode=None, request={"input": "hi", "tools": [{"name": "open_file", "description": "Open."}]},
                request_hash="h"),
        now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
    )  # fmt: skip

    # When it runs, its client tool's result is posted, and it runs again
    first = _drive(ctx, clock, TurnEnvelope(turn_id=TURN_ID, step=StepName.REQUEST_HANDLER))
    round_ = ctx.turns.accept_tool_results(
        TURN_ID,
        results=[{"call_id": "call_client", "output": "x"}],
        now=clock(),
        deadline_at=clock() + timedelta(seconds=60),
    )
    assert round_ == 1
    second = _drive(ctx, clock, TurnEnvelope(turn_id=TURN_ID, step=StepName.REQUEST_HANDLER, round=round_))

    # Then the messages are the docstring's, line by line
    assert first == [
        ("0:0:request_handler:0", 0),
        ("0:4:reasoner:0", 0),
        ("0:5:compose:1", 0),
        ("0:6:llm_call:1", 0),
        ("0:7:reasoner:1", 0),
        ("0:8:execute_server_tools:1", 0),
        ("0:9:reasoner:1", 0),
        ("0:10:compose:2", 0),
        ("0:11:llm_call:2", 0),
        ("0:11:llm_call:2", 1),
        ("0:12:reasoner:2", 0),
        ("0:13:persist:2", 0),
    ]
    assert second == [
        ("1:0:request_handler:0", 0),
        ("1:5:reasoner:0", 0),
        ("1:6:compose:3", 0),
        ("1:7:llm_call:3", 0),
        ("1:8:reasoner:3", 0),
        ("1:9:persist:3", 0),
    ]
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == "completed"
