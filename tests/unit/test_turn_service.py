"""TurnService, BatchService and SessionService as ``connect_gateway`` wires them (fakes.Gateway): on SQLite
and fakeredis, with a broker that records and a settable clock.

What the gateway does to a turn — record, resume, cancel, expire — without HTTP, a broker or a worker;
the routes over them are covered by tests/integration/test_gateway_http.py.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest

from api_gateway.errors import service_error_status
from api_gateway.services import Conflict, InvalidRequest, NotFound, Unavailable, turn_service
from shared.broker import INTERACTIVE_PRIORITY
from shared.models.batch import BatchRequest, BatchTurnRequest
from shared.models.turn import ToolResult, ToolResultsRequest, TurnRequest, TurnStatus
from shared.modes import load_catalog
from shared.result import ErrorCode
from shared.state.keys import held_key
from shared.task_names import StepName
from shared.turn_view import to_turn
from tests.unit.fakes import CLIENT_TOOL_TIMEOUT_SECONDS as TIMEOUT_SECONDS
from tests.unit.fakes import FIXED_NOW, ORG, USER, Gateway


class Timer:
    """The long poll's clock and sleep (``TurnService.wait``): each sleep is recorded and moves the clock on."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleeps: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds


@pytest.fixture
def timer(monkeypatch: pytest.MonkeyPatch) -> Timer:
    """Patches the time (only) of ``api_gateway.services.turn_service``: its waits take no wall-clock time."""
    timer = Timer()
    monkeypatch.setattr(turn_service, "time", timer)
    monkeypatch.setattr(turn_service, "asyncio", timer)
    return timer


def _results(*call_ids: str) -> ToolResultsRequest:
    return ToolResultsRequest(tool_results=[ToolResult(call_id=call_id, output="42") for call_id in call_ids])


def test_record_queues_a_new_turn_and_sends_its_first_step(gateway: Gateway) -> None:
    row = gateway.service.record(TurnRequest(input="hello"), org_id=ORG, user_id=USER)

    assert TurnStatus(row.status) is TurnStatus.QUEUED
    assert row.new_session
    assert [(e.turn_id, e.step, e.priority) for e in gateway.broker.sent] == [
        (row.turn_id, StepName.REQUEST_HANDLER, INTERACTIVE_PRIORITY)
    ]
    marker = gateway.in_flight.alive_until([row.turn_id])[row.turn_id]
    assert marker == FIXED_NOW.timestamp() + gateway.settings.reconciler_queued_seconds
    assert gateway.accepted("single") == 1


def test_record_returns_the_earlier_turn_when_the_idempotency_key_is_replayed(gateway: Gateway) -> None:
    request = TurnRequest(input="hello", idempotency_key="key-1")
    first = gateway.service.record(request, org_id=ORG, user_id=USER)

    again = gateway.service.record(request, org_id=ORG, user_id=USER)

    assert again.turn_id == first.turn_id
    assert len(gateway.broker.sent) == 1


def test_record_refuses_when_the_idempotency_key_came_with_another_request(gateway: Gateway) -> None:
    gateway.service.record(TurnRequest(input="hello", idempotency_key="key-1"), org_id=ORG, user_id=USER)

    with pytest.raises(Conflict) as refused:
        gateway.service.record(TurnRequest(input="other", idempotency_key="key-1"), org_id=ORG, user_id=USER)

    assert refused.value.code == "idempotency_key_reused"
    assert len(gateway.broker.sent) == 1


def test_record_keeps_the_stream_flag_only_when_the_turn_streams(gateway: Gateway) -> None:
    plain = gateway.service.record(TurnRequest(input="hello"), org_id=ORG, user_id=USER)
    streamed = gateway.service.record(TurnRequest(input="hello", stream=True), org_id=ORG, user_id=USER)

    assert "stream" not in plain.request
    assert streamed.request["stream"] is True
    assert streamed.request_hash == plain.request_hash  # how the answer is delivered is not the request


def test_record_replays_an_idempotency_key_whether_or_not_the_retry_streams(gateway: Gateway) -> None:
    first = gateway.service.record(TurnRequest(input="hi", idempotency_key="k", stream=True), org_id=ORG, user_id=USER)

    again = gateway.service.record(TurnRequest(input="hi", idempotency_key="k"), org_id=ORG, user_id=USER)

    assert again.turn_id == first.turn_id


def test_record_refuses_when_the_session_has_an_unfinished_turn(gateway: Gateway) -> None:
    session_id = gateway.session()
    gateway.service.record(TurnRequest(session_id=session_id, input="one"), org_id=ORG, user_id=USER)

    with pytest.raises(Conflict) as refused:
        gateway.service.record(TurnRequest(session_id=session_id, input="two"), org_id=ORG, user_id=USER)

    assert refused.value.code == "session_busy"
    assert len(gateway.turns.for_session(session_id)) == 1


def test_record_refuses_when_the_session_belongs_to_another_org(gateway: Gateway) -> None:
    session_id = gateway.session()

    with pytest.raises(NotFound) as refused:
        gateway.service.record(TurnRequest(session_id=session_id, input="hi"), org_id="org_b", user_id=USER)

    assert refused.value.code == "session_not_found"


def test_record_refuses_when_a_client_tool_takes_a_server_tool_name(gateway: Gateway) -> None:
    taken = sorted(load_catalog().server_tool_names)[0]
    body = TurnRequest.model_validate({"input": "hi", "tools": [{"name": taken, "parameters": {}}]})

    with pytest.raises(InvalidRequest) as refused:
        gateway.service.record(body, org_id=ORG, user_id=USER)

    assert refused.value.details[0]["loc"] == ["body", "tools"]


def test_record_records_nothing_when_the_broker_refuses(gateway: Gateway) -> None:
    session_id = gateway.session()
    gateway.broker.refuse = OSError("connection refused")

    with pytest.raises(Unavailable) as refused:
        gateway.service.record(TurnRequest(session_id=session_id, input="hi"), org_id=ORG, user_id=USER)

    assert refused.value.message.endswith("the turn was not accepted")
    assert gateway.turns.for_session(session_id) == []
    assert gateway.accepted("single") == 0


def test_resume_refuses_when_the_turn_is_not_paused(gateway: Gateway) -> None:
    row = gateway.service.record(TurnRequest(input="hello"), org_id=ORG, user_id=USER)

    with pytest.raises(Conflict) as refused:
        gateway.service.resume(row.turn_id, _results("call_1"), org_id=ORG)

    assert refused.value.code == "turn_not_awaiting_tool_results"
    assert refused.value.message == f"turn {row.turn_id!r} is queued, not requires_client_tools"


def test_resume_leaves_wrong_call_ids_to_the_pipeline(gateway: Gateway) -> None:
    # Given a turn paused for call_1
    turn_id = gateway.paused_turn(gateway.session())
    gateway.broker.published.clear()

    # When results for another call arrive
    row = gateway.service.resume(turn_id, _results("call_unknown"), org_id=ORG)

    # Then the turn runs its next round, and a worker will judge the results (continuation_mismatch)
    assert TurnStatus(row.status) is TurnStatus.RUNNING
    assert row.client_tool_results == [{"call_id": "call_unknown", "output": "42"}]
    assert [(e.turn_id, e.step, e.round) for e in gateway.broker.sent] == [(turn_id, StepName.REQUEST_HANDLER, 1)]


def test_resume_refuses_when_the_client_tool_timeout_passed(gateway: Gateway) -> None:
    turn_id = gateway.paused_turn(gateway.session())
    gateway.clock.now += timedelta(seconds=TIMEOUT_SECONDS + 1)

    with pytest.raises(Conflict) as refused:
        gateway.service.resume(turn_id, _results("call_1"), org_id=ORG)

    assert refused.value.code == "turn_not_awaiting_tool_results"
    assert TurnStatus(gateway.service.require(turn_id, org_id=ORG).status) is TurnStatus.FAILED


def test_resume_accepts_nothing_when_the_broker_refuses(gateway: Gateway) -> None:
    turn_id = gateway.paused_turn(gateway.session())
    gateway.broker.refuse = OSError("connection refused")

    with pytest.raises(Unavailable) as refused:
        gateway.service.resume(turn_id, _results("call_1"), org_id=ORG)

    assert refused.value.message.endswith("the results were not accepted")
    assert TurnStatus(gateway.service.require(turn_id, org_id=ORG).status) is TurnStatus.REQUIRES_CLIENT_TOOLS


def test_cancel_ends_an_unfinished_turn_and_flags_it_for_the_workers(gateway: Gateway) -> None:
    session_id = gateway.session()
    row = gateway.service.record(TurnRequest(session_id=session_id, input="hi"), org_id=ORG, user_id=USER)

    cancelled = gateway.service.cancel(row.turn_id, org_id=ORG)

    assert TurnStatus(cancelled.status) is TurnStatus.CANCELLED
    assert cancelled.error == {"code": "cancelled", "message": "the turn was cancelled by the client"}
    assert gateway.cancel_flags.is_cancelled(row.turn_id)
    assert gateway.in_flight.alive_until([row.turn_id]) == {}
    gateway.service.record(TurnRequest(session_id=session_id, input="next"), org_id=ORG, user_id=USER)


def test_cancel_appends_turn_cancelled_with_the_turn_as_get_shows_it(gateway: Gateway) -> None:
    row = gateway.service.record(TurnRequest(input="hi"), org_id=ORG, user_id=USER)

    gateway.service.cancel(row.turn_id, org_id=ORG)
    with pytest.raises(Conflict):
        gateway.service.cancel(row.turn_id, org_id=ORG)

    shown = to_turn(gateway.service.get(row.turn_id, org_id=ORG)).model_dump(mode="json", by_alias=True)
    assert [(e.event, e.data) for e in gateway.events(row.turn_id)] == [("turn.cancelled", shown)]


def test_a_client_tool_timeout_appends_turn_failed(gateway: Gateway) -> None:
    turn_id = gateway.paused_turn(gateway.session())
    gateway.clock.now += timedelta(seconds=TIMEOUT_SECONDS + 1)

    gateway.service.expire_overdue()

    (event,) = gateway.events(turn_id)
    assert (event.event, event.data["status"], event.data["error"]["code"]) == (
        "turn.failed", "failed", "client_tool_timeout"
    )  # fmt: skip


def test_cancel_refuses_when_the_turn_already_finished(gateway: Gateway) -> None:
    row = gateway.service.record(TurnRequest(input="hi"), org_id=ORG, user_id=USER)
    gateway.service.cancel(row.turn_id, org_id=ORG)

    with pytest.raises(Conflict) as refused:
        gateway.service.cancel(row.turn_id, org_id=ORG)

    assert refused.value.code == "turn_finished"


def test_cancel_counts_the_turn_cancelled_once(gateway: Gateway) -> None:
    row = gateway.service.record(TurnRequest(input="hi"), org_id=ORG, user_id=USER)
    assert gateway.finished("cancelled", "cancelled") == 0

    gateway.service.cancel(row.turn_id, org_id=ORG)
    with pytest.raises(Conflict):
        gateway.service.cancel(row.turn_id, org_id=ORG)

    assert gateway.finished("cancelled", "cancelled") == 1


def test_expiry_counts_each_timed_out_turn_failed_once(gateway: Gateway) -> None:
    gateway.paused_turn(gateway.session())
    gateway.clock.now += timedelta(seconds=TIMEOUT_SECONDS + 1)

    gateway.service.expire_overdue()
    gateway.service.expire_overdue()

    assert gateway.finished("failed", "client_tool_timeout") == 1


def test_cancel_refuses_when_the_turn_belongs_to_another_org(gateway: Gateway) -> None:
    row = gateway.service.record(TurnRequest(input="hi"), org_id=ORG, user_id=USER)

    with pytest.raises(NotFound):
        gateway.service.cancel(row.turn_id, org_id="org_b")


def test_wait_returns_a_paused_turn_at_once(gateway: Gateway, timer: Timer) -> None:
    row = gateway.service.require(gateway.paused_turn(gateway.session()), org_id=ORG)

    waited = asyncio.run(gateway.service.wait(row, org_id=ORG, seconds=5))

    assert timer.sleeps == []
    assert waited.turn_id == row.turn_id


def test_wait_gives_up_on_a_queued_turn_after_its_seconds(gateway: Gateway, timer: Timer) -> None:
    row = gateway.service.record(TurnRequest(input="hi"), org_id=ORG, user_id=USER)

    waited = asyncio.run(gateway.service.wait(row, org_id=ORG, seconds=0.5))

    # It looked again between short sleeps, and gave up once they added up to its seconds
    assert len(timer.sleeps) > 1 and all(0 < pause <= 0.25 for pause in timer.sleeps)
    assert timer.now == pytest.approx(0.5)
    assert TurnStatus(waited.status) is TurnStatus.QUEUED


def test_get_fails_a_turn_paused_past_the_client_tool_timeout(gateway: Gateway) -> None:
    turn_id = gateway.paused_turn(gateway.session())
    assert TurnStatus(gateway.service.get(turn_id, org_id=ORG).status) is TurnStatus.REQUIRES_CLIENT_TOOLS

    gateway.clock.now += timedelta(seconds=TIMEOUT_SECONDS + 1)
    row = gateway.service.get(turn_id, org_id=ORG)

    assert TurnStatus(row.status) is TurnStatus.FAILED
    assert row.error is not None and row.error["code"] == ErrorCode.CLIENT_TOOL_TIMEOUT.value


def test_expire_overdue_fails_only_turns_paused_past_the_timeout(gateway: Gateway) -> None:
    turn_id = gateway.paused_turn(gateway.session())
    gateway.clock.now += timedelta(seconds=TIMEOUT_SECONDS - 1)
    assert gateway.service.expire_overdue() == 0

    gateway.clock.now += timedelta(seconds=2)

    assert gateway.service.expire_overdue() == 1
    assert gateway.service.expire_overdue() == 0
    assert TurnStatus(gateway.service.require(turn_id, org_id=ORG).status) is TurnStatus.FAILED


def test_record_frees_a_session_whose_paused_turn_is_overdue(gateway: Gateway) -> None:
    session_id = gateway.session()
    gateway.paused_turn(session_id)
    gateway.clock.now += timedelta(seconds=TIMEOUT_SECONDS + 1)

    row = gateway.service.record(TurnRequest(session_id=session_id, input="again"), org_id=ORG, user_id=USER)

    assert TurnStatus(row.status) is TurnStatus.QUEUED


def test_batch_record_holds_every_request_for_admission_and_counts_it(gateway: Gateway) -> None:
    body = BatchRequest(requests=[BatchTurnRequest(input="a"), BatchTurnRequest(input="b")])

    batch = gateway.batches.record(body, org_id=ORG, user_id=USER)

    # The admission scheduler sends them later, at batch priority (tests/integration/test_admission_queue.py)
    turn_ids = [turn.turn_id for turn in gateway.batches.turns(batch.batch_id)]
    assert batch.total == 2 and gateway.held() == 2 and gateway.broker.sent == []
    marker = FIXED_NOW.timestamp() + gateway.settings.reconciler_queued_seconds
    assert gateway.in_flight.alive_until(turn_ids) == dict.fromkeys(turn_ids, marker)
    assert gateway.accepted("batch") == 2


def test_batch_record_refuses_more_requests_than_the_limit(gateway: Gateway) -> None:
    body = BatchRequest(requests=[BatchTurnRequest(input=str(index)) for index in range(4)])

    with pytest.raises(InvalidRequest):
        gateway.batches.record(body, org_id=ORG, user_id=USER)

    assert gateway.broker.sent == [] and gateway.held() == 0


def test_session_lists_its_turns_oldest_first(gateway: Gateway) -> None:
    session_id = gateway.session()
    first = gateway.service.record(TurnRequest(session_id=session_id, input="one"), org_id=ORG, user_id=USER)
    gateway.service.cancel(first.turn_id, org_id=ORG)
    gateway.clock.now += timedelta(seconds=1)
    second = gateway.service.record(TurnRequest(session_id=session_id, input="two"), org_id=ORG, user_id=USER)

    session = gateway.session_reads.get(session_id, org_id=ORG)

    assert [(t.turn_id, t.status) for t in session.turns] == [
        (first.turn_id, TurnStatus.CANCELLED), (second.turn_id, TurnStatus.QUEUED)
    ]  # fmt: skip


def test_session_is_not_found_for_another_org(gateway: Gateway) -> None:
    session_id = gateway.session()

    with pytest.raises(NotFound) as refused:
        gateway.session_reads.get(session_id, org_id="org_b")

    assert refused.value.code == "session_not_found"


def test_a_new_session_is_readable_as_soon_as_its_first_turn_is_recorded(gateway: Gateway) -> None:
    # Given a turn that starts a session in a requested mode, recorded but not yet run
    handle = gateway.service.record(TurnRequest(input="hi", mode="ddr-authoring"), org_id=ORG, user_id=USER)
    # When the session id it returned is read before any worker created the session
    session = gateway.session_reads.get(handle.session_id, org_id=ORG)
    # Then it is the session that turn starts
    assert session.session_id == handle.session_id and session.mode == "ddr-authoring"
    assert session.mode_history == [] and [t.turn_id for t in session.turns] == [handle.turn_id]


def test_a_new_session_without_a_mode_reads_in_the_default_mode(gateway: Gateway) -> None:
    handle = gateway.service.record(TurnRequest(input="hi"), org_id=ORG, user_id=USER)
    assert gateway.session_reads.get(handle.session_id, org_id=ORG).mode == "general"


def test_a_recorded_session_of_another_org_is_not_found(gateway: Gateway) -> None:
    handle = gateway.service.record(TurnRequest(input="hi"), org_id=ORG, user_id=USER)
    with pytest.raises(NotFound):
        gateway.session_reads.get(handle.session_id, org_id="org_b")


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (NotFound("session_not_found", "gone"), 404),
        (Conflict("session_busy", "busy"), 409),
        (InvalidRequest("bad"), 422),
        (Unavailable("down"), 503),
    ],
)
def test_service_error_status_is_that_of_its_kind(error: Exception, status: int) -> None:
    assert isinstance(error, (NotFound, Conflict, InvalidRequest, Unavailable))
    assert service_error_status(error) == status


def test_with_admission_a_batch_is_held_not_sent_and_an_interactive_turn_is_sent_and_counted(gateway: Gateway) -> None:
    admission = gateway.admission
    batch = gateway.batches.record(
        BatchRequest(requests=[BatchTurnRequest(input="a"), BatchTurnRequest(input="b")]), org_id=ORG, user_id=USER
    )
    assert gateway.broker.sent == []
    turn = gateway.service.record(TurnRequest(input="now"), org_id=ORG, user_id=USER)
    assert [(e.turn_id, e.priority) for e in gateway.broker.sent] == [(turn.turn_id, INTERACTIVE_PRIORITY)]
    counts = admission.counts()[ORG]
    assert (counts.held, counts.in_flight) == (batch.total, 1)
    marker = gateway.in_flight.alive_until([turn.turn_id])[turn.turn_id]
    assert marker == FIXED_NOW.timestamp() + gateway.settings.reconciler_queued_seconds


def test_with_admission_a_batch_redis_refuses_is_not_recorded(gateway: Gateway) -> None:
    gateway.redis_server.connected = False
    with pytest.raises(Unavailable) as refused:
        gateway.batches.record(BatchRequest(requests=[BatchTurnRequest(input="a")]), org_id=ORG, user_id=USER)
    assert refused.value.message.endswith("the batch was not accepted")
    assert gateway.accepted("batch") == 0


def test_withdraw_takes_held_turns_out_of_admission_and_cancel_withdraws_too(gateway: Gateway) -> None:
    admission = gateway.admission
    body = BatchRequest(requests=[BatchTurnRequest(input=str(index)) for index in range(3)])
    gateway.batches.record(body, org_id=ORG, user_id=USER)
    held = [turn_id.decode() for turn_id in admission.client.zrange(held_key(ORG), 0, -1)]
    gateway.service.sender.withdraw(held[:1], org_id=ORG)
    gateway.service.cancel(held[1], org_id=ORG)
    assert admission.where(ORG, held) == {held[0]: None, held[1]: None, held[2]: "held"}


def test_a_client_tool_timeout_frees_the_marker_and_slot_a_refused_resume_left_behind(gateway: Gateway) -> None:
    # Given a paused turn whose resume the broker refused after its marker and admission slot were written
    admission = gateway.admission
    turn_id = gateway.paused_turn(gateway.session())
    gateway.broker.refuse = OSError("connection refused")
    with pytest.raises(Unavailable):
        gateway.service.resume(turn_id, _results("call_1"), org_id=ORG)
    assert admission.where(ORG, [turn_id]) == {turn_id: "in_flight"} and gateway.in_flight.alive_until([turn_id])
    # When the client-tool timeout fails it
    gateway.clock.now += timedelta(seconds=TIMEOUT_SECONDS + 1)
    assert gateway.service.expire_overdue() == 1
    # Then it is out of flight: no marker, no slot
    assert admission.where(ORG, [turn_id]) == {turn_id: None}
    assert gateway.in_flight.alive_until([turn_id]) == {}


def test_a_batch_cancel_withdraws_its_held_turns_and_frees_the_slots_of_released_ones(gateway: Gateway) -> None:
    # Given a batch of 3 with two turns released (in flight, not started) and one still held
    admission = gateway.admission
    body = BatchRequest(requests=[BatchTurnRequest(input=str(index)) for index in range(3)])
    batch = gateway.batches.record(body, org_id=ORG, user_id=USER)
    released = admission.release(cap=2, limit=10, now=FIXED_NOW.timestamp())
    assert released is not None and len(released.turn_ids) == 2
    # When the batch is cancelled
    gateway.batches.cancel(batch.batch_id, org_id=ORG)
    # Then nothing of it is held or in flight any more: no turn of it will be released, no slot is taken
    counts = admission.counts()[ORG]
    assert (counts.held, counts.in_flight) == (0, 0)
    assert admission.release(cap=2, limit=10, now=FIXED_NOW.timestamp()) is None
