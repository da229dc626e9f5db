"""The chaos suite's check of a response stream joined from pieces: exactly 0..n, terminal, whole."""

from __future__ import annotations

from typing import Any

from api_gateway.openai.stream_events import stream_events
from tests.chaos.responses_load import joined_stream_problems
from tests.support.responses_renderings import CALLS, TEXT, completed

EVENTS: list[dict[str, Any]] = stream_events(completed(TEXT, CALLS))


def test_a_whole_stream_has_no_problem() -> None:
    assert joined_stream_problems(EVENTS) == []


def test_a_repeated_event_is_a_problem_named_once() -> None:
    (problem,) = joined_stream_problems([*EVENTS[:5], *EVENTS[4:]])

    assert problem.startswith("sequence numbers not 0..n: repeated at position 5")


def test_a_missing_event_is_a_gap() -> None:
    (problem,) = joined_stream_problems([*EVENTS[:5], *EVENTS[6:]])

    assert problem.startswith("sequence numbers not 0..n: gap at position 5")


def test_a_stream_without_its_terminal_event_is_a_problem() -> None:
    assert joined_stream_problems(EVENTS[:-1]) == ["no terminal event (the last one read: response.output_item.done)"]
    assert joined_stream_problems([]) == ["no terminal event (the last one read: nothing)"]


def test_deltas_that_do_not_join_to_the_text_are_a_problem() -> None:
    # Given a stream whose sequence is whole but one text delta differs
    index = next(i for i, event in enumerate(EVENTS) if event["type"] == "response.output_text.delta")
    changed = [*EVENTS[:index], {**EVENTS[index], "delta": "X"}, *EVENTS[index + 1 :]]

    # Then the protocol check says so
    (problem,) = joined_stream_problems(changed)
    assert "the deltas join to" in problem
