"""``/openai/v1/batches``: OpenAI's Batch API over Aptix batches (``OpenAIBatchService``).

Create (validating the input file, then running it or failing it), retrieve, cancel and list, in
OpenAI's shapes. Left out of ``/openapi.json``, as the rest of the face.
"""

from __future__ import annotations

import functools
from typing import Annotated, Any

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.openai.errors import OPENAI_PREFIX, invalid

__all__ = ["router"]

router = APIRouter(prefix=OPENAI_PREFIX + "/batches", route_class=AuthenticatedRoute, include_in_schema=False)

_IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]


@router.post("")
async def create_batch(
    request: Request, caller: Caller, gateway: Gateway, idempotency_key: _IdempotencyKey = None
) -> JSONResponse:
    """Create a batch on an uploaded input file: ``in_progress`` once every line is a queued turn, or ``failed``."""
    body = await _json(request)
    create = functools.partial(
        gateway.openai_batch_service.create, body, org_id=caller.org_id, user_id=caller.user_id,
        idempotency_key=idempotency_key,
    )  # fmt: skip
    return JSONResponse(await run_in_threadpool(create))


@router.get("")
async def list_batches(
    caller: Caller,
    gateway: Gateway,
    after: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> JSONResponse:
    """The caller's batches, newest first, with cursor pagination."""
    page = functools.partial(gateway.openai_batch_service.page, org_id=caller.org_id, after=after, limit=limit)
    return JSONResponse(await run_in_threadpool(page))


@router.get("/{batch_id}")
async def retrieve_batch(batch_id: str, caller: Caller, gateway: Gateway) -> JSONResponse:
    """The batch as it stands."""
    return JSONResponse(await run_in_threadpool(gateway.openai_batch_service.get, batch_id, org_id=caller.org_id))


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Cancel the batch (``cancelling``, then ``cancelled`` once its running requests ended)."""
    cancel = functools.partial(gateway.openai_batch_service.cancel, batch_id, org_id=caller.org_id)
    return JSONResponse(await run_in_threadpool(cancel))


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}", ()) from exc
