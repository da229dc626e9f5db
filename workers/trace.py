"""Writing CompositionTrace steps (AGN-031 §9) from inside a pipeline step.

A record is final when the state that holds it is saved: that save also sends it to the turn's event
log as a ``trace`` event (``TurnStates.save``), so watchers see it as soon as it is kept, and a step
that runs again after a failed save (and makes its records again) sends them once.
"""

from __future__ import annotations

from typing import Any

from shared.models.envelope import TurnEnvelope
from shared.state import TurnState
from workers.context import StepContext

__all__ = ["trace"]


def trace(
    ctx: StepContext,
    state: TurnState,
    env: TurnEnvelope,
    kind: str,
    *,
    duration_ms: float | None = None,
    **data: Any,
) -> None:
    """Append a trace step stamped with the clock, the step and this worker's host (sent to the turn's
    event log by the state's next save)."""
    state.record(
        kind,
        at=ctx.clock(),
        step=env.step.value,
        worker=ctx.hostname,
        duration_ms=duration_ms,
        round=env.round,
        iteration=env.iteration,
        **data,
    )
