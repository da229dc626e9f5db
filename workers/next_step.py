"""What a step asks the driver to do next (openai-agents' NextStep*, pydantic_graph's next node)."""

from __future__ import annotations

from dataclasses import dataclass

from shared.models.turn import TurnStatus
from shared.result import ErrorInfo
from shared.task_names import StepName

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


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """The model cannot answer now: run this same step again later, holding no worker slot meanwhile.

    The driver's retry policy (``workers.retry``) picks the delay and keeps the budget (a paced wait
    has neither).
    """

    failure: ErrorInfo
    """What the turn fails with once the budget is spent."""
    hint: float | None = None
    """Seconds the server (Retry-After) or the model's breaker asked to wait."""
    called: bool = True
    """Whether this try made a call (counts against ``APTIX_LLM_MAX_ATTEMPTS``)."""
    paced: bool = False
    """The wait is this call's slot in the model's shared rate limit (``workers.llm.limiter``), not a
    failure: the step is sent again after exactly ``hint`` seconds, spending no attempt and no budget."""


Next = Continue | Stop | RetryAfter
