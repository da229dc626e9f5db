"""The scripted model's HTTP app: a Responses API endpoint plus a journal of what it received."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections import deque
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from scripted_llm.script import ScriptState, error_body

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
    journal = _Journal(journal_size)
    script = ScriptState()
    base_delay_s = max(latency_ms, 0.0) / 1000.0

    async def create_response(request: Request) -> JSONResponse:
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
