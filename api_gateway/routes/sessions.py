"""``/v1/sessions`` and ``/v1/modes``: a session with its mode history and turns; the catalog."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway, SessionId
from api_gateway.openapi import error_responses
from shared.models.mode import ModeInfo, ModeList
from shared.models.session import Session

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["sessions"], route_class=AuthenticatedRoute)


@router.get(
    "/sessions/{session_id}",
    response_model=Session,
    response_model_by_alias=True,
    operation_id="getSession",
    summary="Read a session",
    response_description="The session: its mode, mode history and turns.",
    responses=error_responses(
        401, 503, specific={404: "`session_not_found`: no such session in the caller's organisation."}
    ),
)
async def get_session(session_id: SessionId, caller: Caller, gateway: Gateway) -> Session:
    """The session: its mode, mode history and turns."""
    return await run_in_threadpool(gateway.session_service.get, session_id, org_id=caller.org_id)


@router.get(
    "/modes",
    response_model=ModeList,
    operation_id="listModes",
    summary="List the modes",
    response_description="The mode catalog.",
    responses=error_responses(401),
)
async def list_modes(_caller: Caller, gateway: Gateway) -> ModeList:
    """The mode catalog: each mode with its server tools."""
    return ModeList(
        modes=[
            ModeInfo(name=mode.name, description=mode.description, tools=list(mode.server_tool_names))
            for mode in gateway.catalog.modes
        ]
    )
