"""ResponseStream: the events of one streamed Responses API call, read into the same LlmResponse.

A streamed call (``"stream": true``) answers 200 with ``text/event-stream``: ``response.created``,
item and content events, and one terminal event. This module reads those events as they arrive:
each ``response.output_text.delta`` goes to a callback at once, and the result is built from the
terminal ``response.completed`` event's ``response`` by :func:`~workers.llm.parsing.parse_response`,
the parser of the non-streaming call, so a streamed call records exactly what the same call without
streaming would. Where a server leaves that response's ``output`` empty, the items of the
``response.output_item.done`` events stand in for it.

Failures take the paths of the non-streaming call:

- ``response.failed`` and ``response.incomplete`` carry a response that :func:`parse_response`
  refuses, as it refuses the same body in a 200;
- an ``error`` event (the documented shape, ``code``/``message`` at its top level, or the recorded
  one, nested under ``error``) is a failed generation (:func:`~workers.llm.parsing.failed_error`):
  retryable for ``server_error`` and ``rate_limit_exceeded``;
- a body that ends before a terminal event is a transport failure (``status_code`` 0, retryable);
- an event whose data is not JSON is an unusable body (not retryable), like a 200 that is not JSON.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

from shared.errors import LlmError
from workers.llm.parsing import failed_error, parse_response
from workers.llm.sse import SseDecoder
from workers.llm.types import LlmResponse

__all__ = ["ResponseStream", "TextSink"]

logger = logging.getLogger(__name__)

TextSink = Callable[[str], None]
"""Called with each ``response.output_text.delta``'s text, as it arrives."""


class ResponseStream:
    """Reads one streamed response: feed it the body's bytes, then ask for :meth:`result`."""

    def __init__(self, on_text: TextSink, *, on_text_done: Callable[[], None] | None = None) -> None:
        """Start reading a stream.

        Args:
            on_text: called with each text delta, in order, before the next event is read.
            on_text_done: called at each ``response.output_text.done`` (a text part is complete).
        """
        self._on_text = on_text
        self._on_text_done = on_text_done
        self._decoder = SseDecoder()
        self._items: dict[int, dict[str, Any]] = {}
        self._result: LlmResponse | None = None
        self.events = 0
        """How many events were read so far."""

    @property
    def finished(self) -> bool:
        """Whether the terminal ``response.completed`` was read (later bytes are ignored)."""
        return self._result is not None

    def feed(self, chunk: bytes) -> None:
        """Read the events a chunk of the body completes.

        Args:
            chunk: the next bytes of the body.

        Raises:
            LlmError: the stream reported a failure, or an event is not JSON.
        """
        for sse in self._decoder.feed(chunk):
            if self._result is not None:
                return
            if sse.data == "[DONE]":  # Chat Completions' end marker; some compatible servers send it here too
                continue
            try:
                data = json.loads(sse.data)
            except ValueError as exc:
                raise LlmError(f"LLM stream event {self.events} is not JSON", status_code=200) from exc
            self.events += 1
            if isinstance(data, dict):
                self._event(data)

    def result(self) -> LlmResponse:
        """The parsed response, once the body has ended.

        Returns:
            What :func:`parse_response` makes of the terminal ``response.completed`` event's response.

        Raises:
            LlmError: the body ended before its terminal event (retryable, ``status_code`` 0).
        """
        if self._result is None:
            where = " inside an event" if self._decoder.partial else ""
            raise LlmError(
                f"LLM stream ended{where} before its response.completed event (after {self.events} event(s))",
                status_code=0,
                retryable=True,
            )
        return self._result

    def _event(self, data: dict[str, Any]) -> None:
        kind = data.get("type")
        if kind == "response.output_text.delta":
            delta = data.get("delta")
            if isinstance(delta, str) and delta:
                self._on_text(delta)
        elif kind == "response.output_text.done":
            if self._on_text_done is not None:
                self._on_text_done()
        elif kind == "response.output_item.done":
            index, item = data.get("output_index"), data.get("item")
            if isinstance(index, int) and isinstance(item, dict):
                self._items[index] = item
        elif kind == "error":
            nested = data.get("error")
            raise failed_error(nested if isinstance(nested, dict) else data)
        elif kind == "response.completed":
            response = self._response(data)
            if not response.get("output") and self._items:
                logger.debug("response.completed has no output; using the %d streamed item(s)", len(self._items))
                response = {**response, "output": [self._items[index] for index in sorted(self._items)]}
            self._result = parse_response(response)
        elif kind in ("response.failed", "response.incomplete"):
            # The status the event names decides, whatever the body says; parse_response raises for both.
            parse_response({**self._response(data), "status": kind.removeprefix("response.")})

    def _response(self, data: dict[str, Any]) -> dict[str, Any]:
        response = data.get("response")
        if not isinstance(response, dict):
            raise LlmError(f"LLM stream's {data.get('type')} event carries no response object", status_code=200)
        return response
