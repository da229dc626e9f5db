"""Reading Server-Sent Events (``text/event-stream``) as the HTML standard frames them: ``ServerEvent``s.

The gateway's turn events (``GET /v1/turns/{id}/events``) carry ``id:``, ``event:`` and one ``data:``
line of JSON each; comment lines (``: keep-alive``) are skipped.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["ServerEvent", "parse_events"]


@dataclass(frozen=True, slots=True)
class ServerEvent:
    """One event of a stream."""

    event_id: str | None
    """Its ``id:`` (what a reconnection sends back as ``Last-Event-ID``)."""
    event: str
    """Its ``event:`` name (``message`` when it has none)."""
    data: Any
    """Its ``data:`` lines, joined, as JSON (the text itself when it is not JSON)."""


def parse_events(lines: Iterable[str]) -> Iterator[ServerEvent]:
    """The events of a stream's lines (without their line ends), each as soon as its blank line arrives.

    Args:
        lines: The stream, line by line.

    Yields:
        Each event that has data; an event cut off by the end of the stream is dropped, as a browser does.
    """
    event_id: str | None = None
    name = ""
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                yield ServerEvent(event_id, name or "message", _decode("\n".join(data)))
            event_id, name, data = None, "", []
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "id":
            event_id = value
        elif field == "event":
            name = value
        elif field == "data":
            data.append(value)


def _decode(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text
