"""The OpenAI event stream of a response: a pure function of the response as ``render_response`` renders it."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from typing import Any

import pytest
from openai.types.responses import ResponseStreamEvent
from pydantic import TypeAdapter

from api_gateway.openai.stream_events import MAX_PIECES, opening_response, pieces, sse_frame, stream_events
from shared.models.turn import TurnStatus
from shared.openai import conversation_id
from tests.responses_fixtures import fixtures_dir, validate_stream_bodies
from tests.support.responses_conformance import stream_events as parse_stream
from tests.support.responses_conformance import stream_problems
from tests.support.responses_renderings import CALLS, SESSION, START, TEXT, TURN, completed, incomplete, rendered

_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)


def body(events: list[dict[str, Any]]) -> bytes:
    return b"".join(sse_frame(event) for event in events)


def assert_valid(events: list[dict[str, Any]]) -> None:
    """Each event validates as the SDK's ``ResponseStreamEvent``, and the body keeps the stream protocol."""
    for event in events:
        _EVENT.validate_python(event)
    assert stream_problems(body(events)) == []


def types(events: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in events]


def joined(events: list[dict[str, Any]], kind: str, **where: Any) -> str:
    return "".join(e["delta"] for e in events if e["type"] == kind and all(e[k] == v for k, v in where.items()))


def test_stream_events_of_an_unfinished_response_are_the_two_opening_events() -> None:
    for status in (TurnStatus.QUEUED, TurnStatus.RUNNING):
        events = stream_events(rendered(status))
        assert types(events) == ["response.created", "response.in_progress"]
        assert [e["sequence_number"] for e in events] == [0, 1]
        assert [e["response"]["status"] for e in events] == ["in_progress", "in_progress"]
        for event in events:
            _EVENT.validate_python(event)


def test_stream_events_open_queued_when_the_response_runs_in_the_background() -> None:
    events = stream_events(rendered(TurnStatus.QUEUED, background=True))
    assert [e["response"]["status"] for e in events] == ["queued", "in_progress"]


def test_stream_events_open_the_same_whether_built_while_running_or_once_finished() -> None:
    # Given: renderings of the same response at every stage of its round, and one after the turn moved on
    stages = [
        rendered(TurnStatus.QUEUED), rendered(TurnStatus.RUNNING), completed(TEXT), completed(TEXT, CALLS),
        completed(None, CALLS), rendered(TurnStatus.FAILED, error={"code": "llm_error", "message": "upstream"}),
        rendered(TurnStatus.CANCELLED),
        rendered(TurnStatus.RUNNING, round=1, mode="other", paused_rounds=[
            {"round": 0, "at": START.isoformat(), "output_text": "x", "pending_tool_calls": CALLS,
             "usage": {"input_tokens": 3, "output_tokens": 1}, "mode": "general", "mode_changes": []}]),
    ]  # fmt: skip
    # When: each one's stream is built
    openings = [stream_events(stage)[:2] for stage in stages]
    # Then: the opening events are the same, and carry nothing that moves
    assert all(opening == openings[0] for opening in openings)
    created = openings[0][0]["response"]
    assert (created["output"], created["usage"], created["error"], created["completed_at"]) == ([], None, None, None)
    assert created["aptix"] == {"turn_id": TURN, "session_id": SESSION, "round": 0}
    assert created["model"] == "aptix-default" and created["conversation"] == {"id": conversation_id(SESSION)}


def test_stream_events_of_a_completed_response_stream_its_text_in_pieces_that_join() -> None:
    response = completed(TEXT)
    events = stream_events(response)
    assert types(events)[:4] == [
        "response.created", "response.in_progress", "response.output_item.added", "response.content_part.added",
    ]  # fmt: skip
    assert types(events)[-5:] == [
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done", "response.completed",
    ]  # fmt: skip
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert joined(events, "response.output_text.delta") == TEXT
    assert events[-1]["response"] == response
    added = events[2]["item"]
    assert (added["status"], added["content"], added["id"]) == ("in_progress", [], response["output"][0]["id"])
    assert events[-2]["item"] == response["output"][0]
    assert_valid(events)


def test_stream_events_of_a_paused_round_stream_its_text_then_each_parallel_call() -> None:
    response = completed(TEXT, CALLS)
    events = stream_events(response)
    added = [e for e in events if e["type"] == "response.output_item.added"]
    assert [(e["output_index"], e["item"]["type"]) for e in added] == [
        (0, "message"), (1, "function_call"), (2, "function_call"),
    ]  # fmt: skip
    assert [e["item"]["arguments"] for e in added[1:]] == ["", ""]
    assert [e["item"]["status"] for e in added] == ["in_progress"] * 3
    for index, call in enumerate(CALLS, start=1):
        item_id = response["output"][index]["id"]
        assert joined(events, "response.function_call_arguments.delta", item_id=item_id) == call["arguments"]
    # the calls follow one another, as OpenAI streams them: call 1 is done before call 2 is added
    done_at = [n for n, e in enumerate(events) if e["type"] == "response.output_item.done"]
    added_at = [n for n, e in enumerate(events) if e["type"] == "response.output_item.added"]
    assert done_at[0] < added_at[1] and done_at[1] < added_at[2]
    assert events[-1]["type"] == "response.completed" and events[-1]["response"] == response
    assert_valid(events)


def test_stream_events_of_calls_without_text_hold_no_message() -> None:
    events = stream_events(completed("", CALLS))
    assert [e["item"]["type"] for e in events if e["type"] == "response.output_item.added"] == ["function_call"] * 2
    assert not any(e["type"].startswith("response.output_text") for e in events)
    assert_valid(events)


def test_stream_events_of_a_completed_response_without_output_are_opening_and_completed() -> None:
    events = stream_events(completed(None))
    assert types(events) == ["response.created", "response.in_progress", "response.completed"]
    assert_valid(events)


def test_stream_events_of_an_empty_text_part_have_no_delta_and_an_empty_done() -> None:
    response = completed("x")
    response["output"][0]["content"][0]["text"] = ""
    events = stream_events(response)
    assert "response.output_text.delta" not in types(events)
    assert [e["text"] for e in events if e["type"] == "response.output_text.done"] == [""]
    assert_valid(events)


def test_stream_events_of_a_failed_response_end_with_response_failed() -> None:
    response = rendered(TurnStatus.FAILED, error={"code": "llm_rate_limited", "message": "try later"})
    events = stream_events(response)
    assert types(events) == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1]["response"] == response
    assert events[-1]["response"]["error"]["code"] == "rate_limit_exceeded"
    assert_valid(events)


def test_stream_events_of_a_cancelled_response_end_with_response_failed_carrying_its_status() -> None:
    response = rendered(TurnStatus.CANCELLED)
    events = stream_events(response)
    assert types(events) == ["response.created", "response.in_progress", "response.failed"]
    assert events[-1]["response"]["status"] == "cancelled"
    assert_valid(events)


def test_stream_events_of_an_incomplete_response_stream_its_text_and_end_with_response_incomplete() -> None:
    response = incomplete("Cut short")
    events = stream_events(response)
    assert types(events)[-1] == "response.incomplete"
    assert joined(events, "response.output_text.delta") == "Cut short"
    assert_valid(events)


def test_stream_events_are_the_same_for_the_same_response() -> None:
    response = completed(TEXT, CALLS)
    assert stream_events(response) == stream_events(copy.deepcopy(response))
    assert body(stream_events(response)) == body(stream_events(json.loads(json.dumps(response))))


def test_stream_events_do_not_change_the_response_they_are_built_from() -> None:
    response = completed(TEXT, CALLS)
    before = copy.deepcopy(response)
    stream_events(response)
    assert response == before


def test_opening_response_keeps_the_request_echo_and_drops_what_moves() -> None:
    response = completed(TEXT)
    opening = opening_response(response, queued=True)
    assert opening["status"] == "queued"
    for name in ("id", "object", "created_at", "model", "instructions", "tools", "tool_choice", "metadata",
                 "previous_response_id", "conversation", "background", "store"):  # fmt: skip
        assert opening[name] == response[name]
    assert "mode" not in opening["aptix"]


@pytest.mark.parametrize(
    "text",
    [
        TEXT,
        "one",
        "   ",
        "\n",
        "trailing space ",
        " leading",
        "日本語のテキストは空白がない",
        "a\u0301 e\u0301",
        "🥔 " * 500,
    ],
)
def test_pieces_join_to_the_text_in_at_most_max_pieces(text: str) -> None:
    cut = pieces(text)
    assert "".join(cut) == text
    assert 1 <= len(cut) <= MAX_PIECES
    assert all(cut)
    assert pieces(text) == cut


def test_pieces_cut_after_words_keeping_the_blank_before_the_next() -> None:
    assert pieces("The capital of  Potato\nCity.") == ["The", " capital", " of", "  Potato", "\nCity."]


def test_pieces_of_arguments_are_runs_of_characters_that_join() -> None:
    arguments = json.dumps({"path": "/tmp/ü" * 100, "lines": list(range(50))})
    cut = pieces(arguments, words=False)
    assert "".join(cut) == arguments and len(cut) <= MAX_PIECES
    assert pieces('{"a":1}', words=False) == ['{"a":1}']
    assert pieces("", words=False) == [] and pieces("") == []


def test_long_text_streams_in_at_most_max_pieces_deltas() -> None:
    text = " ".join(f"word{n}" for n in range(1000))
    events = stream_events(completed(text))
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert len(deltas) <= MAX_PIECES
    assert "".join(e["delta"] for e in deltas) == text


def test_sse_frame_is_one_event_line_and_one_data_line() -> None:
    event = stream_events(completed("line one\nline two — ü 🥔"))[4]
    frame = sse_frame(event)
    assert frame.startswith(b"event: response.output_text.delta\ndata: {") and frame.endswith(b"}\n\n")
    assert frame.count(b"\n") == 3
    assert parse_stream(frame) == [("response.output_text.delta", event)]


def test_streams_pass_the_fixtures_validate_py() -> None:
    # validate.py (when APTIX_FIXTURES_DIR is set) over every finished shape at once, one subprocess
    bodies = [
        body(stream_events(completed(TEXT))),
        body(stream_events(completed(TEXT, CALLS))),
        body(stream_events(completed(None, CALLS))),
        body(stream_events(completed(None))),
        body(stream_events(rendered(TurnStatus.FAILED, error={"code": "llm_error", "message": "upstream"}))),
        body(stream_events(incomplete("Cut"))),
    ]  # fmt: skip
    validate_stream_bodies(bodies)


def test_a_cancelled_stream_breaks_only_validate_py_status_rule() -> None:
    # OpenAI has no stream event for a cancelled response; response.failed carries status "cancelled",
    # which validate.py's stream check reports as its one error (the SDK's own types accept it).
    directory = fixtures_dir()
    done = subprocess.run(
        [sys.executable, str(directory / "validate.py"), "--kind", "stream", "-"],
        input=body(stream_events(rendered(TurnStatus.CANCELLED))).decode(),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    errors = [line for line in done.stdout.splitlines() if line.strip().startswith("error")]
    assert len(errors) == 1 and "response.failed carries status 'cancelled'" in errors[0], done.stdout
