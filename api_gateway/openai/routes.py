"""``/openai/v1/responses``: OpenAI's Responses API over turns (create, retrieve, cancel, input items).

The routes speak HTTP and OpenAI's parameters; ``ResponseService`` does the work. They are left out
of ``/openapi.json``: their contract is OpenAI's own API reference (``docs/openai.md`` says what differs).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Header, Query, Request
from fastapi.responses import JSONResponse, Response
from starlette.concurrency import run_in_threadpool

from api_gateway.access_log import note_turn
from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.openai.errors import invalid
from shared.db.responses import ResponseRecord

__all__ = ["router"]

router = APIRouter(prefix="/openai/v1/responses", route_class=AuthenticatedRoute, include_in_schema=False)

_IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]
_Limit = Annotated[int, Query(ge=1, le=100)]


@router.post("")
async def create_response(
    request: Request, caller: Caller, gateway: Gateway, idempotency_key: _IdempotencyKey = None
) -> Response:
    """Create a response: sync (answers when it finished), ``background`` (at once) or ``stream`` (events)."""
    body = await _json(request)
    service = gateway.response_service
    record, create = await run_in_threadpool(
        service.create, body, org_id=caller.org_id, user_id=caller.user_id, idempotency_key=idempotency_key
    )
    turn = await run_in_threadpool(gateway.turn_service.require, record.turn_id, org_id=caller.org_id)
    note_turn(request, turn.turn_id, turn.session_id)
    if create.stream:
        return await _stream(gateway, record, org_id=caller.org_id, starting_after=None)
    if create.background:
        rendered = await run_in_threadpool(service.render, record, org_id=caller.org_id)
    else:
        rendered = await service.wait(record, org_id=caller.org_id, seconds=gateway.settings.openai_wait_seconds)
    return JSONResponse(rendered)


@router.get("/{response_id}")
async def get_response(
    response_id: str,
    caller: Caller,
    gateway: Gateway,
    stream: bool = False,
    starting_after: Annotated[int | None, Query(ge=0)] = None,
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
) -> Response:
    """The response as it stands; ``?stream=true`` (with ``starting_after``) replays and follows its events."""
    del include  # accepted and ignored: nothing Aptix records is hidden behind it
    record = await run_in_threadpool(gateway.response_service.get, response_id, org_id=caller.org_id)
    if stream:
        return await _stream(gateway, record, org_id=caller.org_id, starting_after=starting_after)
    if starting_after is not None:
        raise invalid("starting_after goes with stream=true", ("starting_after",))
    rendered = await run_in_threadpool(gateway.response_service.render, record, org_id=caller.org_id)
    return JSONResponse(rendered)


@router.post("/{response_id}/cancel")
async def cancel_response(response_id: str, caller: Caller, gateway: Gateway) -> JSONResponse:
    """Cancel an unfinished response (a second cancel, or a finished response, answers it as it is)."""
    rendered = await run_in_threadpool(gateway.response_service.cancel, response_id, org_id=caller.org_id)
    return JSONResponse(rendered)


@router.get("/{response_id}/input_items")
async def list_input_items(
    response_id: str,
    caller: Caller,
    gateway: Gateway,
    after: str | None = None,
    limit: _Limit = 20,
    order: Literal["asc", "desc"] = "desc",
    include: Annotated[list[str] | None, Query(alias="include[]")] = None,
) -> JSONResponse:
    """The items the response was given, in OpenAI's list shape with cursor pagination."""
    del include
    page = await run_in_threadpool(
        gateway.response_service.input_items,
        response_id,
        org_id=caller.org_id,
        after=after,
        limit=limit,
        ascending=order == "asc",
    )
    return JSONResponse(page)


async def _json(request: Request) -> Any:
    try:
        return await request.json()
    except (ValueError, UnicodeDecodeError) as exc:
        raise invalid(f"the request body is not valid JSON: {exc}", ()) from exc


async def _stream(gateway: Gateway, record: ResponseRecord, *, org_id: str, starting_after: int | None) -> Response:
    service = gateway.response_service

    async def load() -> dict[str, Any]:
        return await run_in_threadpool(service.render, record, org_id=org_id)

    return await gateway.response_streams.serve(load, turn_id=record.turn_id, starting_after=starting_after)
