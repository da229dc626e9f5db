"""run_step: the one driver every step task goes through, and where the retry policy's decisions are applied.

It takes the step's lease, counts the delivery and loads the turn state in one Redis round trip (the
state from Redis; else from the turn's durable checkpoint when the message is the step that checkpoint
carries on with; else, for the turn's first message, from the recorded request), skips a step that
already ran (redelivery), gives up a step whose worker died on each of its last
``APTIX_STEP_MAX_DELIVERIES`` deliveries, the last while the step ran alone in it (a poison step: its
turn fails ``worker_lost``), sends a step whose last delivery was lost again a random while later (apart
from the steps that died with it), runs a step that lost all but one of those deliveries alone in its
worker process (:mod:`workers.process_gate`), withdraws the text a lost run of a streaming
turn's step relayed before the step runs again, keeps the lease renewed (by the process's one
:class:`~workers.leases.LeaseRenewer`), runs the step and, in the same task, the steps after it that
belong to the same task (``shared.task_names.same_task``: by default the same layer, the AGN-032 entry steps
being one; with ``APTIX_TASK_BOUNDARIES=queue`` every following step on the same queue, with ``call`` every
following step up to the next model or tool call, the state saved after a model call that others follow, and a
round's entry delivered on the model call's queue running on into that call), writes
a durable checkpoint as a task that ran a step the step map marks ends (none when the task went on to the
turn's commit, which writes the state itself), hands the webhook deliveries a ``persist``
step's commit recorded to the webhooks queue, records each outcome and the turn's frontier (the next
message), saves the state once (moving the turn's in-flight marker and giving the lease back, in one
more round trip; when the chain ends there, the same write frees the turn's admission slot) and says
which message to send next. What the steps did is counted (:mod:`workers.metrics`) once that save
succeeded: a step runs again when its save failed, and a redelivered step that already ran is counted as
a redelivery only.

Every kind of "not now" ends here: the step's RetryAfter (the model could not answer), a step leased by
another worker, a turn whose row is not visible yet, an unreachable Redis or database. The driver
names the trouble and applies what the retry policy (:func:`workers.retry.decide`) decides: the same
message sent again later, the turn failed, or the message dropped. It is the only place an unexpected
exception becomes ``internal_error``.

A step that fails its turn still hands on a message (persist records the failure); the
:class:`Dispatch` says the turn failed, so the task can report the failure to Celery *after* sending
that message (Flower then shows the step's task as failed, and its Failed filter finds the turn).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager, nullcontext
from dataclasses import dataclass, replace

import redis
from sqlalchemy.exc import DBAPIError

from shared.errors import StateConflict, StepBusy, TurnFailed, TurnNotRecorded
from shared.logging import bind, log_context
from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, ErrorInfo, InvokeResult, failure
from shared.state import Lease, Release, TurnState
from shared.task_names import LAYER_OF, Layer, Queue, StepName, entry_call_after, same_task, step_queue
from workers import retry
from workers.context import StepContext
from workers.metrics import MessageTally
from workers.next_step import Continue, Next, RetryAfter, Stop
from workers.step_map import ALWAYS_ALLOWED, STEP_MAP
from workers.steps import request_handler, session_context_resolver, session_creator
from workers.text_relay import withdraw_lost_text
from workers.trace import trace

__all__ = ["Dispatch", "fail_turn", "run_step"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A message the caller must send, after ``countdown`` seconds."""

    envelope: TurnEnvelope
    countdown: float = 0.0
    failed: ErrorInfo | None = None
    """The error this step failed the turn with (the message then persists the failure), else None."""
    sent: bool = False
    """Whether the save already put the message on its queue (a broker beside the state store)."""
    acked: bool = False
    """Whether that save also acknowledged the message the step ran from (``shared.state.BrokerPush.ack``)."""


def run_step(
    ctx: StepContext,
    env: TurnEnvelope,
    *,
    delivery_tag: str | None = None,
    tally: MessageTally | None = None,
    queue: str | None = None,
) -> Dispatch | None:
    """Run one step of one turn; ``delivery_tag``: the broker's tag of the message it came in, which the
    save that ends the step acknowledges when it also sends the next message (:func:`_save`); ``tally``
    (a new one when None) collects the steps the message ran, each with its time (what the task reports);
    ``queue``: the queue the message came on (None: the one its step goes on here, ``step_queue``). A round's
    entry that came on the model call's queue runs on into the round's first call (``same_task``'s
    ``entry_call``); one that came on another (a gateway whose ``APTIX_TASK_BOUNDARIES`` differs) sends it.

    Returns:
        The message to send next (possibly this same step, later), or None when the chain ends,
        the turn is unknown, or a message is dropped.

    Raises:
        TurnFailed: the turn could not run outside any step and is now recorded as failed
            (``internal_error``); there is nothing to send.
    """
    slot = nullcontext() if ctx.batch_slots is None else ctx.batch_slots.held(env.priority)
    with log_context(turn_id=env.turn_id, step=env.step.value, iteration=env.iteration), slot:
        try:
            entry_call = _entry_call(ctx, env, queue)
            return _run(ctx, env, delivery_tag, MessageTally() if tally is None else tally, entry_call)
        except TurnFailed:
            raise  # the step was given up on (``worker_lost``): its turn is recorded as failed
        except Exception as exc:
            trouble = retry.trouble_of(exc)
            if trouble is retry.Trouble.INFRASTRUCTURE:
                logger.warning("step %s of turn %s: %s; running it again later", env.step_key, env.turn_id, _name(exc))
            if trouble is not None:
                return _later(ctx, env, trouble)
            # outside any step (loading, saving): fail the turn rather than strand it
            logger.exception("turn %s could not run %s", env.turn_id, env.step_key)
            return _fail_outside_step(ctx, env)


def fail_turn(ctx: StepContext, turn_id: str, message: str) -> None:
    """End an unfinished turn as failed (``internal_error``) when the pipeline cannot carry it on."""
    ctx.ending.end(turn_id, ErrorInfo(code=ErrorCode.INTERNAL_ERROR, message=message))


def _entry_call(ctx: StepContext, env: TurnEnvelope, queue: str | None) -> bool:
    """Whether ``env``'s task may run a model call after its own steps: a round's entry that came on the model
    call's queue (``queue``; None: where this process would send it)."""
    if LAYER_OF[env.step] is not Layer.ENTRY:
        return False
    if queue is None:
        return step_queue(env.step, ctx.settings.task_boundaries) is Queue.LLM
    return queue == Queue.LLM.value


def _run(
    ctx: StepContext, env: TurnEnvelope, delivery_tag: str | None, tally: MessageTally, entry_call: bool
) -> Dispatch | None:
    lease = Lease(env.turn_id, env.step_key, owner=f"{ctx.hostname}:{uuid.uuid4().hex}")
    start = ctx.states.begin(
        lease,
        ttl_seconds=ctx.settings.step_lease_seconds,
        check_cancel=env.step is not StepName.PERSIST,
        alive_until=ctx.alive_until(),
    )
    if start.cancelled:
        logger.info("turn %s was cancelled; stopping at %s", env.turn_id, env.step_key)
        return None
    if not start.claimed:
        raise StepBusy(env.step_key)
    saved, release = False, Release.ENDED
    try:
        with ctx.leases.holding(lease), ExitStack() as gate:
            lost, limit = start.deliveries - 1, ctx.settings.step_max_deliveries
            if lost >= limit and start.lost_alone:
                release = Release.GIVEN_UP
                _give_up(ctx, env, lost=lost, alone=start.lost_alone)
                return None
            if lost and start.held_back_at != start.deliveries:
                release = Release.HELD_BACK
                return _hold_back(ctx, env)
            if not gate.enter_context(_through_gate(ctx, lease, suspect=lost >= max(1, limit - 1))):
                release = Release.HELD_BACK
                return _hold_back(ctx, env)
            state = start.state
            if state is not None and _behind(state, env):
                # the save that sent this message was lost (a Redis failover that did not replicate it, a restart from
                # an older dump), or a pause's last save has not landed (a slow link) or never will (its worker died):
                # the state is from before the message, as if Redis had lost it; a late save is refused
                logger.warning("turn %s: Redis holds a state from before %s; carrying on from the checkpoint",
                               env.turn_id, env.step_key)  # fmt: skip
                ctx.states.drop(env.turn_id)
                state = None
            state = state or _load_durable(ctx, env)
            if state is None:
                return None
            bind(session_id=state.session_id, org_id=state.org_id)
            if env.step_key in state.steps_done:
                logger.info("step %s already ran; passing the turn on", env.step_key)
                ctx.metrics.count_redelivered(env.step)
                return _recorded(ctx, state, env, entry_call=entry_call)
            if start.deliveries > 1 and state.stream:  # a worker died running it: maybe while relaying text
                withdraw_lost_text(ctx.events, env.turn_id)
            dispatch = _run_layer(ctx, env, state, tally, entry_call=entry_call)
            dispatch = _save(ctx, state, lease, dispatch, delivery_tag, tally)
            saved = True
            ctx.metrics.count_message(tally)
            return dispatch
    finally:
        if not saved:
            try:
                ctx.leases.release(lease, why=release)
            except redis.RedisError:
                logger.warning("could not release the lease of %s; it lapses by itself", env.step_key)


def _give_up(ctx: StepContext, env: TurnEnvelope, *, lost: int, alone: int) -> None:
    """End the turn ``worker_lost``: the worker running its step died on each of its ``lost`` deliveries, ``alone`` of
    them while the step ran alone in it (so the step itself killed it).

    The step does not run (it would kill this worker too). The turn ends as every early end does
    (:class:`~shared.turn_ending.TurnEnding`: database, webhook, event, in-flight marker, admission
    slot); its session lives on. The step's delivery count stays past the limit (the caller releases
    the lease ``Release.GIVEN_UP``), so every other copy of its message comes here too and is dropped.

    Raises:
        TurnFailed: this delivery ended the turn (the task reports the failure to Celery).
    """
    message = (
        f"step {env.step.value!r} was given up: the worker running it died (killed, crashed or out of memory) "
        f"on each of its {lost} deliveries, {alone} of them while it ran alone in its worker process"
    )
    error = ErrorInfo(code=ErrorCode.WORKER_LOST, message=message)
    ended = ctx.ending.end(env.turn_id, error, only_if=TurnStatus.in_flight())
    if ended is None:
        logger.info("step %s of turn %s was given up and its turn has ended: dropping it", env.step_key, env.turn_id)
        return
    logger.error("turn %s failed worker_lost: %s", env.turn_id, message)
    raise TurnFailed(ErrorCode.WORKER_LOST.value, message) from None


def _hold_back(ctx: StepContext, env: TurnEnvelope) -> Dispatch:
    """Send a step whose last delivery was lost again a random while later, instead of running it now.

    A worker that dies takes every step it was running with it, and the broker gives them back together:
    without this, the steps that died beside a poison step would be taken together again, by one worker,
    to wait in line there to run alone, and die again with the poison step if it went first. Sent again
    at a random time within a lease (``APTIX_STEP_LEASE_SECONDS``), each arrives apart from the others,
    so only the step that kills its worker keeps losing deliveries. The caller releases the lease
    ``Release.HELD_BACK``: this delivery is not counted, and the next one runs (alone:
    :func:`_through_gate`). A delivery that waited a lease for its turn to run alone is sent again the
    same way.
    """
    countdown = ctx.random() * ctx.settings.step_lease_seconds
    logger.info("step %s of turn %s lost its last delivery; running it in %.1fs", env.step_key, env.turn_id, countdown)
    return Dispatch(env, countdown=countdown)


@contextmanager
def _through_gate(ctx: StepContext, lease: Lease, *, suspect: bool) -> Iterator[bool]:
    """Run the body beside this process's other steps or, for a ``suspect`` (it lost all but one of the
    deliveries that give it up: ``APTIX_STEP_MAX_DELIVERIES`` - 1, at least one), alone in it, recorded as
    such in Redis (one round trip): should this process die while the body runs, the step killed it, and
    its next delivery counts that (``StepStart.lost_alone``). A step that lost fewer runs beside the
    others: a worker that dies loses every step it runs, and most of them run again at once, sharing.

    A suspect waits at most a lease (``APTIX_STEP_LEASE_SECONDS``, renewed meanwhile) for the steps
    running here to finish; past that it yields False and the caller sends it again later.
    """
    if not suspect:
        with ctx.gate.shared():
            yield True
        return
    with ctx.gate.alone(timeout=ctx.settings.step_lease_seconds) as alone:
        if alone:
            logger.info("step %s of turn %s lost its last delivery; running it alone", lease.step_key, lease.turn_id)
            if not ctx.leases.record_alone(lease):
                logger.warning("lost the lease of %s of turn %s before it ran", lease.step_key, lease.turn_id)
        else:
            logger.info("step %s of turn %s could not run alone within a lease", lease.step_key, lease.turn_id)
        yield alone


def _run_layer(
    ctx: StepContext, env: TurnEnvelope, state: TurnState, tally: MessageTally, *, entry_call: bool
) -> Dispatch | None:
    """Run ``env``'s step, then inline each next step of the same task (``APTIX_TASK_BOUNDARIES``: the same layer,
    the same queue, or up to the next call; ``entry_call``: a round's entry on the model call's queue, whose task
    runs that call too); the message that leaves the task."""
    current = env
    boundaries = ctx.settings.task_boundaries
    unwritten = False  # a model answer this task has not checkpointed in the database yet
    kept: str | None = None  # the state as this task's model answer left it, while the steps after it run
    try:
        while True:
            with log_context(step=current.step.value, iteration=current.iteration):
                started = time.perf_counter()
                result = _invoke(ctx, current, state)
                seconds = time.perf_counter() - started
                tally.steps.append((current.step, seconds))
                stop = result.value if result.ok and isinstance(result.value, Stop) else None
                if (current is not env or LAYER_OF[env.step] is Layer.ENTRY) and stop is None:
                    # a step that is not a hop of its own still shows in the trace, with its time and worker (not
                    # the step that ends the chain: it committed the trace, and a record after that would not be kept)
                    trace(ctx, state, current, "layer_step", duration_ms=seconds * 1000)
                if stop is not None and stop.committed is not None:
                    tally.committed, tally.error, tally.tokens = stop.committed, state.error, stop.tokens
                    if ctx.webhook_sender is not None:  # the commit's outbox rows: committed, whatever this save does
                        ctx.webhook_sender.send(stop.deliveries)
                dispatch, answered = _conclude(ctx, current, state, result, tally)
                # the turn's commit wrote its state (or it had ended otherwise and needs no checkpoint)
                unwritten = (unwritten or answered) and stop is None
            if (
                dispatch is None
                or dispatch.countdown
                or not same_task(current.step, dispatch.envelope.step, boundaries, entry_call=entry_call)
                or dispatch.failed is not None  # a failed step ends its task, which reports the failure
            ):  # (a persist that raised runs again as a message of its own)
                if unwritten:
                    _checkpoint(ctx, state)
                return dispatch
            if STEP_MAP[current.step].checkpoint:
                # a step whose work costs (the model's answer) is kept here while the steps after it in the task run,
                # not saved: the task's last save, its checkpoint or the commit holds it. Should a later step meet
                # trouble, the kept state is saved before the message goes back (:func:`_keep`), so the next delivery
                # finds the step done and sends on the step after it rather than asking the model again
                kept = state.model_dump_json()
            current = dispatch.envelope
            entry_call = entry_call_after(current.step, entry_call)
    except Exception:
        if kept is not None:
            _keep(ctx, kept)
        raise


def _keep(ctx: StepContext, kept: str) -> None:
    """Save the state a model's answer left (``kept``, JSON), as its task hands its message back after a trouble in
    a later step; when that save cannot be made, the next delivery asks the model again."""
    answered = TurnState.model_validate_json(kept)
    try:
        ctx.states.save(answered, ttl_seconds=ctx.state_ttl_seconds, alive_until=ctx.alive_until())
    except (redis.RedisError, StateConflict) as exc:
        logger.warning("turn %s: could not keep the model's answer (%s); the model is asked again", answered.turn_id,
                       _name(exc))  # fmt: skip


def _save(
    ctx: StepContext,
    state: TurnState,
    lease: Lease,
    dispatch: Dispatch | None,
    delivery_tag: str | None,
    tally: MessageTally,
) -> Dispatch | None:
    """Save the state, moving the turn's in-flight marker and giving the lease back, in one round trip;
    the message to send next, marked sent when the same write put it on its queue.

    When no message follows (the turn finished or paused), the same write takes the turn out of
    flight: its marker goes and it leaves its organisation's admission slot (``shared.state.admission``),
    and merges what its commit wrote of its tokens (``tally.tokens``) into its organisation's count of the day.
    When the broker is the state store's Redis server, the same write sends the next message
    (``StepSender.push``) and acknowledges the one the step came in (``delivery_tag``): both happen if
    and only if the state was written, and the task sends nothing (nor does its ack touch Redis); the
    save that ends the chain acknowledges its message so too (``tally.acked``).
    """
    if dispatch is None:
        ack = ctx.push(None, 0.0, delivery_tag)  # None without a tag, or a broker the save cannot reach
        ctx.states.save(
            state, ttl_seconds=ctx.state_ttl_seconds, release=lease, leave_admission=True, push=ack, tokens=tally.tokens
        )
        tally.acked = ack is not None
        return None
    alive_until = ctx.alive_until(dispatch.countdown)
    push = ctx.push(dispatch.envelope, dispatch.countdown, delivery_tag)
    ctx.states.save(state, ttl_seconds=ctx.state_ttl_seconds, alive_until=alive_until, release=lease, push=push)
    return dispatch if push is None else replace(dispatch, sent=True, acked=push.ack is not None)


def _load_durable(ctx: StepContext, env: TurnEnvelope) -> TurnState | None:
    """The state of a turn Redis does not have: its checkpoint, or for its first message its request.

    A first message starts its turn (status ``running``, a fresh reconciler deadline): a turn that never
    started (the rule) is started and read in one statement, which also creates a new session's row (the session
    creator step then only records it), and has no checkpoint. One that did start
    (a worker died on this message) has its deadline pushed, and carries on from its checkpoint if it has
    one; one that finished meanwhile (cancelled, expired) is not run.
    """
    first_message = env.step is StepName.REQUEST_HANDLER and env.round == 0
    row = None
    if first_message:
        modes = session_creator.session_modes(ctx.catalog)
        started = ctx.turns.start(env.turn_id, now=ctx.clock(), deadline_at=ctx.deadline(), modes=modes)
        if started is not None:
            state = request_handler.initial_state(started.turn)
            if started.created_mode is not None:  # a new session's row, in the same write (the creator step's)
                state.session_created, state.mode = True, started.created_mode
            return state
        row = ctx.turns.get(env.turn_id)
        if row is None:
            raise TurnNotRecorded(env.turn_id)
        if not ctx.turns.mark_running(env.turn_id, now=ctx.clock(), deadline_at=ctx.deadline()):
            logger.info("turn %s ended (%s) before it started; dropping %s", env.turn_id, row.status, env.step_key)
            return None
    checkpoint = ctx.turns.load_snapshot(env.turn_id)
    if checkpoint is not None:
        state = TurnState.model_validate(checkpoint)
        if not _carries_on(state, env):
            logger.warning(
                "turn %s: Redis has no state and %s is not where its checkpoint carries on; dropping it "
                "(the reconciler re-drives the turn from the checkpoint)",
                env.turn_id,
                env.step_key,
            )
            return None
        logger.info("carrying turn %s on from its database checkpoint at %s", env.turn_id, env.step_key)
        state.version = 0
        session_context_resolver.load_history(ctx, state)
        return state
    if row is not None:
        return request_handler.initial_state(row)
    logger.warning("no state for turn %s; dropping %s", env.turn_id, env.step_key)
    return None


def _behind_its_pause(state: TurnState, env: TurnEnvelope) -> bool:
    """Whether ``state``, found in Redis by ``env``, a tool-results re-entry, is from before the pause it resumes: an
    earlier round's state that is not the paused one (the gateway takes results only for a turn its commit paused)."""
    return (
        env.step is StepName.REQUEST_HANDLER
        and env.round > state.round
        and state.status is not TurnStatus.REQUIRES_CLIENT_TOOLS
    )


def _behind(state: TurnState, env: TurnEnvelope) -> bool:
    """Whether ``state``, found in Redis by ``env``, is from before the save that sent ``env``: a state from before the
    pause a re-entry resumes, or one ``env`` neither ran on nor is where it carries on (every step's save records it in
    ``steps_done`` and sends on only after the save, so only a lost save leaves a message ahead of its state)."""
    return _behind_its_pause(state, env) or (env.step_key not in state.steps_done and not _carries_on(state, env))


def _carries_on(checkpoint: TurnState, env: TurnEnvelope) -> bool:
    """Whether ``env`` is the message a turn restored from ``checkpoint`` runs next."""
    if env.round > checkpoint.round:
        return env.step is StepName.REQUEST_HANDLER  # a tool-results re-entry of the paused turn
    frontier = checkpoint.next_envelope
    return frontier is not None and TurnEnvelope.model_validate(frontier).step_key == env.step_key


def _recorded(ctx: StepContext, state: TurnState, env: TurnEnvelope, *, entry_call: bool) -> Dispatch | None:
    """What a redelivered message must send again: the message that left its task, unless it arrived
    (``entry_call``: the task ran the round's first model call too, as :func:`_run_layer`). Before it sends
    on from a model's answer, the answer is checkpointed: the lost run may have ended between its save to
    Redis and its checkpoint (where it did not, the stored checkpoint is as far on and stays)."""
    current, answered = env, False
    while True:
        answered = answered or STEP_MAP[current.step].checkpoint
        sent = state.steps_done[current.step_key]
        if sent is None:
            return None
        following = TurnEnvelope.model_validate(sent)
        if following.step_key not in state.steps_done:
            if answered:
                _checkpoint(ctx, state)
            return Dispatch(following)
        if not same_task(current.step, following.step, ctx.settings.task_boundaries, entry_call=entry_call):
            return None  # that message arrived: the chain moved on
        current = following  # a step this message's task ran inline
        entry_call = entry_call_after(current.step, entry_call)


def _invoke(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    spec = STEP_MAP.get(env.step)
    if spec is None:
        return failure(ErrorCode.INTERNAL_ERROR, f"no step {env.step.value!r} in the step map")
    try:
        result = spec.run(ctx, env, state)
    except Exception as exc:
        if retry.trouble_of(exc) is not None:
            raise  # not now: run_step asks the retry policy
        # the one place a bug becomes a failed turn instead of a stuck one
        logger.exception("step %s of turn %s raised", env.step_key, env.turn_id)
        return failure(ErrorCode.INTERNAL_ERROR, f"step {env.step.value!r} failed unexpectedly")
    if result.ok and isinstance(result.value, Continue):
        allowed = spec.next | ALWAYS_ALLOWED
        if result.value.step not in allowed:
            logger.error("step %s may not move to %s", env.step.value, result.value.step.value)
            return failure(ErrorCode.INTERNAL_ERROR, f"step {env.step.value!r} made a move the step map forbids")
    return result


def _conclude(
    ctx: StepContext, env: TurnEnvelope, state: TurnState, result: InvokeResult[Next], tally: MessageTally
) -> tuple[Dispatch | None, bool]:
    """Record ``env``'s outcome in ``state``; the message that follows, and whether the step's work is one the
    database must keep (a step the step map marks ``checkpoint`` moved on: :func:`_checkpoint` before the task ends)."""
    dispatch: Dispatch | None
    if not result.ok:
        assert result.error is not None
        dispatch = _fail(ctx, env, state, result.error)
    elif isinstance(result.value, RetryAfter):
        dispatch = _retry_step(ctx, env, state, result.value, tally)
    else:
        dispatch = _dispatch_for(env, result.value)
    moved_on = dispatch is None or dispatch.envelope.step_key != env.step_key
    if moved_on:
        state.steps_done[env.step_key] = None if dispatch is None else dispatch.envelope.model_dump(mode="json")
        state.model_retry = None
    state.next_envelope = None if dispatch is None else dispatch.envelope.model_dump(mode="json")
    return dispatch, moved_on and result.ok and STEP_MAP[env.step].checkpoint


def _checkpoint(ctx: StepContext, state: TurnState) -> None:
    """Write ``state`` as the turn's durable checkpoint (kept only if it got further than the stored one), its
    frontier the message that leaves the task, and push the turn's reconciler deadline."""
    checkpoint = state.checkpoint()
    retry.retry_dropped_connection(
        lambda: ctx.turns.checkpoint(state.turn_id, checkpoint, now=ctx.clock(), deadline_at=ctx.deadline())
    )


def _dispatch_for(env: TurnEnvelope, next_step: Next | None) -> Dispatch | None:
    if isinstance(next_step, Continue):
        return Dispatch(env.to(next_step.step, iteration=next_step.iteration))
    assert isinstance(next_step, Stop)
    return None


def _retry_step(
    ctx: StepContext, env: TurnEnvelope, state: TurnState, later: RetryAfter, tally: MessageTally
) -> Dispatch:
    """Apply the retry policy's decision on a step that could not do its work now."""
    decision = retry.decide(
        later.trouble,
        settings=ctx.settings,
        now=ctx.clock(),
        rand=ctx.random(),
        attempt=env.attempt,
        hint=later.hint,
        message=later.message,
        step_key=env.step_key,
        model_retry=state.model_retry,
    )
    if isinstance(decision, retry.Later):
        if decision.model_retry is not None:
            state.model_retry = decision.model_retry
        if decision.counted_as is not None:  # counted once the state is saved
            tally.retried = (decision.counted_as, env.step)
        return Dispatch(env.model_copy(update={"attempt": env.attempt + 1}), countdown=decision.seconds)
    if isinstance(decision, retry.Drop):  # a step always has a turn to fail
        decision = retry.GiveUp(ErrorInfo(code=ErrorCode.INTERNAL_ERROR, message=decision.why))
    return _fail(ctx, env, state, decision.error)


def _later(ctx: StepContext, env: TurnEnvelope, trouble: retry.Trouble) -> Dispatch | None:
    """Apply the retry policy's decision on a message that met ``trouble`` outside its step's work."""
    decision = retry.decide(
        trouble, settings=ctx.settings, now=ctx.clock(), rand=ctx.random(), attempt=env.attempt, message=trouble.value
    )
    if isinstance(decision, retry.Later):
        if decision.counted_as is not None:
            ctx.metrics.count_retry(decision.counted_as, env.step)
        return Dispatch(env.model_copy(update={"attempt": env.attempt + 1}), countdown=decision.seconds)
    if isinstance(decision, retry.Drop):
        logger.warning("dropping %s of turn %s: %s", env.step_key, env.turn_id, decision.why)
        return None
    ctx.ending.end(env.turn_id, decision.error)
    return None


def _fail(ctx: StepContext, env: TurnEnvelope, state: TurnState, error: ErrorInfo) -> Dispatch:
    logger.warning("turn %s failed at %s: %s", env.turn_id, env.step.value, error.code.value)
    state.error = error
    state.status = TurnStatus.FAILED
    state.pending_tool_calls = []
    trace(ctx, state, env, "turn_failed", code=error.code.value, message=error.message)
    return Dispatch(env.to(StepName.PERSIST), failed=error)


def _fail_outside_step(ctx: StepContext, env: TurnEnvelope) -> Dispatch | None:
    message = "the pipeline could not run this turn"
    try:
        fail_turn(ctx, env.turn_id, message)
    except Exception as exc:
        trouble = retry.trouble_of(exc)
        if trouble is None:
            raise
        return _later(ctx, env, trouble)
    # from None: the bug's traceback is in the log line above, not in what Flower shows
    raise TurnFailed(ErrorCode.INTERNAL_ERROR.value, message) from None


def _name(exc: Exception) -> str:
    return (
        type(exc).__name__ if not isinstance(exc, DBAPIError) else f"{type(exc).__name__} ({type(exc.orig).__name__})"
    )
