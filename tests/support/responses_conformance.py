"""What Aptix sends to and reads from a Responses API server, checked against the ``openai`` package's types.

This is the project's own conformance check, so it runs wherever the test extras are installed;
the shared ``validate.py`` of the real-traffic fixtures (``tests.responses_fixtures``) checks the same
bodies again when ``APTIX_FIXTURES_DIR`` is set. A request body is walked strictly over the SDK's
``ResponseCreateParamsNonStreaming`` TypedDict: union members are picked by their ``type``
discriminator, a key the SDK does not declare is an error (the API answers 400 "Unknown
parameter"), a required key must be there, and no lax coercion is accepted ("1" for an int). Then
the protocol rules real traffic taught us: ``model`` is set, ``function_call.arguments`` is a JSON
string, and every ``function_call_output`` follows the ``function_call`` it answers. A request with
``"stream": true`` is walked over ``ResponseCreateParamsStreaming`` instead. A response body must
validate as the SDK's ``Response`` model.

A streamed answer (a ``text/event-stream`` body) is split into its events; each event's data must
validate as the SDK's ``ResponseStreamEvent`` (the union is discriminated on ``type``), and the
stream must keep the protocol recorded streams keep: ``event:`` names the data's ``type``,
``sequence_number`` counts 0, 1, 2, ..., ``response.created`` comes first and one terminal event
last, the text and argument deltas join to their ``.done`` values, and a terminal response is a
valid ``Response`` whose items are the ``output_item.done`` items.
"""

from __future__ import annotations

import collections.abc
import json
import types
import typing
from functools import cache
from typing import Any, NotRequired, Required, get_args, get_origin

from openai.types.responses import Response, ResponseStreamEvent
from openai.types.responses.response_create_params import (
    ResponseCreateParamsNonStreaming,
    ResponseCreateParamsStreaming,
)
from pydantic import TypeAdapter, ValidationError
from typing_extensions import ReadOnly, get_type_hints, is_typeddict

__all__ = ["request_problems", "response_problems", "stream_events", "stream_problems"]

_WRAPPERS = {Required, NotRequired, ReadOnly, typing.Annotated}
_LISTS = {list, collections.abc.Iterable, collections.abc.Sequence}


def request_problems(body: dict[str, Any]) -> list[str]:
    """Every way ``body`` (a ``POST /responses`` body) breaks the SDK's types or the protocol."""
    params = ResponseCreateParamsStreaming if body.get("stream") is True else ResponseCreateParamsNonStreaming
    problems = _walk(body, params, "")
    if not body.get("model"):
        problems.append("model: missing (the API requires it)")
    if not body.get("previous_response_id") and not body.get("conversation"):
        problems += _call_pairing(body.get("input"))
    return problems


def response_problems(body: dict[str, Any]) -> list[str]:
    """Every way ``body`` fails to validate as the SDK's ``Response`` model.

    Usage details that the installed SDK marks required but real responses of 2025-2026 omit
    (``validate.py --lenient``) are not counted.
    """
    try:
        Response.model_validate(body)
    except ValidationError as exc:
        located = ((".".join(map(str, error["loc"])), error) for error in exc.errors())
        return [
            f"{where}: {error['msg']}"
            for where, error in located
            if not (error["type"] == "missing" and where in _LENIENT_MISSING)
        ]
    return []


def stream_events(body: bytes) -> list[tuple[str | None, dict[str, Any]]]:
    """The ``(event: name, data)`` pairs of an event-stream body (events end with a blank line; LF line ends)."""
    events = []
    for block in body.decode("utf-8").split("\n\n"):
        lines = [line for line in block.split("\n") if line and not line.startswith(":")]
        if not lines:
            continue
        name = next((line.removeprefix("event:").strip() for line in lines if line.startswith("event:")), None)
        data = "\n".join(line.removeprefix("data:").removeprefix(" ") for line in lines if line.startswith("data:"))
        events.append((name, json.loads(data)))
    return events


def stream_problems(body: bytes) -> list[str]:
    """Every way an event-stream body breaks the SDK's ``ResponseStreamEvent`` types or the stream protocol."""
    events = stream_events(body)
    if not events:
        return ["the stream holds no event"]
    problems = []
    for number, (name, data) in enumerate(events):
        where = f"events.{number} ({data.get('type')})"
        try:
            _STREAM_EVENT.validate_python(data)
        except ValidationError as exc:
            problems += [f"{where}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        if name != data.get("type"):
            problems.append(f"{where}: event: {name!r} is not its type")
        if data.get("sequence_number") != number:
            problems.append(f"{where}: sequence_number {data.get('sequence_number')!r}, expected {number}")
    return problems + _stream_protocol([data for _, data in events])


_STREAM_EVENT: TypeAdapter[ResponseStreamEvent] = TypeAdapter(ResponseStreamEvent)
_TERMINAL = ("response.completed", "response.failed", "response.incomplete")


def _stream_protocol(events: list[dict[str, Any]]) -> list[str]:
    problems = []
    if events[0].get("type") != "response.created":
        problems.append(f"events.0: the stream starts with {events[0].get('type')!r}, not response.created")
    terminal = events[-1]
    if terminal.get("type") not in _TERMINAL:
        problems.append(f"the stream ends with {terminal.get('type')!r}, not a terminal event")
    texts: dict[tuple[Any, Any], str] = {}
    arguments: dict[Any, str] = {}
    done_items: dict[int, Any] = {}
    for number, event in enumerate(events):
        kind = event.get("type")
        if kind in _TERMINAL and number != len(events) - 1:
            problems.append(f"events.{number}: {kind} before the end of the stream")
        if kind == "response.output_text.delta":
            key = (event.get("item_id"), event.get("content_index"))
            texts[key] = texts.get(key, "") + event["delta"]
        elif kind == "response.output_text.done":
            key = (event.get("item_id"), event.get("content_index"))
            if texts.get(key, "") != event.get("text"):
                problems.append(
                    f"events.{number}: the deltas join to {texts.get(key, '')!r}, not {event.get('text')!r}"
                )
        elif kind == "response.function_call_arguments.delta":
            arguments[event.get("item_id")] = arguments.get(event.get("item_id"), "") + event["delta"]
        elif kind == "response.function_call_arguments.done":
            joined = arguments.get(event.get("item_id"), "")
            if joined != event.get("arguments"):
                problems.append(f"events.{number}: the deltas join to {joined!r}, not {event.get('arguments')!r}")
        elif kind == "response.output_item.done":
            done_items[event["output_index"]] = event.get("item")
    final = terminal.get("response")
    if terminal.get("type") == "response.completed" and isinstance(final, dict):
        problems += [f"the final response: {problem}" for problem in response_problems(final)]
        if [done_items[index] for index in sorted(done_items)] != final.get("output"):
            problems.append("the output_item.done items are not the final response's output")
    return problems


_LENIENT_MISSING = frozenset(
    {"usage.input_tokens_details", "usage.input_tokens_details.cache_write_tokens", "usage.output_tokens_details"}
)


def _walk(value: Any, annotation: Any, path: str) -> list[str]:
    tp = _unwrap(annotation)
    origin = get_origin(tp)
    if tp is Any or tp is object:
        return []
    if origin is typing.Union or origin is types.UnionType:
        return _union(value, get_args(tp), path)
    if origin is typing.Literal:
        return [] if value in get_args(tp) else [f"{path}: {value!r} is not one of {get_args(tp)}"]
    if is_typeddict(tp):
        return _typed_dict(value, tp, path)
    if origin in _LISTS or getattr(origin, "__name__", "") == "SequenceNotStr":
        if not isinstance(value, list):
            return [f"{path}: expected a list, got {type(value).__name__}"]
        (item_type,) = get_args(tp) or (Any,)
        return [problem for index, item in enumerate(value) for problem in _walk(item, item_type, _join(path, index))]
    if origin in (dict, collections.abc.Mapping):
        if not isinstance(value, dict):
            return [f"{path}: expected an object, got {type(value).__name__}"]
        _, value_type = get_args(tp) or (str, Any)
        return [problem for key, item in value.items() for problem in _walk(item, value_type, _join(path, key))]
    return _scalar(value, tp, path)


def _union(value: Any, members: tuple[Any, ...], path: str) -> list[str]:
    candidates = [_unwrap(member) for member in members]
    # Judge a value by the members of its own shape (a list by the list members), so that the
    # problems reported are those of the member the sender meant.
    shaped = [member for member in candidates if _shape(member) == _shape_of(value)]
    candidates = shaped or candidates
    if isinstance(value, dict) and "type" in value:
        tagged = [m for m in candidates if is_typeddict(m) and value["type"] in _type_tags(m)]
        if tagged:
            candidates = tagged
    failures = []
    for member in candidates:
        problems = _walk(value, member, path)
        if not problems:
            return []
        failures.append(problems)
    best = min(failures, key=len) if failures else [f"{path}: no union member"]
    return best


def _typed_dict(value: Any, tp: Any, path: str) -> list[str]:
    if not isinstance(value, dict):
        return [f"{path}: expected an object ({tp.__name__}), got {type(value).__name__}"]
    hints = _hints(tp)
    problems = [f"{_join(path, key)}: not a field of {tp.__name__} (the API refuses unknown parameters)"
                for key in value if key not in hints]  # fmt: skip
    problems += [f"{_join(path, key)}: missing (required by {tp.__name__})" for key in tp.__required_keys__
                 if key not in value]  # fmt: skip
    for key, item in value.items():
        if key in hints:
            problems += _walk(item, hints[key], _join(path, key))
    return problems


def _scalar(value: Any, tp: Any, path: str) -> list[str]:
    if tp is type(None):
        ok = value is None
    elif tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif tp is str:
        ok = isinstance(value, str)
    else:
        return []  # a type the SDK leaves open (a model reference, an object): not ours to judge
    return [] if ok else [f"{path}: {value!r} is not a {getattr(tp, '__name__', tp)}"]


def _shape(tp: Any) -> str:
    origin = get_origin(tp)
    if is_typeddict(tp) or origin in (dict, collections.abc.Mapping):
        return "object"
    if origin in _LISTS or getattr(origin, "__name__", "") == "SequenceNotStr":
        return "list"
    return "scalar"


def _shape_of(value: Any) -> str:
    return "object" if isinstance(value, dict) else "list" if isinstance(value, list) else "scalar"


@cache
def _hints(tp: Any) -> dict[str, Any]:
    """A TypedDict's field types, worked out once per type: ``get_type_hints`` evaluates every annotation
    each call, and the session's check of every model request (tens of thousands) called it per value,
    for two minutes and more."""
    return get_type_hints(tp, include_extras=True)


@cache
def _type_tags(tp: Any) -> tuple[Any, ...]:
    hint = _hints(tp).get("type")
    return get_args(_unwrap(hint)) if hint is not None and get_origin(_unwrap(hint)) is typing.Literal else ()


def _join(path: str, key: object) -> str:
    return f"{path}.{key}" if path else str(key)


def _unwrap(tp: Any) -> Any:
    while get_origin(tp) in _WRAPPERS:
        tp = get_args(tp)[0]
    return tp


def _call_pairing(items: Any) -> list[str]:
    if not isinstance(items, list):
        return []
    problems, calls = [], set()
    for index, item in enumerate(items):
        if not isinstance(item, dict):
            continue
        if item.get("type") == "function_call":
            calls.add(item.get("call_id"))
            try:
                json.loads(item.get("arguments", ""))
            except (TypeError, ValueError):
                problems.append(f"input.{index}.arguments: not a JSON string")
        elif item.get("type") == "function_call_output" and item.get("call_id") not in calls:
            problems.append(f"input.{index}: function_call_output {item.get('call_id')!r} answers no earlier call")
    return problems
