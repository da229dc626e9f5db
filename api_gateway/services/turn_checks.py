"""Turn request checks: checking a TurnRequest against the catalog and the caller's sessions.

Shared by single turns and batches, so both refuse the same inputs the same way.
"""

from __future__ import annotations

import hashlib
import json

from api_gateway.ids import is_session_id, new_session_id, new_turn_id
from api_gateway.services.errors import InvalidRequest, NotFound
from shared.db.sessions import SessionRepository
from shared.db.turns import NewTurn
from shared.models.turn import TurnRequest
from shared.modes import ModeCatalog
from shared.openai.extras import EXTRAS_KEY, TurnExtras

__all__ = ["check_turn_request"]


def check_turn_request(
    body: TurnRequest,
    *,
    catalog: ModeCatalog,
    sessions: SessionRepository,
    org_id: str,
    user_id: str,
    turn_id: str | None = None,
    extras: TurnExtras | None = None,
    loc: tuple[str | int, ...] = ("body",),
    batch_id: str | None = None,
    batch_index: int | None = None,
) -> NewTurn:
    """Check ``body`` and describe the turn to record.

    Args:
        body: the request.
        catalog: the mode catalog (server tool names, modes).
        sessions: the session repository, to find the session a follow-up turn continues.
        org_id: the caller's organisation; a session of another organisation does not exist.
        user_id: the caller.
        turn_id: the turn's id, when one was reserved for it; else a fresh one.
        extras: options beyond ``TurnRequest`` (the OpenAI face's), recorded with the request.
        loc: where ``body`` sits in the HTTP body, for the ``loc`` of error details.
        batch_id: the batch the turn belongs to, if any.
        batch_index: the turn's index in its batch.

    Returns:
        The turn to record, with its turn id and, for a new session, a fresh session id.

    Raises:
        InvalidRequest: a client tool named like a server tool, or an unknown mode on a new session.
        NotFound: ``session_not_found``, for a session the caller cannot see.
    """
    clashes = sorted(catalog.server_tool_names.intersection(tool.name for tool in body.tools))
    if clashes:
        raise InvalidRequest(
            f"client tools may not take the name of a server tool: {', '.join(clashes)}",
            [{"loc": [*loc, "tools"], "msg": "name taken by a server tool", "type": "value_error"}],
        )
    new_session = body.session_id is None
    if body.session_id is None:
        if body.mode is not None and catalog.get(body.mode) is None:
            raise InvalidRequest(
                f"unknown mode {body.mode!r}; the catalog has: {', '.join(catalog.mode_names)}",
                [{"loc": [*loc, "mode"], "msg": "unknown mode", "type": "value_error"}],
            )
        session_id = new_session_id()
    else:
        session_id = body.session_id
        if not is_session_id(session_id) or sessions.get(session_id, org_id=org_id) is None:
            raise NotFound("session_not_found", f"session {session_id!r} does not exist")
    # A turn that streams records ``stream: true`` (the workers read it); how the answer is delivered is
    # not part of what the idempotency key stands for. Without a webhook_url or stream the request (and
    # its idempotency hash) stays what it was before those fields existed.
    excluded = {"idempotency_key", "stream", *(() if body.webhook_url else ("webhook_url",))}
    request = body.model_dump(mode="json", exclude=excluded)
    if extras is not None:
        request[EXTRAS_KEY] = extras.model_dump(mode="json", exclude_defaults=True)
    request_hash = hashlib.sha256(json.dumps(request, sort_keys=True).encode()).hexdigest()
    if body.stream:
        request["stream"] = True
    return NewTurn(
        turn_id=turn_id or new_turn_id(),
        session_id=session_id,
        org_id=org_id,
        user_id=user_id,
        new_session=new_session,
        requested_mode=body.mode,
        request=request,
        request_hash=request_hash,
        idempotency_key=body.idempotency_key,
        batch_id=batch_id,
        batch_index=batch_index,
    )
