"""The events a turn's steps send to its event log: each trace record once, in order, and the event that
ends each round (the pause, the final status) with the turn as GET shows it; none twice when a step runs
again after its save failed or its message came twice."""

from __future__ import annotations

from typing import Any

from shared.errors import StateConflict
from shared.state import MemoryStateStore, TurnState
from shared.task_names import StepName
from shared.turn_events import MemoryTurnEventLog, TurnEvent
from shared.turn_view import to_turn, turn_json
from tests.unit.fakes import (
    TURN_ID,
    FakeLlm,
    answer,
    calls,
    catalog_with_counted_tool,
    drive,
    envelope,
    make_context,
    record_turn,
    with_store,
)  # fmt: skip
from workers.context import StepContext
from workers.driver import run_step

_CLIENT_TOOL = {"type": "function", "name": "open_file", "parameters": {"type": "object", "properties": {}}}


def _events(ctx: StepContext) -> list[TurnEvent]:
    assert isinstance(ctx.events, MemoryTurnEventLog)
    return ctx.events.events(TURN_ID)


def _shown(ctx: StepContext) -> dict[str, Any]:
    record = ctx.turns.get(TURN_ID)
    assert record is not None
    return turn_json(to_turn(record))


def _committed_trace(ctx: StepContext) -> list[dict[str, Any]]:
    record = ctx.turns.get(TURN_ID)
    assert record is not None
    return record.trace


def test_a_completed_turn_sends_every_trace_record_once_in_order_then_turn_completed() -> None:
    ctx = make_context(
        FakeLlm(calls(("call_1", "counted_tool", {"key": "events"})), answer("done")),
        catalog=catalog_with_counted_tool(),
    )
    drive(ctx, record_turn(ctx))

    events = _events(ctx)
    assert [e.event for e in events[:-1]] == ["trace"] * (len(events) - 1)
    assert [e.data for e in events[:-1]] == _committed_trace(ctx)
    assert (events[-1].event, events[-1].data) == ("turn.completed", _shown(ctx))
    kinds = [e.data["kind"] for e in events[:-1]]
    assert kinds[0] == "turn_start" and "tool_execution" in kinds and "llm_call" in kinds
    assert all(e.round == 0 for e in events)


def test_a_paused_turn_ends_its_round_with_the_pending_calls_and_the_next_round_ends_completed() -> None:
    ctx = make_context(FakeLlm(calls(("call_9", "open_file", {"path": "a"})), answer("read it")))
    drive(ctx, record_turn(ctx, tools=[_CLIENT_TOOL]))

    pause = _events(ctx)[-1]
    assert (pause.event, pause.round, pause.data) == ("turn.requires_client_tools", 0, _shown(ctx))
    assert [call["call_id"] for call in pause.data["pending_tool_calls"]] == ["call_9"]

    # When the client's results arrive (as the gateway records them) and the turn re-enters
    round_ = ctx.turns.accept_tool_results(
        TURN_ID, results=[{"call_id": "call_9", "output": "text"}], now=ctx.clock(), deadline_at=ctx.deadline()
    )
    assert round_ == 1
    state = ctx.states.load(TURN_ID)
    assert state is not None
    drive(ctx, envelope(StepName.REQUEST_HANDLER, round=state.round + 1))

    events = _events(ctx)
    later = events[events.index(pause) + 1 :]
    assert (later[-1].event, later[-1].round, later[-1].data) == ("turn.completed", 1, _shown(ctx))
    assert [e.data for e in events if e.event == "trace"] == _committed_trace(ctx)


class _RefusesSavesOnce(MemoryStateStore):
    """A store whose first save of a step in ``refuse`` is refused, as when another writer saved first."""

    def __init__(self, events: MemoryTurnEventLog, refuse: set[str]) -> None:
        super().__init__(events)
        self.refuse = refuse
        self.step = ""

    def save(self, state: TurnState, **kwargs: Any) -> None:
        if self.step in self.refuse:
            self.refuse.discard(self.step)
            raise StateConflict("someone else saved first")
        super().save(state, **kwargs)


def test_a_step_that_runs_again_after_its_save_was_refused_sends_its_events_once() -> None:
    base = make_context(FakeLlm(answer("first"), answer("second")))
    assert isinstance(base.events, MemoryTurnEventLog)
    store = _RefusesSavesOnce(base.events, {StepName.LLM_CALL.value, StepName.PERSIST.value})
    ctx = with_store(base, store)
    dispatch = run_step(ctx, record_turn(ctx))
    while dispatch is not None:
        store.step = dispatch.envelope.step.value
        dispatch = run_step(ctx, dispatch.envelope)

    events = _events(ctx)
    assert not store.refuse  # both refusals happened
    assert [e.data for e in events if e.event == "trace"] == _committed_trace(ctx)
    assert [e.event for e in events if e.event != "trace"] == ["turn.completed"]
    assert events[-1].data == _shown(ctx) and events[-1].data["output_text"] == "second"


def test_a_message_delivered_twice_sends_nothing_the_second_time() -> None:
    ctx = make_context(FakeLlm(answer("x")))
    env = record_turn(ctx)
    first = run_step(ctx, env)
    sent = len(_events(ctx))

    run_step(ctx, env)

    assert first is not None and sent > 0 and len(_events(ctx)) == sent
