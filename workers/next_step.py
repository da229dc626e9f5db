"""What a step asks the driver to do next (openai-agents' NextStep*, pydantic_graph's next node)."""

from __future__ import annotations

from dataclasses import dataclass

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


@dataclass(frozen=True, slots=True)
class RetryAfter:
    """Run this same step again after ``seconds``, without holding a worker slot meanwhile."""

    seconds: float
    reason: str


Next = Continue | Stop | RetryAfter
