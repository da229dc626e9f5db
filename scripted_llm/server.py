"""The scripted model's HTTP app: a Responses API endpoint plus a journal of what it received."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from scripted_llm.script import ScriptedAnswer, ScriptState, error_body
from scripted_llm.streaming import SSE_MEDIA_TYPE, encode_event

__all__ = ["create_app"]

logger = logging.getLogger(__name__)


class _Journal:
    """The last request bodies received, newest last, each with its sequence number and arrival time
    (``at``: Unix time, taken as the body has been read, before any scripted latency)."""

    def __init__(self, size: int) -> None:
        self._entries: deque[tuple[int, float, Any]] = deque(maxlen=size)
        self._seq = 0

    def record(self, body: Any) -> int:
        self._seq += 1
        self._entries.append((self._seq, time.time(), body))
        return self._seq

    def select(self, contains: str | None) -> list[dict[str, Any]]:
        return [
            {"seq": seq, "at": at, "body": body}
            for seq, at, body in self._entries
            if contains is None or contains in json.dumps(body, ensure_ascii=False)
        ]

    def clear(self) -> None:
        self._entries.clear()


def create_app(*, latency_ms: float = 0.0, journal_size: int = 2000) -> FastAPI:
    """Build the scripted Responses API server.

    Args:
        latency_ms: latency added to every ``/responses`` answer (``asyncio.sleep``, so concurrent
            requests overlap).
        journal_size: how many request bodies the journal keeps.

    Returns:
        The app: ``POST /v1/responses`` (and ``/responses``), ``GET``/``DELETE /__scripted/requests``
        and ``GET /__scripted/healthz``.
    """
    app = FastAPI(title="Aptix scripted LLM", docs_url=None, redoc_url=None, openapi_url=None)
    logging.getLogger("uvicorn.error").addFilter(_not_a_cut)  # a cut on purpose is no server error to log
    journal = _Journal(journal_size)
    script = ScriptState()
    base_delay_s = max(latency_ms, 0.0) / 1000.0

    async def create_response(request: Request) -> Response:
        raw = await request.body()
        try:
            body: Any = json.loads(raw)
        except ValueError:
            journal.record(raw.decode("utf-8", errors="replace"))
            return JSONResponse(error_body(400, "We could not parse the JSON body of your request."), 400)
        seq = journal.record(body)
        answer = script.answer(body, seq=seq)
        delay_s = base_delay_s + answer.delay_s
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        logger.debug("scripted answer %d to request %d", answer.status_code, seq)
        if answer.events is not None:
            return StreamingResponse(_sent(answer), answer.status_code, media_type=SSE_MEDIA_TYPE)
        return JSONResponse(answer.body, answer.status_code, headers=answer.headers)

    app.add_api_route("/v1/responses", create_response, methods=["POST"])
    app.add_api_route("/responses", create_response, methods=["POST"])

    @app.get("/__scripted/requests")
    async def list_requests(contains: str | None = None) -> dict[str, Any]:
        return {"requests": journal.select(contains)}

    @app.delete("/__scripted/requests")
    async def clear_requests() -> dict[str, Any]:
        journal.clear()
        return {"ok": True}

    @app.get("/__scripted/healthz")
    async def healthz() -> dict[str, Any]:
        return {"ok": True}

    return app


class _Cut(Exception):
    """Raised inside a streamed answer to end its connection without the stream's end (``[[cut:N]]``)."""


async def _sent(answer: ScriptedAnswer) -> AsyncIterator[bytes]:
    """The answer's stream events as SSE bytes, paced by ``[[drip:MS]]``; a cut answer ends by raising."""
    assert answer.events is not None
    for number, event in enumerate(answer.events):
        if number and answer.event_delay_s > 0:
            await asyncio.sleep(answer.event_delay_s)
        yield encode_event(event)
    if answer.cut:
        # The server then closes the connection without the final chunk: the client sees a cut
        # connection, not a stream that ended cleanly.
        raise _Cut("scripted cut")


def _not_a_cut(record: logging.LogRecord) -> bool:
    """False for uvicorn's "Exception in ASGI application" record of a ``[[cut:N]]`` (added once: same function)."""
    exc = record.exc_info[1] if record.exc_info else None
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return not isinstance(exc, _Cut)
