"""The one retry policy: when a step that cannot go on now runs again, and when waiting stops.

Each reason, with the delay before the next try, its budget, and what happens when it is spent:

- ``MODEL`` (429, 5xx, timeout, connection error, breaker open, a model paused by a 429's
  Retry-After). Delay: the server's Retry-After or the breaker's or pause's wait; else
  1 s x 2^(calls-1), at most 30 s; with jitter. Budget: ``APTIX_LLM_RETRY_BUDGET_SECONDS`` since the
  first failure, and ``APTIX_LLM_MAX_ATTEMPTS`` calls (breaker waits make no call). Spent: the turn
  fails ``llm_rate_limited`` / ``llm_error``. A call held back by the model's own rate limits
  (``APTIX_LLM_RPM``/``TPM``: ``RetryAfter.paced``) is no failure: it runs again after exactly the
  limiter's wait (its slot), without jitter and without budget.
- ``STEP_BUSY`` (another worker holds the step's lease). Delay: half the lease, at least 1 s.
  Budget: none; the holder finishes, or its lease lapses when it stops heartbeating.
- ``TURN_NOT_RECORDED`` (the gateway's commit is not visible yet). Delay: 10 ms x 2^attempt, at
  most 0.5 s. Budget: 20 s in all. Spent: the message is dropped; its turn was never recorded.
- ``INFRASTRUCTURE`` (Redis, database or broker unreachable; a lost state race). Delay: 0.5 s x
  2^attempt, at most 30 s; with jitter. Budget: none; outages are waited out.

Every "later" becomes the same message sent again with this delay (``workers.driver``); a wait
long enough to outlast the broker's visibility timeout is parked in Redis instead
(``shared.step_sender``). While a turn waits, its in-flight marker covers the delay, so the
reconciler does not take a wait for a stall; if the message is lost anyway, the reconciler
re-drives the turn at its deadline.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from shared.settings import Settings
from shared.state import ModelRetry

__all__ = ["MAX_DELAY_SECONDS", "Reason", "delay", "model_delay"]

MAX_DELAY_SECONDS = 30.0
"""The longest computed back-off (a server's Retry-After or a breaker's wait may be longer)."""
_NOT_RECORDED_FIRST_DELAY = 0.01
"""The gateway sends a turn's first message just before it commits the turn: an idle worker often
reads the row a millisecond too early, and a 0.5 s wait then was most of an interactive turn's time."""
_NOT_RECORDED_MAX_DELAY = 0.5
_NOT_RECORDED_BUDGET = 20.0


class Reason(StrEnum):
    """Why a step runs again later."""

    MODEL = "model"
    STEP_BUSY = "step_busy"
    TURN_NOT_RECORDED = "turn_not_recorded"
    INFRASTRUCTURE = "infrastructure"


def delay(reason: Reason, *, attempt: int, settings: Settings, rand: float) -> float | None:
    """Seconds before retry ``attempt + 1`` of a step for ``reason`` (not ``MODEL``); None when its budget is spent.

    Args:
        reason: why the step cannot go on now.
        attempt: how often the step was already sent again (the envelope's ``attempt``).
        settings: the budgets.
        rand: a uniform random number in [0, 1), for jitter.
    """
    if reason is Reason.STEP_BUSY:
        return max(1.0, settings.step_lease_seconds / 2)
    if reason is Reason.TURN_NOT_RECORDED:
        wait, spent = _NOT_RECORDED_FIRST_DELAY, _NOT_RECORDED_FIRST_DELAY
        for _ in range(attempt):
            wait = min(_NOT_RECORDED_MAX_DELAY, wait * 2)
            spent += wait
            if spent > _NOT_RECORDED_BUDGET:
                return None
        return wait
    if reason is Reason.INFRASTRUCTURE:
        return _jittered(min(MAX_DELAY_SECONDS, 0.5 * 2**attempt), rand)
    raise ValueError(f"use model_delay for {reason}")


def model_delay(
    retry: ModelRetry, *, now: datetime, hint: float | None, settings: Settings, rand: float
) -> float | None:
    """Seconds before an LLM step tries again; None when its budget is spent.

    Args:
        retry: the step's retry record (first failure, calls made so far, this try included).
        now: the current time.
        hint: what the server (Retry-After) or the breaker asked for, if anything.
        settings: ``llm_retry_budget_seconds`` and ``llm_max_attempts``.
        rand: a uniform random number in [0, 1), for jitter.
    """
    if retry.calls >= settings.llm_max_attempts:
        return None
    if hint is not None:
        wait = max(0.0, hint) * (1.0 + 0.2 * rand)  # spread a backlog that was told the same time
    else:
        wait = _jittered(min(MAX_DELAY_SECONDS, 2.0 ** max(0, retry.calls - 1)), rand)
    spent = (now - retry.since).total_seconds()
    if spent + wait > settings.llm_retry_budget_seconds:
        return None
    return wait


def _jittered(base: float, rand: float) -> float:
    """Equal jitter: between half and all of ``base``."""
    return base * (0.5 + rand / 2)
