"""``/v1/sessions`` and ``/v1/modes``: a session with its mode history and turns; the catalog."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from shared.models.session import Session

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["sessions"], route_class=AuthenticatedRoute)


@router.get("/sessions/{session_id}", response_model=Session, response_model_by_alias=True)
async def get_session(session_id: str, caller: Caller, gateway: Gateway) -> Session:
    """The session: its mode, mode history and turns."""
    return await run_in_threadpool(gateway.session_service.get, session_id, org_id=caller.org_id)


@router.get("/modes")
async def list_modes(_caller: Caller, gateway: Gateway) -> dict[str, list[dict[str, object]]]:
    """The mode catalog."""
    return {
        "modes": [
            {"name": mode.name, "description": mode.description, "tools": list(mode.server_tool_names)}
            for mode in gateway.catalog.modes
        ]
    }
