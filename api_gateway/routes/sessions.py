"""``/v1/sessions`` and ``/v1/modes``: a session with its mode history and turns; the catalog."""

from __future__ import annotations

from fastapi import APIRouter
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.errors import ApiError
from api_gateway.ids import is_session_id
from api_gateway.state import GatewayState
from shared.models.session import ModeHistoryEntry, Session, SessionTurnSummary
from shared.models.turn import TurnStatus

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["sessions"], route_class=AuthenticatedRoute)


@router.get("/sessions/{session_id}", response_model=Session, response_model_by_alias=True)
async def get_session(session_id: str, caller: Caller, gateway: Gateway) -> Session:
    """The session: its mode, mode history and turns."""
    return await run_in_threadpool(_load_session, gateway, session_id, caller.org_id)


@router.get("/modes")
async def list_modes(_caller: Caller, gateway: Gateway) -> dict[str, list[dict[str, object]]]:
    """The mode catalog."""
    return {
        "modes": [
            {"name": mode.name, "description": mode.description, "tools": list(mode.server_tool_names)}
            for mode in gateway.catalog.modes
        ]
    }


def _load_session(gateway: GatewayState, session_id: str, org_id: str) -> Session:
    row = gateway.sessions.get(session_id, org_id=org_id) if is_session_id(session_id) else None
    if row is None:
        raise ApiError(404, "session_not_found", f"session {session_id!r} does not exist")
    history = gateway.sessions.mode_history(session_id)
    turns = gateway.turns.for_session(session_id)
    return Session(
        session_id=row.session_id,
        mode=row.mode,
        created_at=row.created_at,
        updated_at=row.updated_at,
        mode_history=[
            ModeHistoryEntry(
                from_mode=h.from_mode, to_mode=h.to_mode, at=h.at, reason=h.reason, user_id=h.user_id, turn_id=h.turn_id
            )
            for h in history
        ],
        turns=[SessionTurnSummary(turn_id=t.turn_id, status=TurnStatus(t.status), created_at=t.created_at) for t in turns],
    )
