"""WebhookDeliverer on SQLite with an in-process endpoint (``httpx.MockTransport``): one attempt per
claim, retries sent or parked, 410 disabling the endpoint, redirects not followed, errors recorded."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from standardwebhooks.webhooks import Webhook

from shared.db.tables import WebhookAttemptRow, WebhookDeliveryRow, WebhookEndpointRow
from shared.db.turns import NewTurn, TurnOutcome, TurnRepository
from shared.db.webhook_deliveries import WebhookDeliveryRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.turn import TurnStatus, Usage
from shared.webhooks import WebhookConfig
from shared.webhooks.addresses import Resolver
from tests.unit.fakes import FIXED_NOW, Clock, sqlite_db
from workers.webhooks.delivery import WebhookDeliverer
from workers.webhooks.schedule import Verdict
from workers.webhooks.sweep import WebhookSweeper

KEY = b"0123456789abcdef0123"
SECRET = "whsec_" + base64.b64encode(KEY).decode()
URL = "http://hooks.example.com/in"


class _Endpoint:
    """Answers each request with the next scripted status (or raises it); keeps the requests."""

    def __init__(self, *answers: int | Exception) -> None:
        self.answers = list(answers)
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, Exception):
            raise answer
        headers = {"location": "http://elsewhere.example.com/"} if 300 <= answer < 400 else {}
        return httpx.Response(answer, headers=headers, content=b"receiver's body, never read")


class _Harness:
    def __init__(self, endpoint: _Endpoint, *, delays: tuple[float, ...] = (1.0, 2.0), park_after: float = 30.0,
                 allow_private: bool = True, resolve: Resolver | None = None) -> None:  # fmt: skip
        self.db: sessionmaker[Session] = sqlite_db()
        self.config = WebhookConfig(secrets={"org": KEY}, retry_delays=delays, allow_private=allow_private)
        self.turns = TurnRepository(self.db, webhooks=WebhookOutbox(self.config))
        self.deliveries = WebhookDeliveryRepository(self.db)
        self.clock = Clock()
        self.sent: list[tuple[str, int, float]] = []
        self.endpoint = endpoint
        self.deliverer = WebhookDeliverer(
            deliveries=self.deliveries, config=self.config, http=httpx.Client(transport=httpx.MockTransport(endpoint)),
            send=lambda *message: self.sent.append(message), park_after=park_after, clock=self.clock,
            random=lambda: 0.5, resolve=resolve,
        )  # fmt: skip

    def event(self, index: int = 1, url: str = URL) -> str:
        turn_id = f"turn_{index:032d}"
        self.turns.create(
            NewTurn(turn_id=turn_id, session_id=f"sess_{index}", org_id="org", user_id="u", new_session=True,
                    requested_mode=None, request={"input": "q", "webhook_url": url}, request_hash="h"),
            now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
        )  # fmt: skip
        outcome = TurnOutcome(status=TurnStatus.COMPLETED, mode="general", output_text="a", pending_tool_calls=[],
                              mode_changes=[], error=None, usage=Usage(), trace=[])  # fmt: skip
        self.turns.commit(turn_id, outcome, transcript=[], snapshot={}, now=FIXED_NOW)
        with self.db() as orm:
            found = select(WebhookDeliveryRow.delivery_id).where(WebhookDeliveryRow.turn_id == turn_id)
            return orm.scalars(found).one()

    def row(self, delivery_id: str) -> WebhookDeliveryRow:
        with self.db() as orm:
            found = orm.get(WebhookDeliveryRow, delivery_id)
            assert found is not None
            return found

    def attempts(self, delivery_id: str) -> list[tuple[int | None, str | None]]:
        with self.db() as orm:
            rows = orm.scalars(select(WebhookAttemptRow).where(WebhookAttemptRow.delivery_id == delivery_id)
                               .order_by(WebhookAttemptRow.attempt))  # fmt: skip
            return [(row.status_code, row.error) for row in rows]


def test_a_delivered_event_is_signed_and_recorded() -> None:
    harness = _Harness(_Endpoint(204))
    delivery_id = harness.event()
    harness.clock.now = datetime.now(UTC)  # receivers refuse a signature older than five minutes
    assert harness.deliverer.deliver(delivery_id, 1) is Verdict.DELIVERED
    (request,) = harness.endpoint.requests
    assert Webhook(SECRET).verify(request.content, dict(request.headers))["id"] == delivery_id
    assert request.headers["content-type"] == "application/json"
    assert harness.row(delivery_id).status == "delivered"
    assert harness.attempts(delivery_id) == [(204, None)]


def test_only_the_first_message_for_an_attempt_makes_it() -> None:
    harness = _Harness(_Endpoint(200))
    delivery_id = harness.event()
    assert harness.deliverer.deliver(delivery_id, 1) is Verdict.DELIVERED
    assert harness.deliverer.deliver(delivery_id, 1) is None  # the sweep's copy, a redelivery
    assert harness.deliverer.deliver(delivery_id, 2) is None  # delivered: nothing more
    assert len(harness.endpoint.requests) == 1


def test_a_failure_is_retried_with_a_countdown_and_the_same_id_and_body() -> None:
    harness = _Harness(_Endpoint(500, 200))
    delivery_id = harness.event()
    assert harness.deliverer.deliver(delivery_id, 1) is Verdict.RETRY
    assert harness.sent == [(delivery_id, 2, 1.0)]
    assert harness.row(delivery_id).status == "pending"
    assert harness.row(delivery_id).next_attempt_at == FIXED_NOW + timedelta(seconds=1)
    assert harness.deliverer.deliver(delivery_id, 2) is Verdict.DELIVERED
    first, second = harness.endpoint.requests
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == delivery_id
    assert first.content == second.content
    assert harness.attempts(delivery_id) == [(500, None), (200, None)]


def test_a_long_wait_is_parked_in_the_database_and_the_sweep_sends_it_when_due() -> None:
    # Given a retry due in an hour (longer than a countdown may safely be)
    harness = _Harness(_Endpoint(503, 200), delays=(3600.0,), park_after=30.0)
    delivery_id = harness.event()
    assert harness.deliverer.deliver(delivery_id, 1) is Verdict.RETRY
    assert harness.sent == []
    sweeper = WebhookSweeper(harness.deliveries, lambda *message: harness.sent.append(message))
    # Then the sweep leaves it until it is due, then sends its second attempt once
    assert sweeper.sweep(FIXED_NOW + timedelta(minutes=30)) == 0
    assert sweeper.sweep(FIXED_NOW + timedelta(hours=1, minutes=1)) == 1
    assert sweeper.sweep(FIXED_NOW + timedelta(hours=1, minutes=2)) == 0
    assert harness.sent == [(delivery_id, 2, 0.0)]


def test_a_delivery_is_given_up_after_the_last_retry() -> None:
    harness = _Harness(_Endpoint(500), delays=(1.0,))
    delivery_id = harness.event()
    assert harness.deliverer.deliver(delivery_id, 1) is Verdict.RETRY
    assert harness.deliverer.deliver(delivery_id, 2) is Verdict.GIVE_UP
    assert harness.row(delivery_id).status == "failed" and harness.row(delivery_id).next_attempt_at is None


def test_410_disables_the_endpoint_for_later_deliveries() -> None:
    harness = _Harness(_Endpoint(410, 200))
    first, second = harness.event(1), harness.event(2)
    assert harness.deliverer.deliver(first, 1) is Verdict.DISABLE_ENDPOINT
    assert harness.deliverer.deliver(second, 1) is None
    assert (harness.row(first).status, harness.row(second).status) == ("endpoint_disabled", "endpoint_disabled")
    assert harness.attempts(second) == [] and harness.row(second).attempts == 0
    assert len(harness.endpoint.requests) == 1
    with harness.db() as orm:
        endpoint = orm.get(WebhookEndpointRow, ("org", URL))
        assert endpoint is not None and first in endpoint.reason


@pytest.mark.parametrize(
    ("answer", "status_code", "error"),
    [
        (302, 302, None),
        (httpx.ConnectError("connection refused"), None, "ConnectError: connection refused"),
        (httpx.ReadTimeout("slow"), None, "no answer within 15s"),
    ],
    ids=["redirect", "refused", "timeout"],
)
def test_redirects_and_transport_errors_are_recorded_and_retried(
    answer: int | Exception, status_code: int | None, error: str | None
) -> None:
    harness = _Harness(_Endpoint(answer))
    delivery_id = harness.event()
    assert harness.deliverer.deliver(delivery_id, 1) is Verdict.RETRY
    assert harness.attempts(delivery_id) == [(status_code, error)]
    assert len(harness.endpoint.requests) == 1  # a redirect is not followed


def test_a_private_address_is_refused_again_at_delivery() -> None:
    harness = _Harness(_Endpoint(200), allow_private=False)
    delivery_id = harness.event(url="http://127.0.0.1:9/in")
    assert harness.deliverer.deliver(delivery_id, 1) is Verdict.RETRY
    ((status_code, error),) = harness.attempts(delivery_id)
    assert status_code is None and error is not None and "not sent" in error and "loopback" in error
    assert harness.endpoint.requests == []


@pytest.mark.parametrize(
    ("address", "why"),
    [
        ("2002:a9fe:a9fe::", "6to4 address carrying 169.254.169.254, a link-local address"),
        ("64:ff9b::7f00:1", "NAT64 address carrying 127.0.0.1, a loopback address"),
        ("2001:0:4136:e378:8000:63bf:f5ff:fffe", "Teredo address carrying 10.0.0.1, a private address"),
    ],
)
def test_a_host_now_resolving_to_an_address_carrying_a_private_one_is_refused_at_delivery(
    address: str, why: str
) -> None:
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[str]:
        asked.append(host)
        return [address]

    harness = _Harness(_Endpoint(200), allow_private=False, resolve=resolve)
    delivery_id = harness.event()
    assert harness.deliverer.deliver(delivery_id, 1) is Verdict.RETRY
    ((status_code, error),) = harness.attempts(delivery_id)
    assert status_code is None and error is not None and error.startswith("not sent") and why in error, error
    assert asked == ["hooks.example.com"] and harness.endpoint.requests == []


def test_the_event_body_is_compact_json_with_its_id_and_type() -> None:
    harness = _Harness(_Endpoint(200))
    delivery_id = harness.event()
    body = harness.row(delivery_id).body
    event = json.loads(body)
    assert (event["id"], event["type"], event["data"]["status"]) == (delivery_id, "turn.completed", "completed")
    assert ": " not in body
