"""ResponseService: OpenAI's Responses over turns — create, resume, read, wait for and cancel a response.

A response is one round of a turn (``shared.openai.ids``). Creating one records a turn through
``TurnService`` (a new conversation, a follow-up in a session, or, with ``previous_response_id``
naming a round paused for function outputs, the re-entry of that same turn) and a
``ResponseRecord`` for what only the request knows. Everything below is the turn pipeline's:
admission, rate limits, recovery, events.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from api_gateway.openai.errors import invalid
from api_gateway.openai.idempotency import check_key, check_repeat
from api_gateway.openai.items import listed_items
from api_gateway.openai.requests import ResponseCreate, parse_create
from api_gateway.openai.turn_requests import turn_parts
from api_gateway.openai.view import TERMINAL_STATUSES, render_response, response_status
from api_gateway.services.errors import Conflict, InvalidRequest, NotFound
from api_gateway.services.turn_service import TurnService
from shared.db.records import TurnRecord
from shared.db.responses import ResponseRecord, ResponseRepository
from shared.db.sessions import SessionRepository
from shared.models.turn import ToolResult, ToolResultsRequest, TurnStatus
from shared.modes import ModeCatalog
from shared.openai import parse_response_id, response_id, session_of_conversation
from shared.settings import Settings

__all__ = ["ResponseService"]

logger = logging.getLogger(__name__)

_KEY_PREFIX = "openai:"
"""A response's ``Idempotency-Key`` is its turn's ``idempotency_key`` with this prefix."""
_MAX_KEY = 200


class ResponseService:
    """The Responses face of turns; built once per gateway."""

    def __init__(
        self,
        *,
        settings: Settings,
        turns: TurnService,
        responses: ResponseRepository,
        sessions: SessionRepository,
        catalog: ModeCatalog,
        clock: Callable[[], datetime],
    ) -> None:
        self._settings = settings
        self._turns = turns
        self._responses = responses
        self._sessions = sessions
        self._catalog = catalog
        self._clock = clock
        self.served_models = frozenset(
            {settings.llm_model, *(mode.model for mode in catalog.modes if mode.model), *catalog.models}
        )
        """The models a request may name (``model``): the deployment's default, the modes', the catalog's."""

    def create(
        self, body: object, *, org_id: str, user_id: str, idempotency_key: str | None
    ) -> tuple[ResponseRecord, ResponseCreate]:
        """Check a create request and record its response (and its turn, or the turn's re-entry).

        Args:
            body: the decoded JSON body.
            org_id: the caller's organisation.
            user_id: the caller.
            idempotency_key: the ``Idempotency-Key`` header, if any.

        Returns:
            The response's record (for a repeated key with the same body, the first one's) and the
            checked request.

        Raises:
            InvalidRequest: the body (400 naming the field), or function outputs that do not answer
                exactly the pending calls of ``previous_response_id``.
            NotFound: ``model_not_found``, ``previous_response_not_found``, ``conversation_not_found``.
            Conflict: ``idempotency_key_reused``; ``session_busy`` (the conversation has an unfinished turn);
                ``turn_not_awaiting_tool_results`` (a concurrent resume won).
            Unavailable: the broker or the state store refused; nothing was recorded.
        """
        request = parse_create(body)
        if idempotency_key is not None:
            check_key(idempotency_key, max_chars=_MAX_KEY)
            earlier = self._responses.by_idempotency_key(org_id, idempotency_key)
            if earlier is not None:
                check_repeat(earlier.request_hash, request.request_hash)
                return earlier, request
        self.check_model(request)
        if request.previous_response_id is not None:
            return self._continue(request, org_id=org_id, user_id=user_id, key=idempotency_key), request
        session_id = None
        if request.conversation is not None:
            session_id = session_of_conversation(request.conversation)
            if session_id is None or self._sessions.get(session_id, org_id=org_id) is None:
                raise NotFound(
                    "conversation_not_found",
                    f"conversation {request.conversation!r} does not exist",
                    [{"loc": ["body", "conversation"], "msg": "unknown conversation", "type": "value_error"}],
                )
        record = self._start(request, session_id=session_id, org_id=org_id, user_id=user_id, key=idempotency_key)
        return record, request

    def check_model(self, request: ResponseCreate) -> None:
        """Refuse a ``model`` the deployment does not serve.

        Raises:
            NotFound: ``model_not_found``.
        """
        if request.model is not None and request.model not in self.served_models:
            raise NotFound(
                "model_not_found",
                f"The model {request.model!r} does not exist here; this deployment serves: "
                + ", ".join(sorted(self.served_models)),
                [{"loc": ["body", "model"], "msg": "unknown model", "type": "value_error"}],
            )

    def model_for(self, request: ResponseCreate, *, mode: str | None) -> str:
        """The model a response of ``request`` runs with in ``mode``: the request's, the mode's, or the default."""
        return request.model or self._catalog.get_or_default(mode).model or self._settings.llm_model

    def get(self, response_id_: str, *, org_id: str) -> ResponseRecord:
        """The caller's response.

        Raises:
            NotFound: no response ``response_id_`` belongs to ``org_id``.
        """
        found = self._responses.get(response_id_, org_id=org_id) if parse_response_id(response_id_) else None
        if found is None:
            raise NotFound("not_found", f"response {response_id_!r} does not exist")
        return found

    def render(self, record: ResponseRecord, *, org_id: str) -> dict[str, Any]:
        """The ``Response`` JSON of ``record`` as its turn stands now."""
        return render_response(self._turns.get(record.turn_id, org_id=org_id), record)

    async def wait(self, record: ResponseRecord, *, org_id: str, seconds: float) -> dict[str, Any]:
        """Long-poll: the response once it finished, or as it stands after ``seconds``."""
        deadline = time.monotonic() + seconds
        delay = 0.02
        rendered = await run_in_threadpool(functools.partial(self.render, record, org_id=org_id))
        while rendered["status"] not in TERMINAL_STATUSES and time.monotonic() < deadline:
            await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 1.5, 0.25)
            rendered = await run_in_threadpool(functools.partial(self.render, record, org_id=org_id))
        return rendered

    def cancel(self, response_id_: str, *, org_id: str) -> dict[str, Any]:
        """Cancel an unfinished response (its turn); a finished one is returned as it is.

        Raises:
            NotFound: no such response of the caller's organisation.
        """
        record = self.get(response_id_, org_id=org_id)
        turn = self._turns.get(record.turn_id, org_id=org_id)
        if response_status(turn, record.round) not in TERMINAL_STATUSES:
            try:
                turn = self._turns.cancel(record.turn_id, org_id=org_id)
            except Conflict:
                turn = self._turns.get(record.turn_id, org_id=org_id)  # it finished meanwhile
        return render_response(turn, record)

    def input_items(
        self, response_id_: str, *, org_id: str, after: str | None, limit: int, ascending: bool
    ) -> dict[str, Any]:
        """``GET …/input_items``: the items the response was given, a page of the SDK's list shape.

        Raises:
            NotFound: no such response of the caller's organisation.
            InvalidRequest: ``after`` names no item of the response.
        """
        record = self.get(response_id_, org_id=org_id)
        items = listed_items(record.input_items, prefix=record.response_id.removeprefix("resp_"))
        if not ascending:
            items.reverse()
        start = 0
        if after is not None:
            ids = [item["id"] for item in items]
            if after not in ids:
                raise invalid(f"after {after!r} is not an item of this response", ("after",))
            start = ids.index(after) + 1
        page = items[start : start + limit]
        return {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": start + limit < len(items),
        }

    def _continue(self, request: ResponseCreate, *, org_id: str, user_id: str, key: str | None) -> ResponseRecord:
        """``previous_response_id``: resume its turn when it waits for these outputs, else a follow-up turn."""
        assert request.previous_response_id is not None
        previous = self._responses.get(request.previous_response_id, org_id=org_id)
        if previous is None:
            raise NotFound(
                "previous_response_not_found",
                f"Previous response with id {request.previous_response_id!r} not found.",
                [{"loc": ["body", "previous_response_id"], "msg": "unknown response", "type": "value_error"}],
            )
        turn = self._turns.get(previous.turn_id, org_id=org_id)
        outputs = [item for item in request.input_items if item["type"] == "function_call_output"]
        paused_now = TurnStatus(turn.status) is TurnStatus.REQUIRES_CLIENT_TOOLS and turn.round == previous.round
        if paused_now:
            return self._resume(request, previous, turn, org_id=org_id, key=key)
        if outputs:
            resumed = self._resumed_before(request, previous, turn)
            if resumed is not None:
                return resumed
            raise invalid(
                f"response {previous.response_id!r} is not waiting for function outputs (its turn is "
                f"{turn.status.value}): send a new message instead",
                ("input",),
            )
        return self._start(request, session_id=turn.session_id, org_id=org_id, user_id=user_id, key=key,
                           previous=previous.response_id)  # fmt: skip

    def _resume(
        self, request: ResponseCreate, previous: ResponseRecord, turn: TurnRecord, *, org_id: str, key: str | None
    ) -> ResponseRecord:
        results = self._checked_outputs(request, turn.pending_tool_calls, previous)
        resumed = self._turns.resume(turn.turn_id, ToolResultsRequest(tool_results=results), org_id=org_id)
        return self._record(request, resumed, round_=resumed.round, org_id=org_id, key=key,
                            previous=previous.response_id)  # fmt: skip

    def _resumed_before(
        self, request: ResponseCreate, previous: ResponseRecord, turn: TurnRecord
    ) -> ResponseRecord | None:
        """A retried resume (outputs answering exactly the calls of a round resumed already): the response of
        the round that resume started, written now if the gateway that resumed the turn stopped before."""
        paused = next((entry for entry in turn.paused_rounds if entry.get("round") == previous.round), None)
        if paused is None:
            return None
        try:
            self._checked_outputs(request, paused.get("pending_tool_calls") or [], previous)
        except InvalidRequest:
            return None
        earlier = self._responses.by_round(turn.turn_id, previous.round + 1)
        if earlier is not None:
            return earlier
        return self._record(request, turn, round_=previous.round + 1, org_id=turn.org_id, key=None,
                            previous=previous.response_id)  # fmt: skip

    @staticmethod
    def _checked_outputs(
        request: ResponseCreate, pending: list[dict[str, Any]], previous: ResponseRecord
    ) -> list[ToolResult]:
        """The outputs of ``request``, when they answer exactly the ``pending`` calls of ``previous``."""
        expected = sorted(str(call["call_id"]) for call in pending)
        others = [index for index, item in enumerate(request.input_items) if item["type"] != "function_call_output"]
        if others:
            raise invalid(
                f"response {previous.response_id!r} waits for function outputs for call ids {expected}: "
                "the input may hold only function_call_output items",
                ("input", others[0], "type"),
            )
        given = [str(item["call_id"]) for item in request.input_items]
        if sorted(given) != expected:
            missing = sorted(set(expected) - set(given))
            unknown = sorted(set(given) - set(expected))
            repeated = sorted({call_id for call_id in given if given.count(call_id) > 1})
            raise invalid(
                f"the function outputs must answer exactly the pending calls {expected} of response "
                f"{previous.response_id!r} (missing: {missing}, unknown: {unknown}, repeated: {repeated})",
                ("input",),
            )
        try:
            return [ToolResult(call_id=item["call_id"], output=item["output"]) for item in request.input_items]
        except ValidationError as exc:
            raise invalid(f"a function output is not valid: {exc.errors()[0]['msg']}", ("input",)) from exc

    def _start(
        self,
        request: ResponseCreate,
        *,
        session_id: str | None,
        org_id: str,
        user_id: str,
        key: str | None,
        previous: str | None = None,
    ) -> ResponseRecord:
        """Record a new turn (a new conversation when ``session_id`` is None) and its first response."""
        turn_request, extras = turn_parts(
            request, session_id=session_id, idempotency_key=None if key is None else _KEY_PREFIX + key
        )
        row = self._turns.record(turn_request, org_id=org_id, user_id=user_id, extras=extras)
        return self._record(request, row, round_=0, org_id=org_id, key=key, previous=previous)

    def _record(
        self,
        request: ResponseCreate,
        turn: TurnRecord,
        *,
        round_: int,
        org_id: str,
        key: str | None,
        previous: str | None,
    ) -> ResponseRecord:
        model = self.model_for(request, mode=turn.mode or turn.requested_mode)
        record = ResponseRecord(
            response_id=response_id(turn.turn_id, round_),
            turn_id=turn.turn_id,
            round=round_,
            org_id=org_id,
            previous_response_id=previous,
            conversation_id=request.conversation,
            params=request.echoed(model),
            input_items=request.input_items,
            idempotency_key=key,
            request_hash=request.request_hash,
            created_at=self._clock(),
        )
        return self._responses.add(record)
