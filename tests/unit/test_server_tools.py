"""Server-tool execution on in-process fakes: the execute_server_tools step (which calls run, in what
order, at most once, what the model is told) and the executor's argument checks and results."""

from __future__ import annotations

import json
import uuid
from typing import Any

from shared.models.turn import ClientTool
from shared.result import ErrorCode, InvokeResult
from shared.state import LedgerEntry, TurnState
from shared.task_names import StepName
from tests.unit.fakes import (
    FIXED_NOW,
    TOOL_RUNS,
    TURN_ID,
    catalog_with_unit_tools,
    envelope,
    make_context,
    make_state,
)
from workers.context import StepContext
from workers.next_step import Continue, Next
from workers.steps import execute_server_tools
from workers.tools.executor import ToolContext, ToolExecutor, parse_arguments
from workers.tools.registry import ServerTool

_SCHEMA = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}


def _context() -> StepContext:
    return make_context(catalog=catalog_with_unit_tools())


def _state(*calls: tuple[str, str, dict[str, Any]], iteration: int = 1) -> TurnState:
    """A turn state whose ledger holds the server calls ``(call_id, name, arguments)`` of ``iteration``."""
    state = make_state(turn_id=TURN_ID)
    for call_id, name, arguments in calls:
        state.ledger.append(
            LedgerEntry(call_id=call_id, name=name, arguments=json.dumps(arguments), kind="server", iteration=iteration)
        )
    return state


def _key() -> str:
    return uuid.uuid4().hex


def _run(ctx: StepContext, state: TurnState, iteration: int = 1) -> InvokeResult[Next]:
    return execute_server_tools.run(ctx, envelope(StepName.EXECUTE_SERVER_TOOLS, hop=6, iteration=iteration), state)


def test_pending_calls_of_the_iteration_run_in_order_and_go_back_to_the_model() -> None:
    ctx = _context()
    first, second = _key(), _key()
    state = _state(("call_1", "counted_tool", {"key": first}), ("call_2", "counted_tool", {"key": second}))
    result = _run(ctx, state)
    assert result.unwrap() == Continue(StepName.REASONER, 1)
    assert (TOOL_RUNS[first], TOOL_RUNS[second]) == (1, 1)
    assert [(entry.status, entry.output) for entry in state.ledger] == [
        ("done", f"counted {first}"), ("done", f"counted {second}")
    ]  # fmt: skip
    assert state.transcript[-2:] == [
        {"type": "function_call_output", "call_id": "call_1", "output": f"counted {first}"},
        {"type": "function_call_output", "call_id": "call_2", "output": f"counted {second}"},
    ]
    executions = [step.data for step in state.trace if step.kind == "tool_execution"]
    assert [(data["call_id"], data["ok"]) for data in executions] == [("call_1", True), ("call_2", True)]


def test_calls_of_other_iterations_and_done_calls_are_not_run() -> None:
    ctx = _context()
    earlier, done = _key(), _key()
    state = _state(("call_1", "counted_tool", {"key": earlier}), iteration=1)
    state.ledger.append(LedgerEntry(call_id="call_2", name="counted_tool", arguments=json.dumps({"key": done}),
                                    kind="server", iteration=2, status="done", output="earlier"))  # fmt: skip
    assert _run(ctx, state, iteration=2).ok
    assert earlier not in TOOL_RUNS and done not in TOOL_RUNS
    assert state.ledger[0].status == "pending"


def test_a_step_run_again_from_the_state_before_it_runs_no_call_a_second_time() -> None:
    # Given a step whose calls ran, and whose state was never saved after them (its worker died)
    ctx = _context()
    first, second = _key(), _key()
    calls = (("call_1", "counted_tool", {"key": first}), ("call_2", "counted_tool", {"key": second}))
    assert _run(ctx, _state(*calls)).ok
    assert ctx.states.load(TURN_ID) is None  # the step itself writes no state: the driver's save does
    # When the step runs again on the state from before it, each outcome comes from its durable record
    again = _state(*calls)
    assert _run(ctx, again).ok
    assert (TOOL_RUNS[first], TOOL_RUNS[second]) == (1, 1)
    assert [entry.output for entry in again.ledger] == [f"counted {first}", f"counted {second}"]


def test_call_with_a_recorded_outcome_is_not_run_again_and_its_output_is_replayed() -> None:
    ctx = _context()
    key = _key()
    ctx.tool_runs.start(turn_id=TURN_ID, call_id="call_1", name="counted_tool", worker="w/1", now=FIXED_NOW)
    ctx.tool_runs.finish(turn_id=TURN_ID, call_id="call_1", status="succeeded", output="earlier output", now=FIXED_NOW)
    state = _state(("call_1", "counted_tool", {"key": key}))
    assert _run(ctx, state).ok
    assert key not in TOOL_RUNS
    assert state.ledger[0].output == "earlier output"
    assert any(step.kind == "tool_outcome_replayed" for step in state.trace)


def test_call_recorded_as_failed_fails_the_turn_again_without_running() -> None:
    ctx = _context()
    key = _key()
    ctx.tool_runs.start(turn_id=TURN_ID, call_id="call_1", name="counted_tool", worker="w/1", now=FIXED_NOW)
    ctx.tool_runs.finish(turn_id=TURN_ID, call_id="call_1", status="failed", output="it broke", now=FIXED_NOW)
    result = _run(ctx, _state(("call_1", "counted_tool", {"key": key})))
    assert result.error is not None and result.error.code is ErrorCode.TOOL_FAILED
    assert result.error.message == "it broke" and key not in TOOL_RUNS


def test_call_outcome_is_recorded_durably() -> None:
    ctx = _context()
    _run(ctx, _state(("call_1", "counted_tool", {"key": _key()})))
    record = ctx.tool_runs.for_turn(TURN_ID)["call_1"]
    assert record.status == "succeeded" and record.output is not None and record.output.startswith("counted ")


def test_idempotent_tool_keeps_no_durable_record() -> None:
    ctx = _context()
    state = _state(("call_1", "get_current_time", {}))
    assert _run(ctx, state).ok
    assert state.ledger[0].status == "done" and ctx.tool_runs.for_turn(TURN_ID) == {}


def test_tool_that_raises_fails_the_turn_tool_failed_and_stops_at_that_call() -> None:
    ctx = _context()
    after = _key()
    state = _state(("call_1", "failing_tool", {"reason": "disk on fire"}), ("call_2", "counted_tool", {"key": after}))
    result = _run(ctx, state)
    assert result.error is not None and result.error.code is ErrorCode.TOOL_FAILED
    assert "disk on fire" in result.error.message
    assert [entry.status for entry in state.ledger] == ["failed", "pending"] and after not in TOOL_RUNS
    assert ctx.tool_runs.for_turn(TURN_ID)["call_1"].status == "failed"


def test_invalid_arguments_are_refused_without_running_the_tool_and_the_model_is_told() -> None:
    ctx = _context()
    state = _state(("call_1", "counted_tool", {"key": 7}))
    runs_before = dict(TOOL_RUNS)
    assert _run(ctx, state).ok
    output = state.ledger[0].output
    assert output is not None and output.startswith("error: invalid arguments for counted_tool")
    assert any(step.kind == "tool_arguments_rejected" for step in state.trace)
    assert runs_before == TOOL_RUNS


def test_tool_not_registered_fails_unknown_tool() -> None:
    result = _run(_context(), _state(("call_1", "format_disk", {})))
    assert result.error is not None and result.error.code is ErrorCode.UNKNOWN_TOOL


def test_handler_gets_the_turns_tool_context() -> None:
    ctx = _context()
    state = _state(("call_1", "context_tool", {}))
    state.client_tools = [ClientTool(name="open_file", description="")]
    assert _run(ctx, state).ok
    assert json.loads(state.ledger[0].output or "") == {
        "session_id": state.session_id, "turn_id": TURN_ID, "org_id": "org", "user_id": "user", "mode": "general",
        "call_id": "call_1", "idempotency_key": f"{TURN_ID}:call_1",
    }  # fmt: skip


# The executor's argument checks and results


def _tool(handler: Any = None) -> ServerTool:
    return ServerTool("t", "", _SCHEMA, handler or (lambda n: n), 1.0)


def test_arguments_that_are_not_json_are_refused() -> None:
    message = parse_arguments(_tool(), "{not json")
    assert isinstance(message, str) and "not valid JSON" in message


def test_arguments_that_are_not_an_object_are_refused() -> None:
    assert parse_arguments(_tool(), "[1]") == "error: the arguments of t must be a JSON object"


def test_arguments_that_break_the_schema_are_refused_and_valid_ones_parsed() -> None:
    message = parse_arguments(_tool(), json.dumps({"n": "one"}))
    assert isinstance(message, str) and message.startswith("error: invalid arguments for t")
    assert parse_arguments(_tool(), json.dumps({"n": 1})) == {"n": 1}


_CONTEXT = ToolContext(session_id="s", turn_id="t", org_id="o", user_id="u", mode="general", call_id="c",
                       idempotency_key="t:c")  # fmt: skip


def test_value_that_is_not_a_string_comes_back_as_json() -> None:
    result = ToolExecutor(1).run(_tool(lambda n: {"double": 2 * n}), {"n": 2}, _CONTEXT)
    assert result.unwrap() == '{"double": 4}'


def test_value_that_cannot_be_json_fails_tool_failed() -> None:
    result = ToolExecutor(1).run(_tool(lambda n: object()), {"n": 2}, _CONTEXT)
    assert result.error is not None and result.error.code is ErrorCode.TOOL_FAILED
    assert "not JSON-serialisable" in result.error.message
