"""What a step asks the driver to do next (openai-agents' NextStep*, pydantic_graph's next node)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.models.turn import TurnStatus
from shared.state.token_usage import TurnTokens
from shared.task_names import StepName
from workers.retry import Trouble

__all__ = ["Continue", "Next", "RetryAfter", "Stop"]


@dataclass(frozen=True, slots=True)
class Continue:
    """Send the turn on to ``step`` (for LLM layers, at ``iteration``)."""

    step: StepName
    iteration: int | None = None


@dataclass(frozen=True, slots=True)
class Stop:
    """The chain ends here: the turn is committed (finished, or waiting for client tools)."""

    committed: TurnStatus | None = None
    """The status this step's commit wrote; None when it wrote none (the turn had ended otherwise)."""
    deliveries: tuple[str, ...] = ()
    """The webhook deliveries the commit recorded (its outbox rows); the driver sends them."""
    tokens: TurnTokens | None = None
    """The turn's tokens as the commit wrote them; the save that ends the chain merges them into its organisation's
    count of the day (``shared.state.token_usage``)."""


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """The step could not do its work now, and says why: the retry policy (:func:`workers.retry.decide`)
    sends the same step again later, holding no worker slot meanwhile, or fails the turn once the
    trouble's budget is spent (at once for a trouble no retry can fix)."""

    trouble: Trouble
    """What happened."""
    message: str
    """What happened, in words: the turn's error message if it gives up."""
    hint: float | None = None
    """Seconds the server (Retry-After), the model's breaker or its rate limiter asked to wait."""


Next = Continue | Stop | RetryAfter
