"""Deliveries whose worker died (issue 25): a step delivered past ``APTIX_STEP_MAX_DELIVERIES`` without
ending is given up (its turn fails ``worker_lost``, its other copies are dropped, its session lives on);
a retried step does not count; and a streaming turn's step run again after a lost delivery first
withdraws the text the lost run relayed. On in-process fakes: a lost delivery is a begin whose lease
lapses at once and that neither saves nor releases, as a worker killed mid-step leaves it."""

from __future__ import annotations

import pytest

from shared.db.records import InFlightTurn
from shared.errors import LlmError, TurnFailed
from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnStatus
from shared.result import ErrorCode
from shared.state import Lease, MemoryStateStore, Release
from shared.task_names import StepName
from shared.turn_events import MemoryTurnEventLog, TurnEvent
from tests.unit.fakes import TURN_ID, FakeLlm, answer, drive, make_context, record_turn
from workers.context import StepContext
from workers.driver import run_step
from workers.reconciler import frontier
from workers.text_relay import withdraw_lost_text

OTHER_TURN = "turn_" + "7" * 32


def _store(ctx: StepContext) -> MemoryStateStore:
    assert isinstance(ctx.states, MemoryStateStore)
    return ctx.states


def _events(ctx: StepContext, turn_id: str = TURN_ID) -> list[TurnEvent]:
    assert isinstance(ctx.events, MemoryTurnEventLog)
    return ctx.events.events(turn_id)


def _lose(ctx: StepContext, env: TurnEnvelope, *, relayed: tuple[str, ...] = ()) -> None:
    """One delivery of ``env`` whose worker died mid-step, after relaying ``relayed`` as text deltas."""
    start = ctx.states.begin(Lease(env.turn_id, env.step_key, "dead-worker"), ttl_seconds=0)
    assert start.claimed
    for delta in relayed:
        ctx.events.append(env.turn_id, "output_text.delta", {"delta": delta})


def _visible(events: list[TurnEvent]) -> str:
    kept: list[str] = []
    for event in events:
        if event.event == "output_text.delta":
            kept.append(event.data["delta"])
        elif event.event == "output_text.reset":
            del kept[len(kept) - event.data["deltas"] :]
    return "".join(kept)


# Poison steps


def test_a_step_whose_worker_died_on_each_of_its_deliveries_fails_its_turn_worker_lost() -> None:
    # Given a turn whose model call killed its worker on each of its three deliveries
    llm = FakeLlm(answer("never asked"))
    ctx = make_context(llm)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    for _ in range(3):
        _lose(ctx, llm_step)

    # When the message is delivered a fourth time
    with pytest.raises(TurnFailed) as failed:
        run_step(ctx, llm_step)

    # Then the step did not run, and the turn ended failed worker_lost, out of flight, with its event
    assert failed.value.code == "worker_lost"
    assert llm.requests == []
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status is TurnStatus.FAILED
    assert record.error is not None and record.error["code"] == ErrorCode.WORKER_LOST.value
    assert "3 deliveries" in record.error["message"]
    assert [event.event for event in _events(ctx)][-1] == "turn.failed"
    assert TURN_ID not in _store(ctx).markers
    # and another copy of the message is dropped without running the step or failing anything again
    assert run_step(ctx, llm_step) is None
    assert llm.requests == []


def test_the_session_of_a_turn_given_up_takes_its_next_turn() -> None:
    llm = FakeLlm(answer("the next turn's answer"))
    ctx = make_context(llm)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    for _ in range(3):
        _lose(ctx, llm_step)
    with pytest.raises(TurnFailed):
        run_step(ctx, llm_step)

    drive(ctx, record_turn(ctx, "again", turn_id=OTHER_TURN, new_session=False))

    record = ctx.turns.get(OTHER_TURN)
    assert record is not None and record.status is TurnStatus.COMPLETED
    assert record.output_text == "the next turn's answer"


def test_a_re_drive_by_the_reconciler_counts_as_a_redelivery_does() -> None:
    # Given a step whose worker died twice, once after the broker's redelivery
    ctx = make_context(FakeLlm(answer("never asked")), step_max_deliveries=2)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step)
    _lose(ctx, llm_step)

    # When the reconciler finds the turn stalled and re-drives it from the frontier Redis recorded
    stalled = InFlightTurn(TURN_ID, TurnStatus.RUNNING, round=0, batch_id=None, redrives=0, org_id="o")
    redriven, source = frontier(stalled, ctx.states.load(TURN_ID), None)

    # Then its message is the same step, counted with the others: given up
    assert source == "redis" and redriven.step_key == llm_step.step_key
    with pytest.raises(TurnFailed):
        run_step(ctx, redriven)


def test_a_step_delivered_up_to_the_limit_runs() -> None:
    llm = FakeLlm(answer("made it"))
    ctx = make_context(llm, step_max_deliveries=3)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    for _ in range(2):
        _lose(ctx, llm_step)

    drive(ctx, llm_step)  # its third delivery

    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status is TurnStatus.COMPLETED and record.output_text == "made it"


def test_the_limit_is_a_setting() -> None:
    ctx = make_context(FakeLlm(answer("never asked")), step_max_deliveries=1)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step)

    with pytest.raises(TurnFailed):
        run_step(ctx, llm_step)


def test_retries_of_a_step_are_not_lost_deliveries() -> None:
    # Given a model that answers 429 five times (more than the limit of lost deliveries), then answers
    busy = [LlmError("slow down", status_code=429, retryable=True) for _ in range(5)]
    llm = FakeLlm(*busy, answer("patience"))
    ctx = make_context(llm, step_max_deliveries=2)

    # When the turn runs, its model call sent again after each 429 (and its worker died once, too)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step)
    drive(ctx, llm_step)

    # Then the retries counted nothing: the turn completed
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status is TurnStatus.COMPLETED and record.output_text == "patience"
    assert len(llm.requests) == 6


def test_a_step_ended_in_a_live_worker_starts_its_count_again() -> None:
    store = MemoryStateStore()
    lease = Lease(TURN_ID, "0:4:llm_call:1", "w")
    assert store.begin(lease, ttl_seconds=0).deliveries == 1
    assert store.begin(lease, ttl_seconds=30).deliveries == 2  # the first worker died
    store.release(lease)  # this one lived (an outage, say): the count goes with the lease
    assert store.begin(lease, ttl_seconds=30).deliveries == 1
    store.release(lease, why=Release.GIVEN_UP)  # a step given up keeps its count past the limit
    assert store.begin(lease, ttl_seconds=30).deliveries == 2
    busy = store.begin(Lease(TURN_ID, lease.step_key, "other"), ttl_seconds=30)
    assert not busy.claimed and busy.deliveries == 0  # a copy that finds the step running does not count
    store.release(lease, why=Release.HELD_BACK)  # held back: not counted, and remembered
    again = store.begin(lease, ttl_seconds=30)
    assert (again.deliveries, again.held_back_at) == (2, 2)


def test_a_step_whose_last_delivery_was_lost_is_sent_again_a_while_later_and_then_runs() -> None:
    # Given a step whose worker died running it (beside others, maybe)
    llm = FakeLlm(answer("made it"))
    ctx = make_context(llm, step_max_deliveries=3)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step)

    # When it is delivered again
    later = run_step(ctx, llm_step)

    # Then it does not run now: it is sent again, within a lease, uncounted; and that delivery runs
    assert later is not None and later.envelope == llm_step
    assert 0 < later.countdown <= ctx.settings.step_lease_seconds
    assert llm.requests == []
    following = run_step(ctx, llm_step)
    assert following is not None and following.envelope.step is StepName.REASONER
    assert len(llm.requests) == 1


# Streamed text after a lost delivery


def test_a_streaming_step_run_again_after_its_worker_died_withdraws_the_lost_runs_text_first() -> None:
    # Given a streaming turn whose model call's worker died after relaying two deltas, twice
    llm = FakeLlm(answer("The whole answer."))
    ctx = make_context(llm, llm_stream_flush_ms=0)
    llm_step = drive(ctx, record_turn(ctx, stream=True), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step, relayed=("The", " whole"))
    _lose(ctx, llm_step, relayed=("The",))

    # When the step runs again and the turn ends
    drive(ctx, llm_step)

    # Then the lost runs' text was withdrawn (once, all of it) before the new run's, and the deltas join to the answer
    events = _events(ctx)
    text = [(event.event, event.data) for event in events if event.event.startswith("output_text.")]
    assert text[:4] == [
        ("output_text.delta", {"delta": "The"}),
        ("output_text.delta", {"delta": " whole"}),
        ("output_text.delta", {"delta": "The"}),
        ("output_text.reset", {"deltas": 3}),
    ]
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.output_text == _visible(events) == "The whole answer."


def test_withdrawing_lost_text_keeps_the_text_of_calls_that_saved() -> None:
    log = MemoryTurnEventLog()
    log.append(TURN_ID, "output_text.delta", {"delta": "Earlier call. "})
    log.append(TURN_ID, "trace", {"kind": "llm_call"})  # that call's step saved
    for delta in ("Lost", " run", "Lost"):
        log.append(TURN_ID, "output_text.delta", {"delta": delta})
        if delta == " run":
            log.append(TURN_ID, "output_text.reset", {"deltas": 2})  # an earlier withdrawal

    assert withdraw_lost_text(log, TURN_ID) == 1
    assert _visible(log.events(TURN_ID)) == "Earlier call. "
    assert withdraw_lost_text(log, TURN_ID) == 0  # nothing left to withdraw: nothing appended
    assert [event.event for event in log.events(TURN_ID)].count("output_text.reset") == 2


def test_withdrawing_reads_the_log_page_by_page() -> None:
    log = MemoryTurnEventLog()
    log.append(TURN_ID, "trace", {"kind": "compose"})
    for index in range(450):
        log.append(TURN_ID, "output_text.delta", {"delta": f"{index} "})

    assert withdraw_lost_text(log, TURN_ID) == 450
    assert _visible(log.events(TURN_ID)) == ""
