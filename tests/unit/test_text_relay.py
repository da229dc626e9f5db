"""The model's text while it is generated: TextRelay's appends, batching and withdrawals, and the llm_call
step relaying a streaming turn's text to its event log (and nothing for a turn that does not stream)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import redis

from shared.errors import LlmError
from shared.turn_events import MemoryTurnEventLog, TurnEvent
from tests.unit.fakes import TURN_ID, FakeLlm, answer, calls, drive, make_context, record_turn
from workers.context import StepContext
from workers.llm.types import LlmResponse
from workers.text_relay import TextRelay


def visible_text(events: list[TurnEvent]) -> str:
    """The text a client shows: the deltas joined, the last N dropped at each ``output_text.reset``."""
    kept: list[str] = []
    for event in events:
        if event.event == "output_text.delta":
            kept.append(event.data["delta"])
        elif event.event == "output_text.reset":
            del kept[len(kept) - event.data["deltas"] :]
    return "".join(kept)


def named(events: list[TurnEvent], *names: str) -> list[tuple[str, dict[str, Any]]]:
    return [(event.event, event.data) for event in events if event.event in names]


class Ticks:
    """A clock the test moves."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class FlakyLog(MemoryTurnEventLog):
    """Refuses appends while ``down``, as Redis does when it is unreachable."""

    def __init__(self) -> None:
        super().__init__()
        self.down = False

    def append(self, turn_id: str, event: str, data: Mapping[str, Any]) -> str:
        if self.down:
            raise redis.ConnectionError("Redis is down")
        return super().append(turn_id, event, data)


# -- TextRelay ------------------------------------------------------------------------------------


def test_each_delta_is_one_event_without_batching() -> None:
    log = MemoryTurnEventLog()
    relay = TextRelay(log, TURN_ID)

    for piece in ("Hel", "lo", " there"):
        relay(piece)
    relay.finish()

    assert named(log.events(TURN_ID), "output_text.delta") == [
        ("output_text.delta", {"delta": piece}) for piece in ("Hel", "lo", " there")
    ]


def test_deltas_arriving_sooner_than_the_flush_interval_go_out_together() -> None:
    log, ticks = MemoryTurnEventLog(), Ticks()
    relay = TextRelay(log, TURN_ID, flush_seconds=0.02, clock=ticks)

    relay("a")  # the first goes out at once
    ticks.now += 0.01
    relay("b")  # 10 ms after the last append: held
    ticks.now += 0.015
    relay("c")  # 25 ms after it: goes out with what was held
    relay("d")  # held again
    assert [e.data["delta"] for e in log.events(TURN_ID)] == ["a", "bc"]
    relay.flush()  # the text part ended
    ticks.now += 0.001
    relay("e")
    relay.finish()

    assert [e.data["delta"] for e in log.events(TURN_ID)] == ["a", "bc", "d", "e"]


def test_a_failed_call_withdraws_the_deltas_it_appended_and_drops_what_it_held() -> None:
    log, ticks = MemoryTurnEventLog(), Ticks()
    log.append(TURN_ID, "output_text.delta", {"delta": "earlier call. "})
    relay = TextRelay(log, TURN_ID, flush_seconds=0.01, clock=ticks)
    for piece in ("par", "tial"):
        relay(piece)
        ticks.now += 0.02
    relay(" held")
    relay(" too")

    relay.withdraw()

    assert named(log.events(TURN_ID), "output_text.reset") == [("output_text.reset", {"deltas": 3})]
    assert visible_text(log.events(TURN_ID)) == "earlier call. "


def test_a_failed_call_that_appended_nothing_appends_no_reset() -> None:
    log = MemoryTurnEventLog()

    TextRelay(log, TURN_ID).withdraw()

    assert log.events(TURN_ID) == []


def test_a_log_that_refuses_appends_gets_the_whole_text_once_it_takes_them_again() -> None:
    log = FlakyLog()
    relay = TextRelay(log, TURN_ID)
    relay("one")
    log.down = True
    relay(" two")  # refused: the relay stops relaying this call
    log.down = False
    relay(" three")

    relay.finish()

    assert [(e.event, e.data) for e in log.events(TURN_ID)] == [
        ("output_text.delta", {"delta": "one"}),
        ("output_text.reset", {"deltas": 1}),
        ("output_text.delta", {"delta": "one two three"}),
    ]


def test_a_log_that_stays_down_does_not_fail_the_call() -> None:
    log = FlakyLog()
    relay = TextRelay(log, TURN_ID)
    log.down = True

    relay("text")
    relay.finish()
    relay.withdraw()

    assert log.events(TURN_ID) == []


# -- the llm_call step ----------------------------------------------------------------------------


class BreakingLlm(FakeLlm):
    """Streams ``partial`` and then raises ``error`` on the first streamed call; answers normally after."""

    def __init__(self, partial: str, error: Exception, *answers: LlmResponse) -> None:
        super().__init__(*answers)
        self.partial, self.error = partial, error

    def stream(
        self,
        request: dict[str, Any],
        on_text: Callable[[str], None],
        *,
        on_text_done: Callable[[], None] | None = None,
    ) -> LlmResponse:
        if self.partial:
            on_text(self.partial)
            if on_text_done is not None:
                on_text_done()
            self.partial = ""
            self.streamed += 1
            raise self.error
        return super().stream(request, on_text, on_text_done=on_text_done)


def _events(ctx: StepContext) -> list[TurnEvent]:
    assert isinstance(ctx.events, MemoryTurnEventLog)
    return ctx.events.events(TURN_ID)


def test_a_streaming_turn_relays_the_text_before_the_llm_call_record() -> None:
    llm = FakeLlm(answer("The answer is 42."))
    ctx = make_context(llm, llm_stream_flush_ms=0)

    drive(ctx, record_turn(ctx, stream=True))

    events = _events(ctx)
    assert llm.streamed == 1
    assert [e.data["delta"] for e in events if e.event == "output_text.delta"] == ["The", " answer", " is", " 42."]
    last_delta = max(n for n, e in enumerate(events) if e.event == "output_text.delta")
    call_record = next(n for n, e in enumerate(events) if e.event == "trace" and e.data["kind"] == "llm_call")
    assert last_delta < call_record
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.output_text == visible_text(events) == "The answer is 42."


def test_a_streaming_turn_sends_the_first_delta_at_once_and_the_held_ones_when_the_text_part_ends() -> None:
    ctx = make_context(FakeLlm(answer("The answer is 42.")), llm_stream_flush_ms=60_000)

    drive(ctx, record_turn(ctx, stream=True))

    deltas = [data["delta"] for _, data in named(_events(ctx), "output_text.delta")]
    assert deltas == ["The", " answer is 42."]  # the first at once, the rest when the text part ended


def test_a_turn_that_does_not_stream_calls_the_model_whole_and_relays_nothing() -> None:
    llm = FakeLlm(answer("The answer is 42."))
    ctx = make_context(llm)

    drive(ctx, record_turn(ctx))

    assert llm.streamed == 0
    assert named(_events(ctx), "output_text.delta", "output_text.reset") == []


def test_a_call_that_fails_mid_stream_withdraws_its_text_and_the_retry_streams_the_answer() -> None:
    # Given a model whose first streamed call breaks after some text, then answers
    failure = LlmError("LLM stream broke after 5 event(s) (ProtocolError)", status_code=0, retryable=True)
    llm = BreakingLlm("A broken", failure, answer("The real answer."))
    ctx = make_context(llm)

    # When the turn runs (the driver sends the step again after its back-off)
    drive(ctx, record_turn(ctx, "q", stream=True, tools=None))

    # Then the broken call's text was withdrawn before the retry's text, which is the answer
    events = _events(ctx)
    relayed = named(events, "output_text.delta", "output_text.reset")
    assert relayed[:2] == [("output_text.delta", {"delta": "A broken"}), ("output_text.reset", {"deltas": 1})]
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.output_text == visible_text(events) == "The real answer."
    assert [e.data["kind"] for e in events if e.event == "trace" and e.data["kind"].startswith("llm")] == [
        "llm_error",
        "llm_call",
    ]


def test_a_call_that_fails_for_good_mid_stream_leaves_no_text() -> None:
    failure = LlmError("LLM response failed (invalid_prompt): no", code="invalid_prompt", retryable=False)
    ctx = make_context(BreakingLlm("Some text", failure))

    drive(ctx, record_turn(ctx, stream=True))

    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.error is not None and record.error["code"] == "llm_error"
    assert visible_text(_events(ctx)) == ""


def test_a_tool_calling_turn_relays_only_the_text_the_model_wrote() -> None:
    llm = FakeLlm(calls(("call_1", "agent_change_mode", {"mode": "general", "reason": "x"})), answer("Done."))
    ctx = make_context(llm)

    drive(ctx, record_turn(ctx, stream=True))

    assert llm.streamed == 2
    assert visible_text(_events(ctx)) == "Done."
