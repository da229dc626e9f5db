"""What an attempt's outcome means for its delivery: delivered, retried later, given up, or the
endpoint disabled.

2xx is delivered. 410 Gone disables the endpoint (the receiver says it is gone for good, as Stripe and
Svix read it). Anything else (another status, a redirect, which is not followed, a timeout, a
connection error, an address refused) is retried after the next delay of ``APTIX_WEBHOOK_RETRY_SCHEDULE``,
stretched or shrunk by up to 20 % at random so that deliveries failing together do not come back
together; after the last delay's attempt the delivery is given up.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

__all__ = ["JITTER", "Decision", "Verdict", "decide", "retry_delay"]

JITTER = 0.2
"""Each retry delay is multiplied by a random factor in [1 - JITTER, 1 + JITTER]."""


class Verdict(StrEnum):
    """What becomes of a delivery after an attempt."""

    DELIVERED = "delivered"
    RETRY = "retry"
    GIVE_UP = "give_up"
    DISABLE_ENDPOINT = "disable_endpoint"


@dataclass(frozen=True, slots=True)
class Decision:
    """The verdict, and for a retry the seconds to wait."""

    verdict: Verdict
    delay: float | None = None


def decide(status_code: int | None, *, attempt: int, delays: tuple[float, ...], rand: float) -> Decision:
    """Judge attempt number ``attempt``.

    Args:
        status_code: the endpoint's answer; None when there was none.
        attempt: the attempt's number (1 for the first).
        delays: the retry schedule (``APTIX_WEBHOOK_RETRY_SCHEDULE``).
        rand: a random number in [0, 1) for the jitter.

    Returns:
        The decision.
    """
    if status_code is not None and 200 <= status_code < 300:
        return Decision(Verdict.DELIVERED)
    if status_code == 410:
        return Decision(Verdict.DISABLE_ENDPOINT)
    delay = retry_delay(attempt, delays=delays, rand=rand)
    return Decision(Verdict.GIVE_UP) if delay is None else Decision(Verdict.RETRY, delay)


def retry_delay(attempt: int, *, delays: tuple[float, ...], rand: float) -> float | None:
    """The wait after failed attempt number ``attempt``, jittered; None when the schedule is spent."""
    if attempt < 1 or attempt > len(delays):
        return None
    return delays[attempt - 1] * (1 - JITTER + 2 * JITTER * rand)
