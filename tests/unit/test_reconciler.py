"""The reconciler on in-process fakes: which turns it re-drives, from where, and when it gives up."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import fakeredis
import pytest

from shared.db.turns import InFlightTurn, NewTurn
from shared.models.envelope import BATCH_START_PRIORITY, TurnEnvelope
from shared.models.turn import TurnStatus
from shared.state import MemoryStateStore
from shared.state.admission import AdmissionQueue
from shared.state.keys import RECONCILER_LEADER_KEY
from shared.state.leader import LeaderLease
from shared.step_sender import StepSender
from shared.task_names import DEFAULT_TASK_BOUNDARIES, StepName
from shared.turn_events import MemoryTurnEventLog
from tests.unit.fakes import FIXED_NOW, Clock, FakeLlm, make_context, make_state, with_store
from workers.broker_watch import RedisBrokerWatch
from workers.context import StepContext
from workers.driver import run_step
from workers.llm.types import LlmResponse
from workers.reconciler import Reconciler, frontier

TURN_ID = "turn_" + "2" * 32


class _Sent(list[tuple[TurnEnvelope, float]]):
    """The broker of the reconciler's step sender: keeps each envelope with its countdown."""

    def publish(self, envelopes: Sequence[TurnEnvelope], *, countdown: float) -> None:
        self.extend((envelope, countdown) for envelope in envelopes)


def _reconciler(
    ctx: StepContext,
    clock: Clock | None = None,
    sent: _Sent | None = None,
    broker: fakeredis.FakeRedis | None = None,
    *,
    client: fakeredis.FakeRedis | None = None,
    owner: str = "unit",
    admission: AdmissionQueue | None = None,
) -> Reconciler:
    """A reconciler on ``ctx``'s ports; its leader lease (and the broker's sentinel note) on ``client``."""
    client = fakeredis.FakeRedis() if client is None else client
    return Reconciler(
        settings=ctx.settings,
        turns=ctx.turns,
        states=ctx.states,
        in_flight=ctx.in_flight,
        steps=StepSender(_Sent() if sent is None else sent, timers=ctx.timers, park_after=30),
        leader=LeaderLease(client, key=RECONCILER_LEADER_KEY, owner=owner),
        ending=replace(ctx.ending, admission=admission),
        broker=None
        if broker is None
        else RedisBrokerWatch(broker, client, owner=owner, boundaries=DEFAULT_TASK_BOUNDARIES),
        clock=clock or Clock(),
        admission=admission,
    )


def _accept(ctx: StepContext, *, batch: bool = False, turn_id: str = TURN_ID) -> None:
    ctx.turns.create(
        NewTurn(turn_id=turn_id, session_id="sess_" + turn_id[5:], org_id="o", user_id="u", new_session=True,
                requested_mode=None, request={"input": "hi"}, request_hash="h", batch_id="batch_1" if batch else None),
        now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
    )  # fmt: skip


def _in_flight(**fields: object) -> InFlightTurn:
    values: dict[str, object] = {
        "turn_id": TURN_ID,
        "status": TurnStatus.RUNNING,
        "round": 0,
        "batch_id": None,
        "redrives": 0,
    }
    values.update(fields)
    return InFlightTurn(**values)  # type: ignore[arg-type]


def test_frontier_prefers_the_newer_of_redis_and_the_checkpoint() -> None:
    older = make_state(
        next_envelope=TurnEnvelope(turn_id=TURN_ID, step=StepName.LLM_CALL, hop=4, iteration=1).model_dump()
    )
    newer = make_state(
        next_envelope=TurnEnvelope(turn_id=TURN_ID, step=StepName.REASONER, hop=5, iteration=1).model_dump()
    )
    assert frontier(_in_flight(), older, newer) == (TurnEnvelope.model_validate(newer.next_envelope), "checkpoint")
    assert frontier(_in_flight(), newer, older)[1] == "redis"


def test_frontier_is_the_rounds_first_step_when_nothing_is_recorded() -> None:
    envelope, source = frontier(_in_flight(round=2, batch_id="b"), None, make_state())
    assert source == "start" and envelope.step is StepName.REQUEST_HANDLER and envelope.round == 2


def test_stalled_queued_batch_turn_is_sent_again_at_batch_start_priority() -> None:
    clock = Clock()
    ctx = make_context(clock=clock)
    _accept(ctx, batch=True)
    sent = _Sent()
    clock.now = FIXED_NOW + timedelta(seconds=61)
    _reconciler(ctx, clock, sent).scan()
    assert [(e.step, e.priority) for e, _ in sent] == [(StepName.REQUEST_HANDLER, BATCH_START_PRIORITY)]
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.redrives == 1 and row.deadline_at is not None and row.deadline_at > clock.now


def test_turns_whose_markers_are_ahead_are_left_alone_and_their_deadlines_move_up() -> None:
    # Given running turns past their deadlines whose markers are ahead (a long step renewing its lease)
    clock = Clock()
    ctx = make_context(clock=clock)
    turn_ids = [TURN_ID[:-1] + str(index) for index in range(3)]
    for index, turn_id in enumerate(turn_ids):
        _accept(ctx, turn_id=turn_id)
        assert ctx.turns.mark_running(turn_id, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))
        ctx.in_flight.mark_alive([turn_id], until=(FIXED_NOW + timedelta(seconds=600 + index)).timestamp())
    sent = _Sent()
    clock.now = FIXED_NOW + timedelta(seconds=61)
    _reconciler(ctx, clock, sent).scan()
    # Then none is sent again, and each one's deadline moves up to its marker
    assert sent == []
    for index, turn_id in enumerate(turn_ids):
        row = ctx.turns.get(turn_id)
        assert row is not None and row.redrives == 0 and row.deadline_at is not None
        assert abs(row.deadline_at.timestamp() - (FIXED_NOW + timedelta(seconds=600 + index)).timestamp()) < 0.01


def test_a_queued_turns_deadline_moves_up_one_deadline_at_a_time_not_to_the_end_of_its_queued_window() -> None:
    clock = Clock()
    ctx = make_context(clock=clock)
    _accept(ctx)
    ctx.in_flight.mark_alive([TURN_ID], until=(FIXED_NOW + timedelta(hours=1)).timestamp())
    sent = _Sent()
    clock.now = FIXED_NOW + timedelta(seconds=61)
    _reconciler(ctx, clock, sent).scan()
    assert sent == []
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.deadline_at is not None
    assert row.deadline_at == clock.now + timedelta(seconds=ctx.settings.reconciler_deadline_seconds)


def test_running_turn_whose_message_was_lost_is_re_driven_from_its_recorded_next_step() -> None:
    clock = Clock()
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")), clock=clock)
    _accept(ctx)
    first = run_step(ctx, TurnEnvelope(turn_id=TURN_ID, step=StepName.REQUEST_HANDLER))
    assert first is not None  # ... and that message was lost
    sent = _Sent()
    clock.now = FIXED_NOW + timedelta(seconds=200)
    _reconciler(ctx, clock, sent).scan()
    assert [e for e, _ in sent] == [first.envelope]


class _WorkerKilled(BaseException):
    """The worker process died (nothing in the driver catches it)."""


class _DiesBeforeSaving(MemoryStateStore):
    def save(self, state: Any, **_options: Any) -> None:
        raise _WorkerKilled


def test_turn_whose_worker_died_in_its_first_step_is_re_driven_at_its_deadline_not_after_its_queued_window() -> None:
    # Given a queued turn with the gateway's marker, which covers a long wait in the broker
    clock = Clock()
    ctx = make_context(FakeLlm(LlmResponse(response_id="r", output_text="x")), clock=clock)
    ctx = with_store(ctx, _DiesBeforeSaving())
    _accept(ctx)
    ctx.in_flight.mark_alive([TURN_ID], until=(FIXED_NOW + timedelta(seconds=3600)).timestamp())

    # When a worker starts its first message, marks it running, and dies before saving its state
    with pytest.raises(_WorkerKilled):
        run_step(ctx, TurnEnvelope(turn_id=TURN_ID, step=StepName.REQUEST_HANDLER))
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.status == TurnStatus.RUNNING.value

    # Then the reconciler re-drives it once its running deadline passed, not an hour later
    sent = _Sent()
    clock.now = FIXED_NOW + timedelta(seconds=ctx.settings.reconciler_deadline_seconds + 1)
    _reconciler(ctx, clock, sent).scan()
    assert [(e.step, e.round) for e, _ in sent] == [(StepName.REQUEST_HANDLER, 0)]


def test_turn_that_never_moves_fails_internal_error_after_the_re_drive_limit() -> None:
    clock = Clock()
    ctx = make_context(clock=clock, reconciler_max_redrives=2)
    _accept(ctx)
    sent = _Sent()
    reconciler = _reconciler(ctx, clock, sent)
    for step in range(1, 5):
        clock.now = FIXED_NOW + timedelta(seconds=100 * step)
        ctx.in_flight.forget(TURN_ID)  # every re-driven message is lost too
        reconciler.scan()
    row = ctx.turns.get(TURN_ID)
    assert len(sent) == 2 and row is not None and row.status == "failed"
    assert row.error is not None and row.error["code"] == "internal_error" and "re-drives" in row.error["message"]


def test_a_turn_given_up_on_gets_its_event_and_leaves_flight_and_admission() -> None:
    # Given an interactive turn counted in flight whose every message is lost
    clock = Clock()
    ctx = make_context(clock=clock, reconciler_max_redrives=1)
    _accept(ctx)
    admission = AdmissionQueue(fakeredis.FakeRedis())
    admission.admit_now("o", [TURN_ID], now=FIXED_NOW.timestamp())
    reconciler = _reconciler(ctx, clock, admission=admission)
    # When the reconciler re-drives it once, then gives up on it
    for step in (1, 2):
        clock.now = FIXED_NOW + timedelta(seconds=100 * step)
        ctx.in_flight.forget(TURN_ID)
        reconciler.scan()
    # Then it failed, its end is in its event log, and it holds neither a marker nor a slot
    assert reconciler.stats.failed == 1
    assert isinstance(ctx.events, MemoryTurnEventLog)
    assert [event.event for event in ctx.events.events(TURN_ID)] == ["turn.failed"]
    assert ctx.in_flight.alive_until([TURN_ID]) == {}
    assert admission.where("o", [TURN_ID]) == {TURN_ID: None}


def test_markers_are_dropped_when_the_broker_lost_its_sentinel() -> None:
    clock = Clock()
    ctx = make_context(clock=clock)
    broker = fakeredis.FakeRedis()
    reconciler = _reconciler(ctx, clock, _Sent(), broker=broker)
    reconciler.scan()  # first run: sets the sentinel
    ctx.in_flight.mark_alive([TURN_ID], until=clock.now.timestamp() + 3600)
    reconciler.scan()
    assert ctx.in_flight.alive_until([TURN_ID])
    broker.flushdb()  # the broker restarted empty
    reconciler.scan()
    assert ctx.in_flight.alive_until([TURN_ID]) == {}


def test_only_one_copy_leads_until_its_lease_lapses() -> None:
    ctx = make_context()
    client = fakeredis.FakeRedis()
    copies = [_reconciler(ctx, client=client, owner=name) for name in ("a", "b")]
    assert [copy.lead() for copy in copies] == [True, False]
    client.delete("aptix:reconciler:leader")  # the leader died and its lease lapsed
    assert copies[1].lead() and not copies[0].lead()


def test_parked_message_is_sent_when_due() -> None:
    clock = Clock()
    ctx = make_context(clock=clock)
    sent = _Sent()
    reconciler = _reconciler(ctx, clock, sent)
    envelope = TurnEnvelope(turn_id=TURN_ID, step=StepName.LLM_CALL, hop=4, iteration=1, attempt=3)
    steps = StepSender(sent, timers=ctx.timers, park_after=30, clock=lambda: clock.now.timestamp())
    steps.send([envelope], countdown=45.0)
    assert sent == [] and reconciler.release_due() == 0
    clock.now = FIXED_NOW + timedelta(seconds=46)
    assert reconciler.release_due() == 1 and sent == [(envelope, 0.0)]


def test_a_parked_item_that_is_not_an_envelope_is_dropped_and_the_rest_are_sent() -> None:
    clock = Clock()
    ctx = make_context(clock=clock)
    sent = _Sent()
    envelope = TurnEnvelope(turn_id=TURN_ID, step=StepName.LLM_CALL, hop=4, iteration=1)
    ctx.timers.park("not json", due=0.0)
    ctx.timers.park(envelope.model_dump_json(), due=1.0)
    assert _reconciler(ctx, clock, sent).release_due() == 1 and sent == [(envelope, 0.0)]


def test_queued_turn_vouched_for_by_its_marker_is_re_driven_once_the_first_steps_queue_is_empty() -> None:
    # Given a queued turn past its deadline whose marker still vouches for its first message
    clock = Clock()
    ctx = make_context(clock=clock)
    _accept(ctx)
    ctx.in_flight.mark_alive([TURN_ID], until=(FIXED_NOW + timedelta(hours=1)).timestamp())
    broker = fakeredis.FakeRedis()
    sent = _Sent()
    reconciler = _reconciler(ctx, clock, sent, broker=broker)
    clock.now = FIXED_NOW + timedelta(seconds=61)
    # When the first step's queue still holds messages, the turn may be waiting there
    broker.lpush("pipeline\x06\x169", b"another turn's message")
    reconciler.scan()
    assert sent == []
    # Then, once that queue is empty, the turn cannot be waiting in it: it is re-driven at its next deadline
    broker.delete("pipeline\x06\x169")
    clock.now += timedelta(seconds=ctx.settings.reconciler_deadline_seconds + 1)
    reconciler.scan()
    assert [envelope.step for envelope, _ in sent] == [StepName.REQUEST_HANDLER]


def _admitting(ctx: StepContext, clock: Clock, sent: _Sent) -> tuple[Reconciler, AdmissionQueue]:
    admission = AdmissionQueue(fakeredis.FakeRedis())
    reconciler = _reconciler(ctx, clock, sent, admission=admission)
    return reconciler, admission


def test_a_held_batch_turn_past_its_deadline_waits_for_admission_not_for_a_redrive() -> None:
    clock = Clock()
    ctx = make_context(clock=clock)
    _accept(ctx, batch=True)
    sent = _Sent()
    reconciler, admission = _admitting(ctx, clock, sent)
    admission.hold("o", [TURN_ID])
    clock.now = FIXED_NOW + timedelta(seconds=61)
    reconciler.scan()
    assert sent == []
    row = ctx.turns.get(TURN_ID)
    assert row is not None and row.redrives == 0 and row.deadline_at is not None and row.deadline_at > clock.now
    assert admission.where("o", [TURN_ID]) == {TURN_ID: "held"}


def test_a_batch_turn_neither_held_nor_released_is_held_again_not_sent() -> None:
    clock = Clock()
    ctx = make_context(clock=clock)
    _accept(ctx, batch=True)  # as if Redis restarted empty: not held, not in flight
    sent = _Sent()
    reconciler, admission = _admitting(ctx, clock, sent)
    clock.now = FIXED_NOW + timedelta(seconds=61)
    reconciler.scan()
    assert sent == []
    assert admission.where("o", [TURN_ID]) == {TURN_ID: "held"}
    released = admission.release(cap=10, limit=10, now=clock.now.timestamp())
    assert released is not None and released.turn_ids == [TURN_ID]


def test_a_released_batch_turn_that_stalled_is_redriven_as_before() -> None:
    clock = Clock()
    ctx = make_context(clock=clock)
    _accept(ctx, batch=True)
    sent = _Sent()
    reconciler, admission = _admitting(ctx, clock, sent)
    admission.hold("o", [TURN_ID])
    admission.release(cap=10, limit=10, now=FIXED_NOW.timestamp())
    clock.now = FIXED_NOW + timedelta(seconds=61)
    reconciler.scan()
    assert [(e.step, e.priority) for e, _ in sent] == [(StepName.REQUEST_HANDLER, BATCH_START_PRIORITY)]
