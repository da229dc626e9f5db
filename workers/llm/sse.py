"""Server-sent events: an incremental decoder of a ``text/event-stream`` body, fed as bytes arrive.

It follows the WHATWG rules the ``openai`` package's ``SSEDecoder`` follows: lines end with
``\\r\\n``, ``\\n`` or ``\\r``; a blank line dispatches the event; ``data:`` lines are joined with
``\\n``; a line starting with ``:`` is a comment (a keep-alive); one space after the colon is dropped.
An event with no blank line after it is never dispatched (the stream was cut before it ended).
"""

from __future__ import annotations

import codecs
from dataclasses import dataclass

__all__ = ["SseDecoder", "SseEvent"]


@dataclass(frozen=True, slots=True)
class SseEvent:
    """One dispatched server-sent event."""

    event: str | None
    """The ``event:`` field, when the event had one."""
    data: str
    """The ``data:`` lines, joined with ``\\n``."""
    event_id: str | None = None
    """The ``id:`` field, when the event had one."""


class SseDecoder:
    """Turns chunks of an event-stream body into events; one decoder per response."""

    def __init__(self) -> None:
        self._text = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._after_cr = False
        self._event: str | None = None
        self._data: list[str] = []
        self._event_id: str | None = None

    def feed(self, chunk: bytes) -> list[SseEvent]:
        """Decode the next chunk of the body.

        Args:
            chunk: bytes as they arrived; an event, a line or a UTF-8 character may span chunks.

        Returns:
            The events this chunk completed, in order (often none or one).
        """
        text = self._pending + self._text.decode(chunk)
        if self._after_cr and text.startswith("\n"):
            text = text[1:]  # the "\n" of a "\r\n" split between two chunks
        self._after_cr = False
        events: list[SseEvent] = []
        start = 0
        while (end := _line_end(text, start)) is not None:
            dispatched = self._line(text[start:end])
            if dispatched is not None:
                events.append(dispatched)
            start = end + 1
            if text[end] == "\r":
                if start == len(text):
                    self._after_cr = True
                elif text[start] == "\n":
                    start += 1
        self._pending = text[start:]
        return events

    @property
    def partial(self) -> bool:
        """Whether bytes of an event that was never dispatched are held (the body ended inside an event)."""
        return bool(self._pending or self._data or self._event is not None)

    def _line(self, line: str) -> SseEvent | None:
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id" and "\0" not in value:
            self._event_id = value
        return None  # "retry" and unknown fields are ignored

    def _dispatch(self) -> SseEvent | None:
        data, event = self._data, self._event
        self._data, self._event = [], None
        if not data:
            return None
        return SseEvent(event=event, data="\n".join(data), event_id=self._event_id)


def _line_end(text: str, start: int) -> int | None:
    """The index of the ``\r`` or ``\n`` that ends the line starting at ``start``; None when it is not complete."""
    newline = text.find("\n", start)
    carriage = text.find("\r", start, newline if newline != -1 else len(text))
    if carriage != -1:
        return carriage
    return newline if newline != -1 else None
