"""The webhook outbox on SQLite: an event is recorded in the transaction that ends or pauses a turn, once
however often that commit runs, returned to the caller to send after it (``WebhookSender``), and never
fails the turn; a batch's last turn raises ``batch.completed`` once."""

from __future__ import annotations

import json
from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from shared.db.batches import BatchRecord, BatchRepository
from shared.db.tables import WebhookDeliveryRow
from shared.db.turns import Committed, NewTurn, TurnOutcome, TurnRepository
from shared.db.webhook_deliveries import WebhookDeliveryRepository
from shared.db.webhook_outbox import WebhookOutbox
from shared.models.turn import PendingToolCall, TurnStatus, Usage
from shared.result import ErrorCode, ErrorInfo
from shared.turn_view import to_turn
from shared.webhooks import WebhookConfig, WebhookSender
from tests.unit.fakes import FIXED_NOW, sqlite_db

KEY = b"0123456789abcdef0123"
URL = "https://hooks.example.com/in"
CONFIG = WebhookConfig(secrets={"org": KEY}, default_urls={}, retry_delays=(1.0,))


class _Sends:
    """Records the deliveries a sender enqueues; can be told to fail like a broker that is down."""

    def __init__(self, *, fail: bool = False) -> None:
        self.sent: list[str] = []
        self.fail = fail

    def __call__(self, delivery_id: str) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append(delivery_id)


def _turn(turns: TurnRepository, index: int = 1, *, org: str = "org", url: str | None = URL) -> str:
    turn_id = f"turn_{index:032d}"
    request = {"input": "q"} if url is None else {"input": "q", "webhook_url": url}
    turns.create(
        NewTurn(turn_id=turn_id, session_id=f"sess_{index}", org_id=org, user_id="u", new_session=True,
                requested_mode=None, request=request, request_hash="h"),
        now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
    )  # fmt: skip
    return turn_id


def _commit(turns: TurnRepository, turn_id: str, status: TurnStatus = TurnStatus.COMPLETED) -> Committed | None:
    pending = [PendingToolCall(call_id="c1", name="open_file", arguments="{}")]
    outcome = TurnOutcome(
        status=status, mode="general", output_text="a" if status is TurnStatus.COMPLETED else None,
        pending_tool_calls=pending if status is TurnStatus.REQUIRES_CLIENT_TOOLS else [], mode_changes=[],
        error=None, usage=Usage(llm_calls=1), trace=[],
    )  # fmt: skip
    return turns.commit(turn_id, outcome, transcript=[], snapshot={}, now=FIXED_NOW + timedelta(seconds=1))


def _rows(db: sessionmaker[Session]) -> list[WebhookDeliveryRow]:
    with db() as orm:
        return list(orm.scalars(select(WebhookDeliveryRow).order_by(WebhookDeliveryRow.created_at)))


def test_a_commit_records_its_event_once_and_returns_it_to_send() -> None:
    # Given a turn whose request names an endpoint
    db = sqlite_db()
    turns = TurnRepository(db, webhooks=WebhookOutbox(CONFIG))
    turn_id = _turn(turns)
    # When its commit runs twice (a redelivered persist step)
    first, again = _commit(turns, turn_id), _commit(turns, turn_id)
    # Then one delivery carries the turn as the API shows it, and only the first commit returns it to send
    (row,) = _rows(db)
    event = json.loads(row.body)
    assert (row.event_type, row.url, row.status, row.turn_id) == ("turn.completed", URL, "pending", turn_id)
    assert event["id"] == row.delivery_id and event["type"] == "turn.completed"
    record = turns.get(turn_id)
    assert record is not None
    assert event["data"] == to_turn(record).model_dump(mode="json", by_alias=True)
    assert first is not None and first.deliveries == [row.delivery_id]
    assert again is not None and again.deliveries == []


def test_no_event_for_an_organisation_without_a_secret_or_a_request_without_an_endpoint() -> None:
    db = sqlite_db()
    turns = TurnRepository(db, webhooks=WebhookOutbox(CONFIG))
    committed = [_commit(turns, _turn(turns, 1, org="org-without-secret")), _commit(turns, _turn(turns, 2, url=None))]
    assert _rows(db) == [] and [c.deliveries for c in committed if c is not None] == [[], []]


def test_the_organisation_default_endpoint_takes_events_of_requests_that_name_none() -> None:
    db = sqlite_db()
    config = WebhookConfig(secrets={"org": KEY}, default_urls={"org": "https://default.example.com/h"})
    turns = TurnRepository(db, webhooks=WebhookOutbox(config))
    _commit(turns, _turn(turns, url=None))
    assert [row.url for row in _rows(db)] == ["https://default.example.com/h"]


def test_the_sender_enqueues_each_delivery_it_is_given() -> None:
    sends = _Sends()
    WebhookSender(sends).send(["d1", "d2"])
    assert sends.sent == ["d1", "d2"]


def test_a_broker_that_refuses_leaves_the_delivery_pending_for_the_sweep() -> None:
    db = sqlite_db()
    turns = TurnRepository(db, webhooks=WebhookOutbox(CONFIG))
    turn_id = _turn(turns)
    committed = _commit(turns, turn_id)
    assert committed is not None
    WebhookSender(_Sends(fail=True)).send(committed.deliveries)  # never raises: the turn is committed
    (row,) = _rows(db)
    later = FIXED_NOW + timedelta(minutes=1)
    due = WebhookDeliveryRepository(db).due(before=later, resend_at=later + timedelta(minutes=5))
    assert due == [(row.delivery_id, 1)]
    assert WebhookDeliveryRepository(db).due(before=later, resend_at=later) == []  # not twice a scan


def test_an_error_recording_the_event_never_fails_the_turn() -> None:
    class _Broken(WebhookConfig):
        def url_for(self, org_id: str, requested: str | None) -> str | None:
            raise RuntimeError("a bug in the webhook code")

    db = sqlite_db()
    turns = TurnRepository(db, webhooks=WebhookOutbox(_Broken(secrets={"org": KEY})))
    turn_id = _turn(turns)
    committed = _commit(turns, turn_id)
    assert committed is not None and committed.deliveries == []
    record = turns.get(turn_id)
    assert record is not None and record.status is TurnStatus.COMPLETED
    assert _rows(db) == []


def test_a_pause_and_the_end_of_the_next_round_are_two_events() -> None:
    db = sqlite_db()
    turns = TurnRepository(db, webhooks=WebhookOutbox(CONFIG))
    turn_id = _turn(turns)
    _commit(turns, turn_id, TurnStatus.REQUIRES_CLIENT_TOOLS)
    turns.accept_tool_results(turn_id, results=[{"call_id": "c1", "output": "x"}], now=FIXED_NOW,
                              deadline_at=FIXED_NOW + timedelta(seconds=60))  # fmt: skip
    _commit(turns, turn_id)
    assert [row.event_type for row in _rows(db)] == ["turn.requires_client_tools", "turn.completed"]
    assert json.loads(_rows(db)[0].body)["data"]["pending_tool_calls"][0]["call_id"] == "c1"


def test_a_turn_ended_outside_the_pipeline_raises_its_event() -> None:
    db = sqlite_db()
    turns = TurnRepository(db, webhooks=WebhookOutbox(CONFIG))
    turn_id = _turn(turns)
    error = ErrorInfo(code=ErrorCode.CANCELLED, message="the turn was cancelled by the client")
    ended = turns.finish_early(turn_id, status=TurnStatus.CANCELLED, error=error, now=FIXED_NOW)
    (row,) = _rows(db)
    assert row.event_type == "turn.cancelled"
    assert json.loads(row.body)["data"]["error"]["code"] == "cancelled"
    assert ended is not None and ended.deliveries == [row.delivery_id]


def test_the_last_turn_of_a_batch_out_of_flight_raises_batch_completed_once() -> None:
    # Given a batch of two turns with an endpoint of its own (its turns name none)
    db = sqlite_db()
    turns = TurnRepository(db, webhooks=WebhookOutbox(CONFIG))
    batch = BatchRecord(batch_id="batch_1", org_id="org", user_id="u", total=2, created_at=FIXED_NOW,
                        webhook_url="https://batch.example.com/h")  # fmt: skip
    new = [
        NewTurn(turn_id=f"turn_{index:032d}", session_id=f"sess_{index}", org_id="org", user_id="u",
                new_session=True, requested_mode=None, request={"input": "q"}, request_hash="h",
                batch_id="batch_1", batch_index=index)
        for index in range(2)
    ]  # fmt: skip
    with BatchRepository(db).creating(batch, new, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60)):
        pass
    # When the first ends, nothing; when the second pauses (out of flight too), the batch is done
    _commit(turns, new[0].turn_id)
    assert _rows(db) == []
    _commit(turns, new[1].turn_id, TurnStatus.REQUIRES_CLIENT_TOOLS)
    (row,) = _rows(db)
    event = json.loads(row.body)
    assert (row.event_type, row.batch_id, row.url) == ("batch.completed", "batch_1", "https://batch.example.com/h")
    assert event["data"]["counts"]["completed"] == 1 and event["data"]["counts"]["requires_client_tools"] == 1
    # And the paused turn ending later does not raise it again
    turns.accept_tool_results(new[1].turn_id, results=[], now=FIXED_NOW, deadline_at=FIXED_NOW)
    _commit(turns, new[1].turn_id)
    with db() as orm:
        assert orm.scalar(select(func.count()).select_from(WebhookDeliveryRow)) == 1
