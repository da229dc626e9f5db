"""TurnEnding on in-process fakes: each kind of early end writes the end (with its webhook event), counts it,
appends its event and takes the turn out of flight: cancel flag (a cancel only), in-flight marker, admission slot."""

from __future__ import annotations

from dataclasses import replace

import fakeredis
import pytest

from shared.db.webhook_outbox import WebhookOutbox
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, ErrorInfo
from shared.state import MemoryStateStore
from shared.state.admission import AdmissionQueue
from shared.turn_ending import CANCELLED_BY_CLIENT, TurnEnding
from shared.turn_events import MemoryTurnEventLog
from shared.webhooks import WebhookConfig, WebhookSender
from tests.unit.fakes import FIXED_NOW, TURN_ID, make_context, memory_store, record_turn
from workers.context import StepContext

ORG = "o"
"""The organisation of every turn ``record_turn`` records."""
OTHER_ID = "turn_" + "2" * 32
FAILED = ErrorInfo(code=ErrorCode.INTERNAL_ERROR, message="the pipeline could not run this turn")
TIMED_OUT = ErrorInfo(code=ErrorCode.CLIENT_TOOL_TIMEOUT, message="no client tool results arrived within 60s")


class _Sends(list[str]):
    """The webhook deliveries the outbox sends."""

    def __call__(self, delivery_id: str) -> None:
        self.append(delivery_id)


class _Ports:
    """A worker context with admission and a webhook outbox, one in-flight turn recorded, and its ending."""

    def __init__(self, *, turn_ids: tuple[str, ...] = (TURN_ID,)) -> None:
        self.sends = _Sends()
        config = WebhookConfig(secrets={ORG: b"0123456789abcdef0123"}, default_urls={ORG: "https://h.example/in"},
                               retry_delays=(1.0,))  # fmt: skip
        self.admission = AdmissionQueue(fakeredis.FakeRedis())
        ctx = make_context(outbox=WebhookOutbox(config), webhook_sender=WebhookSender(self.sends))
        self.ctx: StepContext = replace(ctx, admission=self.admission)
        for index, turn_id in enumerate(turn_ids):
            record_turn(self.ctx, turn_id=turn_id, session_id=f"sess_{index:032d}")
        # As the gateway leaves an interactive turn it sent: marked in flight, counted in its organisation's slots
        self.store.mark_alive(turn_ids, until=FIXED_NOW.timestamp() + 60)
        self.admission.admit_now(ORG, list(turn_ids), now=FIXED_NOW.timestamp())
        self.ending: TurnEnding = self.ctx.ending

    @property
    def store(self) -> MemoryStateStore:
        return memory_store(self.ctx)

    def events(self, turn_id: str = TURN_ID) -> list[str]:
        assert isinstance(self.ctx.events, MemoryTurnEventLog)
        return [event.event for event in self.ctx.events.events(turn_id)]

    def finished(self, status: str, code: str) -> float:
        labels = {"status": status, "code": code}
        return self.ctx.metrics.registry.get_sample_value("aptix_turns_finished_total", labels) or 0.0

    def in_flight(self, turn_id: str = TURN_ID) -> bool:
        """Whether the turn still has its in-flight marker or its admission slot."""
        return bool(self.store.alive_until([turn_id])) or self.admission.where(ORG, [turn_id])[turn_id] is not None


def test_a_cancel_ends_the_turn_cancelled_with_the_one_cancelled_error() -> None:
    ports = _Ports()

    ended = ports.ending.end(TURN_ID, CANCELLED_BY_CLIENT)

    assert ended is not None and ended.status is TurnStatus.CANCELLED
    assert ended.error == {"code": "cancelled", "message": "the turn was cancelled by the client"}
    assert ended.trace[-1]["kind"] == "turn_cancelled"


def test_a_cancel_counts_the_end_and_records_its_event_and_webhook() -> None:
    ports = _Ports()

    ports.ending.end(TURN_ID, CANCELLED_BY_CLIENT)

    assert ports.finished("cancelled", "cancelled") == 1
    assert ports.events() == ["turn.cancelled"]
    assert len(ports.sends) == 1


def test_a_cancel_flags_the_turn_and_takes_it_out_of_flight() -> None:
    ports = _Ports()

    ports.ending.end(TURN_ID, CANCELLED_BY_CLIENT)

    assert ports.store.is_cancelled(TURN_ID)
    assert not ports.in_flight()


@pytest.mark.parametrize(("error", "code"), [(FAILED, "internal_error"), (TIMED_OUT, "client_tool_timeout")])
def test_a_failure_is_counted_recorded_and_out_of_flight_but_not_flagged_cancelled(error: ErrorInfo, code: str) -> None:
    ports = _Ports()

    ended = ports.ending.end(TURN_ID, error)

    assert ended is not None and ended.status is TurnStatus.FAILED and ended.error == error.model_dump(mode="json")
    assert ports.finished("failed", code) == 1
    assert ports.events() == ["turn.failed"]
    assert len(ports.sends) == 1
    assert not ports.in_flight()
    assert not ports.store.is_cancelled(TURN_ID)


def test_a_cancelled_turn_still_held_for_admission_is_never_released() -> None:
    ports = _Ports()
    record_turn(ports.ctx, turn_id=OTHER_ID, session_id="sess_other")
    ports.admission.hold(ORG, [OTHER_ID])

    ports.ending.end(OTHER_ID, CANCELLED_BY_CLIENT)

    assert ports.admission.where(ORG, [OTHER_ID]) == {OTHER_ID: None}
    assert ports.admission.release(cap=10, limit=10, now=FIXED_NOW.timestamp()) is None


def test_a_turn_in_none_of_the_allowed_statuses_is_left_alone() -> None:
    ports = _Ports()  # queued, not paused

    ended = ports.ending.end(TURN_ID, TIMED_OUT, only_if=(TurnStatus.REQUIRES_CLIENT_TOOLS,))

    assert ended is None
    row = ports.ctx.turns.get(TURN_ID)
    assert row is not None and row.status is TurnStatus.QUEUED
    assert ports.in_flight() and ports.events() == [] and ports.sends == []
    assert ports.finished("failed", "client_tool_timeout") == 0


def test_a_turn_that_already_ended_is_not_ended_or_counted_again() -> None:
    ports = _Ports()
    ports.ending.end(TURN_ID, FAILED)

    assert ports.ending.end(TURN_ID, CANCELLED_BY_CLIENT) is None

    assert ports.finished("failed", "internal_error") == 1 and ports.finished("cancelled", "cancelled") == 0
    assert ports.events() == ["turn.failed"]
    assert not ports.store.is_cancelled(TURN_ID)


def test_cancel_queued_cancels_the_turns_not_started_and_cleans_up_after_each() -> None:
    # Given two queued turns and a third that ended before
    third = "turn_" + "3" * 32
    ports = _Ports(turn_ids=(TURN_ID, OTHER_ID, third))
    ports.ending.end(third, FAILED)

    # When a batch's cancel cancels all three at once
    cancelled = ports.ending.cancel_queued([TURN_ID, OTHER_ID, third])

    # Then the two queued ones are cancelled, each with all its cleanup; the third is left as it was
    assert sorted(row.turn_id for row in cancelled) == [TURN_ID, OTHER_ID]
    assert ports.finished("cancelled", "cancelled") == 2
    for turn_id in (TURN_ID, OTHER_ID):
        assert ports.events(turn_id) == ["turn.cancelled"]
        assert ports.store.is_cancelled(turn_id) and not ports.in_flight(turn_id)
    assert len(ports.sends) == 3
    assert ports.events(third) == ["turn.failed"] and not ports.store.is_cancelled(third)


def test_a_redis_that_refuses_after_the_end_is_written_costs_only_the_cleanup() -> None:
    # Given an admission Redis that does not answer
    server = fakeredis.FakeServer()
    ports = _Ports()
    ending = replace(ports.ending, admission=AdmissionQueue(fakeredis.FakeRedis(server=server)))
    server.connected = False

    # When the turn is cancelled
    ended = ending.end(TURN_ID, CANCELLED_BY_CLIENT)

    # Then it is cancelled, counted and recorded all the same
    assert ended is not None and ended.status is TurnStatus.CANCELLED
    assert ports.finished("cancelled", "cancelled") == 1 and ports.events() == ["turn.cancelled"]
