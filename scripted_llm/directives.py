"""The directives a scripted-model request carries in its last user message, and how they are read.

- ``[[call:NAME {json args}]]`` calls NAME (several directives, several calls); once the input holds
  ``function_call_output`` items after the last user message, answers ``Tool results: NAME=OUTPUT; ...``.
- ``[[loop]]`` always calls ``get_current_time`` with ``{}``.
- ``[[fail:STATUS]]`` / ``[[fail:STATUS:N]]`` answers HTTP STATUS (only the first N times for N).
- ``[[sleep:MS]]`` adds latency; ``[[say:TEXT]]`` answers TEXT exactly.
- ``[[retryafter:S]]``: a scripted 429 carries ``Retry-After: S`` (else 0).
- otherwise the answer is ``Echo: <last user text>``.

With ``"stream": true`` the answer is a stream of events (:mod:`scripted_llm.streaming`), and:

- ``[[drip:MS]]`` waits MS between two events;
- ``[[cut:N]]`` / ``[[cut:N:TIMES]]`` ends the connection after N events, with no terminal event.

``[[midfail:CODE]]`` / ``[[midfail:CODE:TIMES]]`` fails the generation with error CODE:
a stream sends the answer's first output item, then an ``error`` event and ``response.failed``; without
streaming the answer is a 200 whose ``status`` is ``failed``.

A ``:N`` / ``:TIMES`` count applies the directive to only the first N requests carrying the same
text; without one it applies to every request.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

__all__ = ["Directives", "ScriptError", "parse_directives"]


@dataclass(frozen=True, slots=True)
class Directives:
    """The directives found in one user text."""

    calls: tuple[tuple[str, str], ...] = ()
    """(name, JSON arguments string) per ``[[call:...]]``, in order."""
    loop: bool = False
    fail_status: int | None = None
    fail_times: int | None = None
    """Fail only the first N requests carrying the same text; None fails every one."""
    sleep_ms: float = 0.0
    say: str | None = None
    drip_ms: float = 0.0
    """Pause between two stream events."""
    cut_after: int | None = None
    """End a stream's connection after this many events."""
    cut_times: int | None = None
    midfail_code: str | None = None
    """Fail the generation after its first output item, with this error code."""
    midfail_times: int | None = None
    retry_after: str = "0"
    """The ``Retry-After`` header of a scripted 429 (``[[retryafter:S]]``), in seconds."""


class ScriptError(ValueError):
    """The request is invalid or a directive cannot be read; answered as a 400."""


def parse_directives(text: str) -> Directives:
    """Read the ``[[...]]`` directives of a user text.

    Args:
        text: the last user text.

    Returns:
        The directives; unknown ``[[...]]`` groups are plain text.

    Raises:
        ScriptError: a known directive is malformed.
    """
    calls: list[tuple[str, str]] = []
    found: dict[str, Any] = {}
    position = 0
    while (start := text.find("[[", position)) != -1:
        head_end = start + 2
        while head_end < len(text) and (text[head_end].isalpha()):
            head_end += 1
        name = text[start + 2 : head_end]
        if name == "call" and text.startswith(":", head_end):
            call, position = _read_call(text, head_end + 1)
            calls.append(call)
            continue
        end = text.find("]]", head_end)
        if end == -1:
            break
        position = end + 2
        argument = text[head_end + 1 : end] if text.startswith(":", head_end) else None
        if name == "loop" and argument is None:
            found["loop"] = True
        elif name == "say" and argument is not None:
            found["say"] = argument
        elif name == "sleep" and argument is not None:
            found["sleep_ms"] = _number(argument, "sleep")
        elif name == "retryafter" and argument is not None:
            found["retry_after"] = f"{_number(argument, 'retryafter'):g}"
        elif name == "fail" and argument is not None:
            found.update(_read_fail(argument))
        elif name == "drip" and argument is not None:
            found["drip_ms"] = _number(argument, "drip")
        elif name == "cut" and argument is not None:
            after, times = _counted(argument, "cut")
            found.update(cut_after=int(_number(after, "cut")), cut_times=times)
        elif name == "midfail" and argument is not None:
            code, times = _counted(argument, "midfail")
            found.update(midfail_code=code, midfail_times=times)
    return Directives(calls=tuple(calls), **found)


def _read_call(text: str, start: int) -> tuple[tuple[str, str], int]:
    """Parse ``NAME {json}]]`` from ``start``; returns the call and the position after ``]]``."""
    end = start
    while end < len(text) and (text[end].isalnum() or text[end] in "_-."):
        end += 1
    name = text[start:end]
    if not name:
        raise ScriptError("[[call:...]] needs a function name")
    position = end
    while position < len(text) and text[position].isspace():
        position += 1
    arguments: object = {}
    if text.startswith("{", position):
        try:
            arguments, position = json.JSONDecoder().raw_decode(text, position)
        except ValueError as exc:
            raise ScriptError(f"[[call:{name} ...]] arguments are not valid JSON: {exc}") from exc
        while position < len(text) and text[position].isspace():
            position += 1
    if not text.startswith("]]", position):
        raise ScriptError(f"[[call:{name} ...]] is not closed by ']]'")
    return (name, json.dumps(arguments)), position + 2


def _read_fail(argument: str) -> dict[str, Any]:
    status_text, times = _counted(argument, "fail")
    status = int(_number(status_text, "fail"))
    if not 400 <= status <= 599:
        raise ScriptError(f"[[fail:{argument}]] needs a status from 400 to 599")
    return {"fail_status": status, "fail_times": times}


def _counted(argument: str, directive: str) -> tuple[str, int | None]:
    """``VALUE`` or ``VALUE:TIMES``: the value, and the count (None without one)."""
    value, _, times_text = argument.partition(":")
    if not value:
        raise ScriptError(f"[[{directive}:{argument}]] needs a value")
    return value, int(_number(times_text, directive)) if times_text else None


def _number(text: str, directive: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ScriptError(f"[[{directive}:{text}]] needs a number") from None
    if value < 0:
        raise ScriptError(f"[[{directive}:{text}]] needs a non-negative number")
    return value
