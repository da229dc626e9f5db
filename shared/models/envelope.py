"""TurnEnvelope: the small JSON message every step task carries (never the whole state)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from shared.task_names import StepName

__all__ = ["BATCH_PRIORITY", "BATCH_START_PRIORITY", "INTERACTIVE_PRIORITY", "TurnEnvelope"]

# Message priorities (Redis transport: 0 is served first; kombu's default steps are 0, 3, 6, 9).
# Every step of an interactive turn outranks every batch message, so a batch never starves a
# single turn; inside a batch, turns already running outrank batch turns not yet started, so a
# batch finishes turn by turn instead of every turn finishing near the end (FIELD-NOTES: one
# shared queue is breadth-first).
INTERACTIVE_PRIORITY = 0
BATCH_PRIORITY = 3
BATCH_START_PRIORITY = 9


class TurnEnvelope(BaseModel):
    """Which turn, which step, and where in the turn the step stands."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    turn_id: str
    step: StepName
    round: int = Field(default=0, ge=0)
    """How many times the turn has been entered: 0 for the first run, +1 per tool-results re-entry."""
    hop: int = Field(default=0, ge=0)
    """The message's position in this round's chain; a redelivered message repeats it."""
    iteration: int = Field(default=0, ge=0)
    """The LLM call this step belongs to (0 before the first call)."""
    attempt: int = Field(default=0, ge=0)
    """Retries of this same step (LLM 429/5xx back-off)."""
    priority: int = Field(default=0, ge=0, le=9)
    """Broker priority (0 first); see ``shared.broker``. A batch turn's later steps move up to 3."""

    @property
    def step_key(self) -> str:
        """The identity of this step within its turn, for idempotency."""
        return f"{self.round}:{self.hop}:{self.step.value}:{self.iteration}"

    def to(self, step: StepName, *, iteration: int | None = None) -> TurnEnvelope:
        """The envelope of the next step of the same turn."""
        return TurnEnvelope(
            turn_id=self.turn_id,
            step=step,
            round=self.round,
            hop=self.hop + 1,
            iteration=self.iteration if iteration is None else iteration,
            priority=min(self.priority, BATCH_PRIORITY),
        )
