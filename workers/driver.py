"""run_step: the one driver every step task goes through.

It loads the turn state (Redis, else the database snapshot, else — for the request handler — the
recorded request), skips a step that already ran (redelivery), takes the step's lease, runs the
step, records the outcome, saves the state and says which task to send next. It is the only place
an unexpected exception becomes ``internal_error``; connection blips (Redis, database) and lost
races propagate so the task is retried.
"""

from __future__ import annotations

import logging
import threading
import uuid
from dataclasses import dataclass

import redis
from sqlalchemy.exc import OperationalError

from shared.errors import StateConflict, TurnNotRecorded
from shared.logging import log_context
from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnStatus
from shared.result import ErrorCode, ErrorInfo, InvokeResult, failure
from shared.state import TurnState
from shared.task_names import StepName
from workers.context import StepContext
from workers.next_step import Continue, Next, RetryAfter, Stop
from workers.step_map import ALWAYS_ALLOWED, STEP_MAP
from workers.steps import request_handler
from workers.trace import trace

__all__ = ["Dispatch", "StepBusy", "TRANSIENT_ERRORS", "TurnNotRecorded", "fail_turn", "run_step"]

logger = logging.getLogger(__name__)

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    OperationalError,
    StateConflict,
)
"""Errors a task retries: the step's work is either undone or recorded, so running again is safe."""
_RETRIED: tuple[type[Exception], ...] = (*TRANSIENT_ERRORS, TurnNotRecorded)


@dataclass(frozen=True, slots=True)
class Dispatch:
    """A task the caller must send."""

    envelope: TurnEnvelope
    countdown: float = 0.0


class StepBusy(Exception):
    """Another worker holds this step's lease; try again after ``retry_in`` seconds."""

    def __init__(self, retry_in: float) -> None:
        super().__init__(f"step is leased elsewhere; retry in {retry_in}s")
        self.retry_in = retry_in


def run_step(ctx: StepContext, env: TurnEnvelope) -> Dispatch | None:
    """Run one step of one turn.

    Returns:
        The next task to send, or None when the chain ends (or the turn is unknown).

    Raises:
        StepBusy: the step is running elsewhere.
        TurnNotRecorded: a first message arrived before its turn's row was committed.
        Exception: one of :data:`TRANSIENT_ERRORS`, for the task to retry.
    """
    with log_context(turn_id=env.turn_id, step=env.step.value, iteration=env.iteration):
        state = _load(ctx, env)
        if state is None:
            logger.warning("no state for turn %s; dropping %s", env.turn_id, env.step_key)
            return None
        if env.step is not StepName.PERSIST and ctx.store.is_cancelled(env.turn_id):
            logger.info("turn %s was cancelled; stopping at %s", env.turn_id, env.step_key)
            return None
        if env.step_key in state.steps_done:
            logger.info("step %s already ran; passing the turn on", env.step_key)
            return _recorded(state, env)
        owner = f"{ctx.hostname}:{uuid.uuid4().hex}"
        lease = ctx.settings.step_lease_seconds
        if not ctx.store.claim(env.turn_id, env.step_key, owner=owner, ttl_seconds=lease):
            raise StepBusy(retry_in=max(1.0, lease / 2))
        try:
            with _Heartbeat(ctx, env, owner):
                result = _invoke(ctx, env, state)
            return _conclude(ctx, env, state, result)
        finally:
            ctx.store.release(env.turn_id, env.step_key, owner=owner)


def fail_turn(ctx: StepContext, turn_id: str, message: str) -> None:
    """Commit an unfinished turn as failed (``internal_error``) when the pipeline cannot carry it on."""
    ctx.turns.finish_early(
        turn_id,
        status=TurnStatus.FAILED,
        error=ErrorInfo(code=ErrorCode.INTERNAL_ERROR, message=message),
        now=ctx.clock(),
    )


def _load(ctx: StepContext, env: TurnEnvelope) -> TurnState | None:
    state = ctx.store.load(env.turn_id)
    if state is not None:
        return state
    snapshot = ctx.turns.load_snapshot(env.turn_id)
    if snapshot is not None:
        logger.info("rehydrating turn %s from its database snapshot", env.turn_id)
        state = TurnState.model_validate(snapshot)
        state.version = 0
        return state
    if env.step is StepName.REQUEST_HANDLER and env.round == 0:
        state = request_handler.build_state(ctx, env.turn_id)
        if state is None:
            raise TurnNotRecorded(env.turn_id)
        return state
    return None


def _recorded(state: TurnState, env: TurnEnvelope) -> Dispatch | None:
    sent = state.steps_done[env.step_key]
    return None if sent is None else Dispatch(TurnEnvelope.model_validate(sent))


def _invoke(ctx: StepContext, env: TurnEnvelope, state: TurnState) -> InvokeResult[Next]:
    spec = STEP_MAP.get(env.step)
    if spec is None:
        return failure(ErrorCode.INTERNAL_ERROR, f"no step {env.step.value!r} in the step map")
    try:
        result = spec.run(ctx, env, state)
    except _RETRIED:
        raise
    except Exception:  # the one place a bug becomes a failed turn instead of a stuck one
        logger.exception("step %s of turn %s raised", env.step_key, env.turn_id)
        return failure(ErrorCode.INTERNAL_ERROR, f"step {env.step.value!r} failed unexpectedly")
    if result.ok and isinstance(result.value, Continue):
        allowed = spec.next | ALWAYS_ALLOWED
        if result.value.step not in allowed:
            logger.error("step %s may not move to %s", env.step.value, result.value.step.value)
            return failure(ErrorCode.INTERNAL_ERROR, f"step {env.step.value!r} made a move the step map forbids")
    return result


def _conclude(ctx: StepContext, env: TurnEnvelope, state: TurnState, result: InvokeResult[Next]) -> Dispatch | None:
    dispatch: Dispatch | None
    if not result.ok:
        assert result.error is not None
        _fail(ctx, env, state, result.error)
        dispatch = Dispatch(env.to(StepName.PERSIST))
    else:
        dispatch = _dispatch_for(env, result.value)
    if dispatch is None or dispatch.envelope.step_key != env.step_key:
        state.steps_done[env.step_key] = None if dispatch is None else dispatch.envelope.model_dump(mode="json")
    ctx.store.save(state, ttl_seconds=ctx.state_ttl_seconds)
    return dispatch


def _dispatch_for(env: TurnEnvelope, next_step: Next | None) -> Dispatch | None:
    if isinstance(next_step, Continue):
        return Dispatch(env.to(next_step.step, iteration=next_step.iteration))
    if isinstance(next_step, RetryAfter):
        again = env.model_copy(update={"attempt": env.attempt + 1})
        return Dispatch(again, countdown=next_step.seconds)
    assert isinstance(next_step, Stop)
    return None


def _fail(ctx: StepContext, env: TurnEnvelope, state: TurnState, error: ErrorInfo) -> None:
    logger.warning("turn %s failed at %s: %s", env.turn_id, env.step.value, error.code.value)
    state.error = error
    state.status = TurnStatus.FAILED
    state.pending_tool_calls = []
    trace(ctx, state, env, "turn_failed", code=error.code.value, message=error.message)


class _Heartbeat:
    """Renews the step's lease while it runs, so a live worker's long step is not run twice."""

    def __init__(self, ctx: StepContext, env: TurnEnvelope, owner: str) -> None:
        self._ctx = ctx
        self._env = env
        self._owner = owner
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name=f"lease-{env.step_key}")

    def __enter__(self) -> _Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=1.0)

    def _beat(self) -> None:
        lease = self._ctx.settings.step_lease_seconds
        while not self._stop.wait(lease / 3):
            try:
                self._ctx.store.extend(self._env.turn_id, self._env.step_key, owner=self._owner, ttl_seconds=lease)
            except redis.RedisError:
                logger.warning("could not renew the lease of %s", self._env.step_key)
