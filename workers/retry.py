"""The one retry policy: what becomes of a step that cannot go on now.

Callers say what happened and nothing more: ``llm_call`` returns a
:class:`~workers.next_step.RetryAfter` naming its :class:`Trouble` (:func:`model_trouble` reads an
``LlmError``), the driver and the reconciler name theirs (:func:`trouble_of` reads an exception).
:func:`decide` answers from :data:`POLICY`, one row per trouble: try again :class:`Later` (after how
long, spending which budget), :class:`GiveUp` (fail the turn with which code), or :class:`Drop` the
message. No other module picks a delay, keeps a budget or gives up.

=======================================  ==========================================  ===============  ================
trouble (reported by)                    wait before the next try                    budget           once spent
=======================================  ==========================================  ===============  ================
model_rate_limited (llm_call: 429,       the hint (Retry-After) + 0-20 %, else       model, a call    llm_rate_limited
a generation failed rate_limit_exceeded) 1 s x 2^(calls-1) up to 30 s, jittered
model_error (5xx, 408, 409, a            as above                                    model, a call    llm_error
generation failed server_error)
model_unreachable (timeout, connection   as above                                    model, a call    llm_error
error, a stream that broke)
model_paused (an earlier 429 paused      as above (hint: the pause's end)            model, no call   llm_rate_limited
the model for every worker)
model_breaker_open (no call made)        as above (hint: the breaker's wait)         model, no call   llm_error
model_paced (the model's rate limits     exactly the hint (the call's slot)          none             --
hold the call back: no failure)
model_rejected (4xx, an unusable or      --                                          spent at once    llm_error
incomplete answer)
model_quota_exhausted (429               --                                          spent at once    llm_rate_limited
insufficient_quota)
step_busy (driver: another worker        half the step lease, at least 1 s           none             --
holds the step's lease)
turn_not_recorded (driver, a step: the   10 ms x 2^attempt up to 0.5 s               20 s of waits    drop the message
gateway's commit is not visible yet)
infrastructure (Redis, the database,     0.5 s x 2^attempt up to 30 s, jittered      none             --
a lost state race; Redis READONLY,
NOSCRIPT or NOREPLICAS)
stalled (reconciler: past its deadline   at once (a re-drive)                        re-drives        internal_error
with no live in-flight marker)
=======================================  ==========================================  ===============  ================

Budgets: *model* is ``APTIX_LLM_RETRY_BUDGET_SECONDS`` since the step's first trouble (the next wait
included) and ``APTIX_LLM_MAX_ATTEMPTS`` calls (a row marked "a call" made one; a breaker's or a
pause's wait made none); *re-drives* is ``APTIX_RECONCILER_MAX_REDRIVES``; *none* waits an outage out
however long it lasts (a busy step's holder finishes, or its lease lapses). Jitter is equal jitter
(half to all of the wait). Of these troubles, ``model_error`` and ``model_unreachable`` say the model
is down or broken: they count against its circuit breaker (:data:`MODEL_DOWN`), which is what opens it.

How "later" is carried out: the same message is sent again with the wait as its countdown (the
driver; ``attempt`` + 1); a wait longer than :func:`park_after` (half the broker's visibility timeout,
which would deliver it twice) is parked in Redis and sent when due (``shared.step_sender``, which each
worker builds with this threshold). While a turn waits its in-flight marker covers the wait, so the
reconciler does not take it for a stall. Two troubles are met in place and never reach the table: a
write that must land (a checkpoint, a tool's outcome) on a dropped database connection is tried
again at once (:func:`retry_dropped_connection`, then the step's *infrastructure* row), and a next
message the broker refused makes the task requeue its own message (``workers.tasks``: its step is
recorded, so running it again only sends).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Final, TypeVar

import redis
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

from shared.broker import visibility_timeout
from shared.errors import LlmError, StateConflict, StepBusy, TurnNotRecorded
from shared.redis_clients import FAILOVER_ERRORS, is_refused_for_replicas
from shared.redis_cluster import CLUSTER_TRANSIENT_ERRORS
from shared.result import ErrorCode, ErrorInfo
from shared.settings import Settings
from shared.state import ModelRetry

__all__ = [
    "MAX_DELAY_SECONDS", "MODEL_DOWN", "POLICY", "Backoff", "Budget", "Decision", "Drop", "GiveUp", "Later", "Reason",
    "Rule", "Timing", "Trouble", "decide", "model_trouble", "park_after", "retry_dropped_connection", "trouble_of",
]  # fmt: skip

logger = logging.getLogger(__name__)

MAX_DELAY_SECONDS = 30.0
"""The longest computed back-off (a server's Retry-After or a breaker's wait may be longer)."""


class Trouble(StrEnum):
    """What kept a step from going on now: what its caller reports."""

    MODEL_RATE_LIMITED = "model_rate_limited"
    MODEL_ERROR = "model_error"
    MODEL_UNREACHABLE = "model_unreachable"
    MODEL_PAUSED = "model_paused"
    MODEL_BREAKER_OPEN = "model_breaker_open"
    MODEL_PACED = "model_paced"
    MODEL_REJECTED = "model_rejected"
    MODEL_QUOTA_EXHAUSTED = "model_quota_exhausted"
    STEP_BUSY = "step_busy"
    TURN_NOT_RECORDED = "turn_not_recorded"
    INFRASTRUCTURE = "infrastructure"
    STALLED = "stalled"


class Reason(StrEnum):
    """How a step sent again later is counted (``aptix_step_retries_total``'s ``reason`` label)."""

    MODEL = "model"
    STEP_BUSY = "step_busy"
    TURN_NOT_RECORDED = "turn_not_recorded"
    INFRASTRUCTURE = "infrastructure"


class Budget(StrEnum):
    """What a row's tries are counted against."""

    NONE = "none"
    """Never spent: the trouble is waited out."""
    MODEL_CALLS = "model, a call"
    """The step's model budget, and this try made a call: ``APTIX_LLM_RETRY_BUDGET_SECONDS`` since the
    step's first trouble (the next wait included), and ``APTIX_LLM_MAX_ATTEMPTS`` calls."""
    MODEL_TIME = "model, no call"
    """The step's model budget, and this try made no call: ``APTIX_LLM_RETRY_BUDGET_SECONDS`` only."""
    NOT_RECORDED = "20 s of waits"
    """The waits so far add up to more than 20 s: the turn was never recorded."""
    REDRIVES = "re-drives"
    """``APTIX_RECONCILER_MAX_REDRIVES`` re-drives."""
    SPENT = "spent at once"
    """No try can help."""


class Timing(StrEnum):
    """A wait that is not a back-off."""

    HINT = "exactly the hint"
    """The hint as it is, without jitter (a rate limit's slot: jitter would scramble the slots)."""
    HALF_LEASE = "half the step lease, at least 1 s"
    AT_ONCE = "at once"


@dataclass(frozen=True, slots=True)
class Backoff:
    """``first`` x 2^n seconds, at most ``cap``: n is the step's model calls less one on a model row (its
    budget's record), else the envelope's ``attempt``."""

    first: float
    cap: float
    jitter: bool = False
    """Equal jitter: between half and all of the wait."""
    hint: bool = False
    """A hint (Retry-After, the breaker's or a pause's wait) replaces the back-off, spread by 0-20 % so a
    backlog told the same time does not come back at once."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One row of the policy."""

    wait: Backoff | Timing | None
    """How long until the next try; None: there is none."""
    budget: Budget
    gives_up: ErrorCode | None = None
    """What the turn fails with once the budget is spent; None: the message is dropped (no turn to fail)."""
    counted_as: Reason | None = None
    """The retry's metric label; None: not counted as a retry."""


_MODEL_WAIT = Backoff(first=1.0, cap=MAX_DELAY_SECONDS, jitter=True, hint=True)
_NOT_RECORDED_WAIT = Backoff(first=0.01, cap=0.5)
"""The gateway sends a turn's first message just before it commits the turn: an idle worker often
reads the row a millisecond too early, and a 0.5 s wait then was most of an interactive turn's time."""
_INFRASTRUCTURE_WAIT = Backoff(first=0.5, cap=MAX_DELAY_SECONDS, jitter=True)

# fmt: off
POLICY: Final[Mapping[Trouble, Rule]] = {
    #        wait                  budget               once spent                  metric
    Trouble.MODEL_RATE_LIMITED:
        Rule(_MODEL_WAIT,          Budget.MODEL_CALLS,  ErrorCode.LLM_RATE_LIMITED, Reason.MODEL),
    Trouble.MODEL_ERROR:
        Rule(_MODEL_WAIT,          Budget.MODEL_CALLS,  ErrorCode.LLM_ERROR,        Reason.MODEL),
    Trouble.MODEL_UNREACHABLE:
        Rule(_MODEL_WAIT,          Budget.MODEL_CALLS,  ErrorCode.LLM_ERROR,        Reason.MODEL),
    Trouble.MODEL_PAUSED:
        Rule(_MODEL_WAIT,          Budget.MODEL_TIME,   ErrorCode.LLM_RATE_LIMITED, Reason.MODEL),
    Trouble.MODEL_BREAKER_OPEN:
        Rule(_MODEL_WAIT,          Budget.MODEL_TIME,   ErrorCode.LLM_ERROR,        Reason.MODEL),
    Trouble.MODEL_PACED:
        Rule(Timing.HINT,          Budget.NONE,         None,                       None),
    Trouble.MODEL_REJECTED:
        Rule(None,                 Budget.SPENT,        ErrorCode.LLM_ERROR,        None),
    Trouble.MODEL_QUOTA_EXHAUSTED:
        Rule(None,                 Budget.SPENT,        ErrorCode.LLM_RATE_LIMITED, None),
    Trouble.STEP_BUSY:
        Rule(Timing.HALF_LEASE,    Budget.NONE,         None,                       Reason.STEP_BUSY),
    Trouble.TURN_NOT_RECORDED:
        Rule(_NOT_RECORDED_WAIT,   Budget.NOT_RECORDED, None,                       Reason.TURN_NOT_RECORDED),
    Trouble.INFRASTRUCTURE:
        Rule(_INFRASTRUCTURE_WAIT, Budget.NONE,         None,                       Reason.INFRASTRUCTURE),
    Trouble.STALLED:
        Rule(Timing.AT_ONCE,       Budget.REDRIVES,     ErrorCode.INTERNAL_ERROR,   None),
}
"""The policy: trouble -> rule (the table in this module's docstring)."""
# fmt: on

MODEL_DOWN: Final = frozenset({Trouble.MODEL_ERROR, Trouble.MODEL_UNREACHABLE})
"""The troubles that say the model is down or broken: they count against its circuit breaker."""
_NOT_RECORDED_BUDGET_SECONDS = 20.0
_INFRASTRUCTURE_ERRORS: tuple[type[Exception], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    redis.exceptions.BusyLoadingError,
    *FAILOVER_ERRORS,
    OperationalError,
    InterfaceError,
    PoolTimeout,
    StateConflict,
    *CLUSTER_TRANSIENT_ERRORS,
)
"""Errors after which a step runs again later: its work is either undone or recorded."""
_RATE_LIMITED_CODE = "rate_limit_exceeded"
_DROPPED_CONNECTION_PAUSES = (0.2, 0.5)
_MAX_DOUBLINGS = 60
"""Past this a back-off is at its cap anyway; 2.0 ** 1024 would overflow (an outage waited out for hours)."""


@dataclass(frozen=True, slots=True)
class Later:
    """Send the same message again after ``seconds``."""

    seconds: float
    counted_as: Reason | None = None
    """The retry's metric label; None: not counted as a retry (a rate limit's slot)."""
    model_retry: ModelRetry | None = None
    """The step's model budget as it stands now, to keep with the turn; None: leave the record as it is."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """Fail the turn with ``error``."""

    error: ErrorInfo


@dataclass(frozen=True, slots=True)
class Drop:
    """Drop the message: there is no turn to fail."""

    why: str


Decision = Later | GiveUp | Drop


def decide(
    trouble: Trouble,
    *,
    settings: Settings,
    now: datetime,
    rand: float,
    attempt: int = 0,
    hint: float | None = None,
    message: str = "",
    step_key: str = "",
    model_retry: ModelRetry | None = None,
) -> Decision:
    """What to do with a step that met ``trouble``, by its row of :data:`POLICY`.

    Args:
        trouble: what happened.
        settings: the budgets and the step lease.
        now: the current time (the model budget's clock).
        rand: a uniform random number in [0, 1), for jitter.
        attempt: how often the message was already sent again (the envelope's ``attempt``; the
            reconciler's re-drives for ``stalled``).
        hint: seconds the server (Retry-After), the breaker or the rate limiter asked to wait.
        message: what happened, in words: the turn's error message when it gives up.
        step_key: the step's key (a model budget belongs to one step).
        model_retry: the turn's model budget record, if it has one.

    Returns:
        :class:`Later`, :class:`GiveUp` or :class:`Drop`.
    """
    rule = POLICY[trouble]
    if rule.budget in (Budget.MODEL_CALLS, Budget.MODEL_TIME):
        return _decide_model(rule, settings=settings, now=now, rand=rand, hint=hint, message=message,
                             step_key=step_key, model_retry=model_retry)  # fmt: skip
    if rule.wait is None or rule.budget is Budget.SPENT:
        return _give_up(rule, message)
    if rule.budget is Budget.REDRIVES and attempt >= settings.reconciler_max_redrives:
        return _give_up(rule, f"{message} after {attempt} re-drives by the reconciler")
    wait = _wait(rule.wait, n=attempt, settings=settings, hint=hint, rand=rand)
    if rule.budget is Budget.NOT_RECORDED:
        assert isinstance(rule.wait, Backoff)
        waited = sum(_wait(rule.wait, n=n, settings=settings, hint=None, rand=rand) for n in range(attempt + 1))
        if waited > _NOT_RECORDED_BUDGET_SECONDS:
            return _give_up(rule, f"{message} for more than {_NOT_RECORDED_BUDGET_SECONDS:g}s")
    return Later(wait, counted_as=rule.counted_as)


def model_trouble(exc: LlmError) -> Trouble:
    """The trouble an error from the model reports.

    The client says whether trying again may help (``LlmError.retryable``); this says which row of
    the table that is. A generation that failed ``rate_limit_exceeded`` is a rate limit like a 429.
    """
    if not exc.retryable:
        return Trouble.MODEL_QUOTA_EXHAUSTED if exc.status_code == 429 else Trouble.MODEL_REJECTED
    if exc.status_code == 429 or exc.code == _RATE_LIMITED_CODE:
        return Trouble.MODEL_RATE_LIMITED
    if exc.status_code == 0 and exc.code is None:
        return Trouble.MODEL_UNREACHABLE
    return Trouble.MODEL_ERROR


def trouble_of(exc: Exception) -> Trouble | None:
    """The trouble an exception reports, or None for one that is no trouble of this table (a bug)."""
    if isinstance(exc, StepBusy):
        return Trouble.STEP_BUSY
    if isinstance(exc, TurnNotRecorded):
        return Trouble.TURN_NOT_RECORDED
    if isinstance(exc, _INFRASTRUCTURE_ERRORS) or is_refused_for_replicas(exc):
        return Trouble.INFRASTRUCTURE
    return None


def park_after(settings: Settings) -> float:
    """Waits longer than this many seconds are parked in Redis rather than given to the broker.

    The Redis transport hands a countdown longer than its visibility timeout to a second worker.
    """
    return visibility_timeout(settings) / 2


T = TypeVar("T")


def retry_dropped_connection(action: Callable[[], T]) -> T:
    """Run ``action``; on a dropped database connection, pause briefly and run it again (three tries in all).

    For writes that must land because the work before them cannot be cheaply redone (a model's
    answer, a tool's outcome): the write goes again on a fresh connection (a dropped connection makes
    the pool discard it and every older one). ``action`` must be safe to run twice (its first try may
    have committed before the answer was lost). The last error goes to the caller: the step's
    *infrastructure* row.
    """
    for pause in _DROPPED_CONNECTION_PAUSES:
        try:
            return action()
        except (OperationalError, InterfaceError) as exc:
            logger.warning("a database write failed (%s); trying again", type(exc).__name__)
            time.sleep(pause)
    return action()


def _decide_model(
    rule: Rule,
    *,
    settings: Settings,
    now: datetime,
    rand: float,
    hint: float | None,
    message: str,
    step_key: str,
    model_retry: ModelRetry | None,
) -> Decision:
    """A model row: one budget per step, in time since its first trouble and in calls."""
    if model_retry is None or model_retry.step_key != step_key:
        model_retry = ModelRetry(step_key=step_key, since=now)
    if rule.budget is Budget.MODEL_CALLS:
        model_retry = model_retry.model_copy(update={"calls": model_retry.calls + 1})
    spent = (now - model_retry.since).total_seconds()
    if model_retry.calls < settings.llm_max_attempts:
        assert rule.wait is not None
        wait = _wait(rule.wait, n=max(0, model_retry.calls - 1), settings=settings, hint=hint, rand=rand)
        if spent + wait <= settings.llm_retry_budget_seconds:
            return Later(wait, counted_as=rule.counted_as, model_retry=model_retry)
    return _give_up(
        rule,
        f"{message} (gave up after {model_retry.calls} call(s) over {spent:.0f}s: "
        f"APTIX_LLM_RETRY_BUDGET_SECONDS={settings.llm_retry_budget_seconds:g}, "
        f"APTIX_LLM_MAX_ATTEMPTS={settings.llm_max_attempts})",
    )


def _wait(wait: Backoff | Timing, *, n: int, settings: Settings, hint: float | None, rand: float) -> float:
    if wait is Timing.HINT:
        return max(0.0, hint or 0.0)
    if wait is Timing.HALF_LEASE:
        return max(1.0, settings.step_lease_seconds / 2)
    if wait is Timing.AT_ONCE:
        return 0.0
    assert isinstance(wait, Backoff)
    if wait.hint and hint is not None:
        return max(0.0, hint) * (1.0 + 0.2 * rand)
    seconds = min(wait.cap, wait.first * 2.0 ** min(n, _MAX_DOUBLINGS))
    return seconds * (0.5 + rand / 2) if wait.jitter else seconds


def _give_up(rule: Rule, message: str) -> GiveUp | Drop:
    if rule.gives_up is None:
        return Drop(message)
    return GiveUp(ErrorInfo(code=rule.gives_up, message=message))
