"""Webhooks of turns created through the OpenAI face: OpenAI's event types and body, signed as every
event is, parsed by the official SDK's ``webhooks.unwrap``; turns of ``/v1/turns`` keep their events."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import httpx
import openai
import pytest
from openai.types.webhooks import (
    ResponseCancelledWebhookEvent,
    ResponseCompletedWebhookEvent,
    ResponseFailedWebhookEvent,
    ResponseIncompleteWebhookEvent,
)
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import WebhookDeliveryRow
from shared.db.turns import NewTurn, TurnOutcome, TurnRepository
from shared.db.webhook_deliveries import WebhookDeliveryRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.turn import PendingToolCall, TurnStatus, Usage
from shared.openai import FACE_OPENAI, response_id
from shared.result import ErrorCode, ErrorInfo
from shared.turn_view import to_turn
from shared.webhooks import EventType, WebhookConfig
from shared.webhooks.events import event_body, response_event_body, turn_event_type
from shared.webhooks.parsing import parse_secrets
from tests.unit.fakes import FIXED_NOW, Clock, sqlite_db
from workers.webhooks.delivery import WebhookDeliverer
from workers.webhooks.schedule import Verdict
from workers.webhooks.signing import signed_headers

SECRET = "whsec_" + base64.b64encode(b"an organisation's key of 24+ bytes").decode()
"""A secret in the format ``APTIX_WEBHOOK_SECRETS`` takes (``whsec_`` and base64)."""
URL = "http://hooks.example.com/in"
TURN_ID = "turn_" + "a" * 32
NOW = FIXED_NOW + timedelta(seconds=3)


class _Endpoint:
    """Answers 200 and keeps every request."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        return httpx.Response(200)


class _Harness:
    """Turns on SQLite with a webhook outbox, and the deliverer that signs and POSTs their events."""

    def __init__(self) -> None:
        self.db: sessionmaker[Session] = sqlite_db()
        self.config = WebhookConfig(secrets=parse_secrets(f"org:{SECRET}"), allow_private=True)
        self.turns = TurnRepository(self.db, webhooks=WebhookOutbox(self.config))
        self.endpoint = _Endpoint()
        self.clock = Clock()
        self.deliverer = WebhookDeliverer(
            deliveries=WebhookDeliveryRepository(self.db), config=self.config,
            http=httpx.Client(transport=httpx.MockTransport(self.endpoint)), send=lambda *message: None,
            park_after=30.0, clock=self.clock, random=lambda: 0.5,
        )  # fmt: skip

    def turn(self, *, face: str | None = FACE_OPENAI) -> str:
        request = {"input": "q", "webhook_url": URL, "extras": {"face": face}}
        self.turns.create(
            NewTurn(turn_id=TURN_ID, session_id="sess_1", org_id="org", user_id="u", new_session=True,
                    requested_mode=None, request=request, request_hash="h"),
            now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
        )  # fmt: skip
        return TURN_ID

    def commit(self, status: TurnStatus) -> None:
        pending = [PendingToolCall(call_id="call_1", name="open_file", arguments="{}")]
        outcome = TurnOutcome(
            status=status, mode="general", output_text="a" if status is TurnStatus.COMPLETED else None,
            pending_tool_calls=pending if status is TurnStatus.REQUIRES_CLIENT_TOOLS else [], mode_changes=[],
            error=ErrorInfo(code=ErrorCode.LLM_ERROR, message="x") if status is TurnStatus.FAILED else None,
            usage=Usage(llm_calls=1), trace=[],
        )  # fmt: skip
        assert self.turns.commit(TURN_ID, outcome, transcript=[], snapshot={}, now=NOW)

    def rows(self) -> list[WebhookDeliveryRow]:
        with self.db() as orm:
            return list(orm.scalars(select(WebhookDeliveryRow).order_by(WebhookDeliveryRow.created_at)))

    def delivered(self, row: WebhookDeliveryRow) -> httpx.Request:
        """The request the deliverer POSTs for ``row``, signed now (receivers refuse old signatures)."""
        self.clock.now = datetime.now(UTC)
        assert self.deliverer.deliver(row.delivery_id, 1) is Verdict.DELIVERED
        return self.endpoint.requests[-1]


def _unwrap(request: httpx.Request) -> object:
    client = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9")
    return client.webhooks.unwrap(request.content, dict(request.headers), secret=SECRET)


@pytest.mark.parametrize(
    ("status", "event_type", "sdk_type"),
    [
        (TurnStatus.COMPLETED, "response.completed", ResponseCompletedWebhookEvent),
        (TurnStatus.REQUIRES_CLIENT_TOOLS, "response.completed", ResponseCompletedWebhookEvent),
        (TurnStatus.FAILED, "response.failed", ResponseFailedWebhookEvent),
    ],
    ids=["completed", "paused", "failed"],
)
def test_a_committed_openai_turn_raises_openais_event_that_the_sdk_unwraps(
    status: TurnStatus, event_type: str, sdk_type: type[object]
) -> None:
    # Given a turn of the OpenAI face whose commit recorded its event
    harness = _Harness()
    harness.turn()
    harness.commit(status)
    (row,) = harness.rows()
    # When the deliverer signs and POSTs it
    request = harness.delivered(row)
    # Then the SDK verifies the signature and parses OpenAI's event for the turn's round
    event = _unwrap(request)
    assert isinstance(event, sdk_type)
    assert json.loads(request.content) == {
        "id": row.delivery_id, "type": event_type, "created_at": int(NOW.timestamp()),
        "data": {"id": response_id(TURN_ID, 0)},
    }  # fmt: skip
    assert row.delivery_id.startswith("evt_") and len(row.delivery_id) == len("evt_") + 32
    assert (row.event_type, row.event_key) == (event_type, f"turn:{TURN_ID}:0:{status.value}")
    assert request.headers["webhook-id"] == row.delivery_id


def test_a_cancelled_openai_turn_raises_response_cancelled() -> None:
    harness = _Harness()
    harness.turn()
    harness.turns.finish_early(TURN_ID, status=TurnStatus.CANCELLED, now=NOW,
                               error=ErrorInfo(code=ErrorCode.CANCELLED, message="cancelled"))  # fmt: skip
    (row,) = harness.rows()
    event = _unwrap(harness.delivered(row))
    assert isinstance(event, ResponseCancelledWebhookEvent) and event.data.id == response_id(TURN_ID, 0)


def test_the_event_after_a_pause_names_the_response_of_the_next_round() -> None:
    # Given an OpenAI turn that paused, whose results were accepted, and that then completed
    harness = _Harness()
    harness.turn()
    harness.commit(TurnStatus.REQUIRES_CLIENT_TOOLS)
    harness.turns.accept_tool_results(TURN_ID, results=[{"call_id": "call_1", "output": "x"}], now=NOW,
                                      deadline_at=NOW + timedelta(seconds=60))  # fmt: skip
    harness.commit(TurnStatus.COMPLETED)
    # Then each round raised response.completed for its own response
    paused, completed = harness.rows()
    events = [_unwrap(harness.delivered(row)) for row in (paused, completed)]
    completed_ids = [event.data.id for event in events if isinstance(event, ResponseCompletedWebhookEvent)]
    assert completed_ids == [response_id(TURN_ID, 0), response_id(TURN_ID, 1)]


def test_response_incomplete_is_a_type_the_sdk_unwraps() -> None:
    body = response_event_body("evt_" + "1" * 32, EventType.RESPONSE_INCOMPLETE, response_id="resp_x", at=NOW)
    headers = signed_headers(parse_secrets(f"org:{SECRET}")["org"], delivery_id="evt_" + "1" * 32,
                             timestamp=int(datetime.now(UTC).timestamp()), body=body)  # fmt: skip
    event = openai.OpenAI(api_key="x", base_url="http://127.0.0.1:9").webhooks.unwrap(body, headers, secret=SECRET)
    assert isinstance(event, ResponseIncompleteWebhookEvent) and event.data.id == "resp_x"


def test_the_openai_event_types_by_status_and_ours_unchanged() -> None:
    assert {status: turn_event_type(status, face=FACE_OPENAI) for status in TurnStatus} == {
        TurnStatus.QUEUED: None, TurnStatus.RUNNING: None,
        TurnStatus.COMPLETED: EventType.RESPONSE_COMPLETED,
        TurnStatus.REQUIRES_CLIENT_TOOLS: EventType.RESPONSE_COMPLETED,
        TurnStatus.FAILED: EventType.RESPONSE_FAILED, TurnStatus.CANCELLED: EventType.RESPONSE_CANCELLED,
    }  # fmt: skip
    for face in (None, "something else"):
        assert {status: turn_event_type(status, face=face) for status in TurnStatus} == {
            status: turn_event_type(status) for status in TurnStatus
        }
    assert turn_event_type(TurnStatus.REQUIRES_CLIENT_TOOLS) is EventType.TURN_REQUIRES_CLIENT_TOOLS


@pytest.mark.parametrize("face", [None, "not-openai"])
def test_a_turn_of_another_face_keeps_its_event_byte_for_byte(face: str | None) -> None:
    harness = _Harness()
    harness.turn(face=face)
    harness.commit(TurnStatus.COMPLETED)
    (row,) = harness.rows()
    record = harness.turns.get(TURN_ID)
    assert record is not None
    data = to_turn(record).model_dump(mode="json", by_alias=True)
    assert row.body == event_body(row.delivery_id, EventType.TURN_COMPLETED, data, at=NOW)
    assert row.delivery_id.startswith("msg_") and row.event_type == "turn.completed"
