"""EventStreamResponse: a ``text/event-stream`` answer that gives its stream place back however it ends.

Both kinds of stream the gateway serves (a turn's events, ``api_gateway.services.event_stream``, and a
response's OpenAI events, ``api_gateway.openai.streams``) count the streams a process runs; each stream
is one of these responses, whose ``on_end`` runs once it is over, even if it never started.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

__all__ = ["EventStreamResponse"]


class EventStreamResponse(StreamingResponse):
    """A ``text/event-stream`` response that calls ``on_end`` once it is over, even if it never started."""

    def __init__(self, frames: AsyncIterator[bytes], *, headers: dict[str, str], on_end: Callable[[], None]) -> None:
        super().__init__(frames, media_type="text/event-stream", headers=headers)
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_end()
