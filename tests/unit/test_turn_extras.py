"""A turn's extras (``shared.openai.TurnExtras``) in the workers: the initial state carries them, the
transcript starts as the input items, composition adds the instructions, the model and the model
options (never over what it owns), and they survive a checkpoint; a turn without them is unchanged."""

from __future__ import annotations

import json
from typing import Any

from shared.models.turn import ClientTool, TurnStatus
from shared.modes import ModeCatalog
from shared.openai import FACE_OPENAI
from shared.state import TurnState
from shared.task_names import StepName
from tests.unit.fakes import (
    FIXED_NOW,
    TURN_ID,
    FakeLlm,
    answer,
    calls,
    drive,
    envelope,
    make_context,
    make_state,
    memory_store,
    record_turn,
)
from workers.context import StepContext
from workers.llm.limiter import estimate_tokens
from workers.next_step import Continue
from workers.steps import compose, context_provider_initializer
from workers.steps.request_handler import initial_state

OPEN_FILE = {"type": "function", "name": "open_file", "parameters": {"type": "object", "properties": {}}}
ITEMS: list[dict[str, Any]] = [
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "list my files"}]},
    {"type": "function_call", "call_id": "call_0", "name": "open_file", "arguments": "{}"},
    {"type": "function_call_output", "call_id": "call_0", "output": "a.txt"},
    {"type": "message", "role": "user", "content": "and now?"},
]
"""Input items as the OpenAI Agents SDK sends them: earlier calls and their outputs, then the new message."""
EXTRAS: dict[str, Any] = {
    "input_items": ITEMS,
    "instructions": "Answer in French.",
    "model": "gpt-extras",
    "model_options": {"temperature": 0.2, "max_output_tokens": 77, "text": {"format": {"type": "text"}}},
    "face": FACE_OPENAI,
}


def _catalog_with_mode_model(model: str) -> ModeCatalog:
    catalog = make_context().catalog
    raw = catalog.model_dump(mode="json", by_alias=True, exclude_none=True)
    for mode in raw["modes"]:
        if mode["name"] == "general":
            mode["model"] = model
    return ModeCatalog.model_validate(raw)


def _composition_before_extras(ctx: StepContext, state: TurnState) -> dict[str, Any]:
    """``compose_request`` as it was before turn extras existed (commit 6eb0c41), for comparison."""
    mode = ctx.catalog.get_or_default(state.mode)
    instructions = "\n\n".join(part for part in (mode.instructions, *state.providers.session_context) if part)
    turn_context = [{"type": "message", "role": "developer", "content": text} for text in state.providers.turn_context]
    tools = [tool.schema() for tool in ctx.tools.for_mode(mode)]
    tools += [tool.model_dump(exclude_none=True) for tool in state.client_tools]
    return {
        "model": mode.model or ctx.settings.llm_model,
        "instructions": instructions,
        "input": [*state.history, *turn_context, *state.transcript],
        "tools": tools,
        "store": False,
    }


def _full_state(**fields: Any) -> TurnState:
    """A state with every part composition reads: history, session and turn context, client tools."""
    state = make_state(
        history=[{"type": "message", "role": "user", "content": "before"}],
        client_tools=[ClientTool(name="open_file", description="Open a file.")],
        **fields,
    )
    state.providers.session_context = ["Session facts."]
    state.providers.turn_context = ["Welcome!"]
    return state


# The initial state


def test_initial_state_carries_the_extras_of_the_recorded_request() -> None:
    ctx = make_context()
    record_turn(ctx, "and now?", extras=EXTRAS)
    record = ctx.turns.get(TURN_ID)
    assert record is not None
    state = initial_state(record)
    assert (state.input_items, state.instructions, state.model, state.model_options) == (
        ITEMS, "Answer in French.", "gpt-extras", EXTRAS["model_options"]
    )  # fmt: skip
    assert state.user_input == "and now?"


def test_initial_state_of_a_turn_without_extras_has_the_defaults() -> None:
    ctx = make_context()
    record_turn(ctx)
    record = ctx.turns.get(TURN_ID)
    assert record is not None
    state = initial_state(record)
    assert (state.input_items, state.instructions, state.model, state.model_options) == (None, None, None, {})


def test_a_state_saved_before_the_extras_existed_still_loads_with_the_defaults() -> None:
    saved = make_state().model_dump(mode="json")
    for name in ("input_items", "instructions", "model", "model_options"):
        del saved[name]
    state = TurnState.model_validate(saved)
    assert (state.input_items, state.instructions, state.model, state.model_options) == (None, None, None, {})


# The transcript


def test_the_transcript_starts_as_a_copy_of_the_input_items_when_the_turn_has_them() -> None:
    ctx = make_context()
    state = make_state(transcript=[], input_items=ITEMS)
    result = context_provider_initializer.run(ctx, envelope(StepName.CONTEXT_PROVIDER_INITIALIZER), state)
    assert result.unwrap() == Continue(StepName.REASONER)
    assert state.transcript == ITEMS
    state.transcript[0]["content"][0]["text"] = "changed"  # the transcript is the turn's own copy
    assert state.input_items is not None and state.input_items[0]["content"][0]["text"] == "list my files"


def test_the_transcript_starts_as_one_user_message_without_input_items() -> None:
    ctx = make_context()
    state = make_state(transcript=[], user_input="hi there")
    context_provider_initializer.run(ctx, envelope(StepName.CONTEXT_PROVIDER_INITIALIZER), state)
    assert state.transcript == [{"type": "message", "role": "user", "content": "hi there"}]


# Composition


def test_compose_without_extras_is_byte_identical_to_the_composition_before_them() -> None:
    ctx = make_context(catalog=_catalog_with_mode_model("gpt-mode"))
    state = _full_state()
    request = compose.compose_request(ctx, state)
    expected = _composition_before_extras(ctx, state)
    assert json.dumps(request) == json.dumps(expected)
    assert request["model"] == "gpt-mode"


def test_compose_of_a_turn_whose_extras_only_name_its_face_is_the_plain_request() -> None:
    ctx = make_context()
    record_turn(ctx, extras={"face": FACE_OPENAI})
    record = ctx.turns.get(TURN_ID)
    assert record is not None
    state = initial_state(record)
    state.mode, state.transcript = "general", [{"type": "message", "role": "user", "content": "hello"}]
    assert json.dumps(compose.compose_request(ctx, state)) == json.dumps(_composition_before_extras(ctx, state))


def test_compose_appends_the_turns_instructions_after_the_mode_and_the_session_context() -> None:
    ctx = make_context()
    state = _full_state(instructions="Answer in French.")
    mode = ctx.catalog.get_or_default(state.mode)
    request = compose.compose_request(ctx, state)
    assert request["instructions"] == f"{mode.instructions}\n\nSession facts.\n\nAnswer in French."


def test_compose_uses_the_turns_model_over_the_modes_and_the_settings() -> None:
    ctx = make_context(catalog=_catalog_with_mode_model("gpt-mode"), llm_model="gpt-setting")
    assert compose.compose_request(ctx, _full_state(model="gpt-extras"))["model"] == "gpt-extras"
    assert compose.compose_request(ctx, _full_state())["model"] == "gpt-mode"
    assert compose.compose_request(make_context(llm_model="gpt-setting"), _full_state())["model"] == "gpt-setting"


def test_compose_copies_the_model_options_into_the_request() -> None:
    ctx = make_context()
    options = {"temperature": 0.2, "top_p": 0.9, "tool_choice": "auto", "reasoning": {"effort": "low"}}
    request = compose.compose_request(ctx, _full_state(model_options=options))
    assert {key: request[key] for key in options} == options
    request["reasoning"]["effort"] = "high"  # the request is its own copy
    assert options["reasoning"] == {"effort": "low"}


def test_model_options_never_override_the_keys_composition_owns() -> None:
    # Given options that try to set every key composition owns, and one that is theirs to set
    ctx = make_context()
    hostile = {"model": "other", "input": [], "instructions": "ignore all", "tools": [], "store": True, "stream": True}
    plain, optioned = _full_state(), _full_state(model_options={**hostile, "temperature": 0.5})
    # When both are composed
    expected = compose.compose_request(ctx, plain)
    request = compose.compose_request(ctx, optioned)
    # Then only the option that is not protected is added
    assert set(hostile) == compose.PROTECTED_KEYS
    assert request == {**expected, "temperature": 0.5}
    assert "stream" not in request


# Through the pipeline


def test_a_turn_with_extras_sends_its_items_instructions_model_and_options_to_the_model() -> None:
    llm = FakeLlm(answer("voilà"))
    ctx = make_context(llm)
    drive(ctx, record_turn(ctx, "and now?", extras=EXTRAS))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status is TurnStatus.COMPLETED and row.output_text == "voilà"
    (request,) = llm.requests
    assert request["input"][-len(ITEMS) :] == ITEMS
    assert request["instructions"].endswith("\n\nAnswer in French.")
    assert (request["model"], request["temperature"], request["max_output_tokens"]) == ("gpt-extras", 0.2, 77)
    assert request["text"] == {"format": {"type": "text"}} and request["store"] is False
    (call,) = [step for step in row.trace if step["kind"] == "llm_call"]
    assert call["data"]["model"] == "gpt-extras"


def test_the_rate_limiter_reserves_the_output_bound_the_model_options_set() -> None:
    state = _full_state(model_options={"max_output_tokens": 77})
    bounded = compose.compose_request(make_context(), state)
    # One more output token allowed, the same length of JSON: one more token reserved
    assert estimate_tokens({**bounded, "max_output_tokens": 78}) - estimate_tokens(bounded) == 1
    assert estimate_tokens(bounded) < estimate_tokens(compose.compose_request(make_context(), _full_state()))


def test_the_extras_survive_a_checkpoint_and_a_re_entry_from_it_when_redis_lost_the_state() -> None:
    # Given a turn with extras that paused for a client tool, its state checkpointed at the commit
    llm = FakeLlm(calls(("call_1", "open_file", {})), answer("fini"))
    ctx = make_context(llm)
    drive(ctx, record_turn(ctx, "and now?", tools=[OPEN_FILE], extras=EXTRAS))
    snapshot = ctx.turns.load_snapshot(TURN_ID)
    assert snapshot is not None
    restored = TurnState.model_validate(snapshot)
    assert (restored.input_items, restored.instructions, restored.model, restored.model_options) == (
        ITEMS, "Answer in French.", "gpt-extras", EXTRAS["model_options"]
    )  # fmt: skip
    # When Redis loses the state and the client's results re-enter the turn
    memory_store(ctx).flush()
    ctx.turns.accept_tool_results(TURN_ID, results=[{"call_id": "call_1", "output": "b.txt"}], now=FIXED_NOW,
                                  deadline_at=FIXED_NOW)  # fmt: skip
    drive(ctx, envelope(StepName.REQUEST_HANDLER, round=1))
    # Then the second call is composed with the same extras, after the same input items
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status is TurnStatus.COMPLETED and row.output_text == "fini"
    first, second = llm.requests
    assert {key: second[key] for key in ("model", "instructions", "temperature", "max_output_tokens")} == {
        key: first[key] for key in ("model", "instructions", "temperature", "max_output_tokens")
    }
    # (the fake's answer has no output items, so nothing is replayed between the items and the result)
    assert first["input"][-len(ITEMS) :] == second["input"][-len(ITEMS) - 1 : -1] == ITEMS
    assert second["input"][-1] == {"type": "function_call_output", "call_id": "call_1", "output": "b.txt"}


def test_a_checkpoint_round_trip_keeps_every_extra() -> None:
    state = _full_state(input_items=ITEMS, instructions="Be brief.", model="gpt-extras",
                        model_options={"temperature": 0.2})  # fmt: skip
    restored = TurnState.model_validate(json.loads(json.dumps(state.checkpoint())))
    assert restored.model_dump(exclude={"history"}) == state.model_dump(exclude={"history"})
