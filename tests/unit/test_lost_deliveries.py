"""Deliveries whose worker died (issue 25): a step whose worker died ``APTIX_STEP_MAX_DELIVERIES`` times
while it ran alone there is given up (its turn fails ``worker_lost``, its other copies are dropped, its
session lives on); deliveries lost beside other steps only make the step run alone next; a retried step
does not count; and a streaming turn's step run again after a lost delivery first withdraws the text
the lost run relayed. On in-process fakes: a lost delivery is a begin whose lease lapses at once and
that neither saves nor releases, as a worker killed mid-step leaves it (recorded as run alone, first,
when it ran alone)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

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
from workers.llm.types import LlmResponse
from workers.reconciler import frontier
from workers.text_relay import withdraw_lost_text

OTHER_TURN = "turn_" + "7" * 32


def _store(ctx: StepContext) -> MemoryStateStore:
    assert isinstance(ctx.states, MemoryStateStore)
    return ctx.states


def _events(ctx: StepContext, turn_id: str = TURN_ID) -> list[TurnEvent]:
    assert isinstance(ctx.events, MemoryTurnEventLog)
    return ctx.events.events(turn_id)


def _lose(ctx: StepContext, env: TurnEnvelope, *, alone: bool = False, relayed: tuple[str, ...] = ()) -> None:
    """One delivery of ``env`` whose worker died mid-step (running it ``alone`` in the process, or beside
    other steps), after relaying ``relayed`` as text deltas."""
    lease = Lease(env.turn_id, env.step_key, "dead-worker")
    start = _store(ctx).begin(lease, ttl_seconds=30)
    assert start.claimed
    if alone:
        assert _store(ctx).record_alone(lease)
    _store(ctx).lapse(lease)
    for delta in relayed:
        ctx.events.append(env.turn_id, "output_text.delta", {"delta": delta})


class _Watching(FakeLlm):
    """A FakeLlm that notes the step's delivery counts (deliveries, held back at, run alone) at each call."""

    def __init__(
        self, store: MemoryStateStore, env: TurnEnvelope, seen: list[tuple[int, int, int]], *answers: LlmResponse
    ) -> None:
        super().__init__(*answers)
        self._store, self._step, self._seen = store, (env.turn_id, env.step_key), seen

    def create(self, request: dict[str, Any]) -> LlmResponse:
        self._seen.append(self._store.deliveries[self._step])
        return super().create(request)


def _visible(events: list[TurnEvent]) -> str:
    kept: list[str] = []
    for event in events:
        if event.event == "output_text.delta":
            kept.append(event.data["delta"])
        elif event.event == "output_text.reset":
            del kept[len(kept) - event.data["deltas"] :]
    return "".join(kept)


# Poison steps


def test_a_step_whose_worker_died_on_each_of_its_deliveries_the_last_alone_fails_its_turn_worker_lost() -> None:
    # Given a turn whose model call killed its worker beside other steps, then each of three times it ran alone
    llm = FakeLlm(answer("never asked"))
    ctx = make_context(llm)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step)
    for _ in range(3):
        _lose(ctx, llm_step, alone=True)

    # When the message is delivered a fourth time
    with pytest.raises(TurnFailed) as failed:
        run_step(ctx, llm_step)

    # Then the step did not run, and the turn ended failed worker_lost, out of flight, with its event
    assert failed.value.code == "worker_lost"
    assert llm.requests == []
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status is TurnStatus.FAILED
    assert record.error is not None and record.error["code"] == ErrorCode.WORKER_LOST.value
    assert "on each of its 4 deliveries, 3 of them while it ran alone" in record.error["message"]
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
        _lose(ctx, llm_step, alone=True)
    with pytest.raises(TurnFailed):
        run_step(ctx, llm_step)

    drive(ctx, record_turn(ctx, "again", turn_id=OTHER_TURN, new_session=False))

    record = ctx.turns.get(OTHER_TURN)
    assert record is not None and record.status is TurnStatus.COMPLETED
    assert record.output_text == "the next turn's answer"


def test_a_re_drive_by_the_reconciler_counts_as_a_redelivery_does() -> None:
    # Given a step whose worker died twice while it ran alone, once after the broker's redelivery
    ctx = make_context(FakeLlm(answer("never asked")), step_max_deliveries=2)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step, alone=True)
    _lose(ctx, llm_step, alone=True)

    # When the reconciler finds the turn stalled and re-drives it from the frontier Redis recorded
    stalled = InFlightTurn(TURN_ID, TurnStatus.RUNNING, round=0, batch_id=None, redrives=0, org_id="o")
    redriven, source = frontier(stalled, ctx.states.load(TURN_ID), None)

    # Then its message is the same step, counted with the others: given up
    assert source == "redis" and redriven.step_key == llm_step.step_key
    with pytest.raises(TurnFailed):
        run_step(ctx, redriven)


def test_a_step_that_lost_fewer_deliveries_than_the_limit_runs_though_one_ran_alone() -> None:
    llm = FakeLlm(answer("made it"))
    ctx = make_context(llm, step_max_deliveries=3)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    for alone in (False, True):
        _lose(ctx, llm_step, alone=alone)

    drive(ctx, llm_step)  # its third delivery: held back, then run

    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status is TurnStatus.COMPLETED and record.output_text == "made it"


def test_a_step_runs_alone_only_once_it_lost_all_but_one_of_the_deliveries_that_give_it_up() -> None:
    # Given a step whose worker died once (the limit 3: it runs alone once it lost 2)
    ctx = make_context(step_max_deliveries=3)
    store = _store(ctx)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step)
    assert run_step(ctx, llm_step) is not None  # the hold-back
    seen: list[tuple[int, int, int]] = []
    ctx = replace(ctx, llm=_Watching(store, llm_step, seen, answer("made it"), answer("made it")))
    with ctx.gate.shared():  # an ordinary step runs in this process meanwhile: the step does not wait for it
        run_step(ctx, llm_step)
    # Then it ran beside it, not recorded as alone
    assert seen == [(2, 2, 0)]


def test_a_step_that_only_died_beside_other_steps_is_never_given_up() -> None:
    # Given a step whose worker died five times while it ran beside other steps (a poison step's neighbour)
    llm = FakeLlm(answer("made it"))
    ctx = make_context(llm, step_max_deliveries=1)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    for _ in range(5):
        _lose(ctx, llm_step)

    # When it is delivered again
    drive(ctx, llm_step)

    # Then it ran (alone, after its hold-back) and its turn completed
    record = ctx.turns.get(TURN_ID)
    assert record is not None and record.status is TurnStatus.COMPLETED and record.output_text == "made it"


def test_the_limit_is_a_setting() -> None:
    ctx = make_context(FakeLlm(answer("never asked")), step_max_deliveries=1)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step, alone=True)

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
    assert not store.record_alone(Lease(TURN_ID, lease.step_key, "other"))  # nor can it say it runs alone
    store.release(lease, why=Release.HELD_BACK)  # held back: not counted, and remembered
    again = store.begin(lease, ttl_seconds=30)
    assert (again.deliveries, again.held_back_at, again.lost_alone) == (2, 2, 0)
    assert store.record_alone(lease)  # this delivery runs alone, and its worker dies: the next one counts it
    store.lapse(lease)
    after = store.begin(lease, ttl_seconds=30)
    assert (after.deliveries, after.held_back_at, after.lost_alone) == (3, 2, 1)
    store.release(lease, why=Release.HELD_BACK)  # held back again: what ran alone stays counted
    assert store.begin(lease, ttl_seconds=30).lost_alone == 1
    store.release(lease)  # this one lived: everything goes
    assert store.begin(lease, ttl_seconds=30).lost_alone == 0


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


def test_a_suspect_step_runs_alone_and_says_so_before_it_runs() -> None:
    # Given a step whose worker died twice running it (the limit 3: a suspect), held back
    ctx = make_context(step_max_deliveries=3)
    store = _store(ctx)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step)
    _lose(ctx, llm_step)
    assert run_step(ctx, llm_step) is not None  # the hold-back
    seen: list[tuple[int, int, int]] = []
    ctx = replace(ctx, llm=_Watching(store, llm_step, seen, answer("made it")))

    # When it runs
    run_step(ctx, llm_step)

    # Then, while it ran, the store had recorded that this delivery ran alone
    assert seen == [(3, 3, 1)]


def test_an_ordinary_step_is_not_recorded_as_running_alone() -> None:
    ctx = make_context()
    store = _store(ctx)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    seen: list[tuple[int, int, int]] = []
    ctx = replace(ctx, llm=_Watching(store, llm_step, seen, answer("made it")))

    run_step(ctx, llm_step)

    assert seen == [(1, 0, 0)]


def test_a_suspect_that_cannot_run_alone_within_a_lease_is_sent_again_later() -> None:
    # Given a suspect step (two deliveries lost, the limit 3), held back once, and an ordinary step
    # running in this process
    llm = FakeLlm(answer("made it"))
    ctx = make_context(llm, step_lease_seconds=1, step_max_deliveries=3)
    llm_step = drive(ctx, record_turn(ctx), until=StepName.LLM_CALL)[-1].envelope
    _lose(ctx, llm_step)
    _lose(ctx, llm_step)
    assert run_step(ctx, llm_step) is not None
    with ctx.gate.shared():
        # When it is delivered again, and the ordinary step is still running a lease later
        later = run_step(ctx, llm_step)

    # Then it did not run: it is sent again within a lease, uncounted and not recorded as run alone
    assert later is not None and later.envelope == llm_step and 0 < later.countdown <= 1
    assert llm.requests == []
    assert _store(ctx).deliveries[(TURN_ID, llm_step.step_key)] == (2, 3, 0)
    # and the delivery after it runs (alone: nothing else runs now)
    following = run_step(ctx, llm_step)
    assert following is not None and following.envelope.step is StepName.REASONER


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
