"""Reading a ``text/event-stream`` answer in tests: its events and its comment lines, as the SSE spec frames them."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

__all__ = ["SseEvent", "SseRead", "read_sse"]


@dataclass(frozen=True)
class SseEvent:
    """One dispatched event."""

    event_id: str | None
    event: str
    data: Any
    """The ``data:`` lines, joined and parsed as JSON."""


@dataclass
class SseRead:
    """What a stream sent: its events in order and how many comment lines came between them."""

    events: list[SseEvent] = field(default_factory=list)
    comments: list[str] = field(default_factory=list)


def iter_sse(response: httpx.Response) -> Iterator[SseEvent | str]:
    """The events (and comment lines, as str) of a streamed response, as they arrive."""
    event_id: str | None = None
    name = "message"
    data: list[str] = []
    for line in response.iter_lines():
        if line == "":
            if data:
                yield SseEvent(event_id, name, json.loads("\n".join(data)))
            event_id, name, data = None, "message", []
            continue
        if line.startswith(":"):
            yield line[1:].strip()
            continue
        key, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        if key == "id":
            event_id = value
        elif key == "event":
            name = value
        elif key == "data":
            data.append(value)
    assert not data, f"the stream ended inside an event: {data!r}"


def read_sse(response: httpx.Response, *, stop_after: int | None = None) -> SseRead:
    """Read ``response`` until it ends (or ``stop_after`` events arrived, then stop reading)."""
    read = SseRead()
    for item in iter_sse(response):
        if isinstance(item, str):
            read.comments.append(item)
            continue
        read.events.append(item)
        if stop_after is not None and len(read.events) >= stop_after:
            break
    return read
