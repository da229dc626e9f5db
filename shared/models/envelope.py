"""TurnEnvelope: the small JSON message every step task carries (never the whole state)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from shared.task_names import StepName

__all__ = ["BATCH_PRIORITY", "BATCH_START_PRIORITY", "INTERACTIVE_PRIORITY", "TurnEnvelope", "first_step"]

# Message priorities (Redis transport: 0 is served first; kombu's default steps are 0, 3, 6, 9).
# Every step of an interactive turn outranks every batch message, so a batch never starves a
# single turn; inside a batch, turns already running outrank batch turns not yet started, so a
# batch finishes turn by turn instead of every turn finishing near the end (FIELD-NOTES: one
# shared queue is breadth-first).
INTERACTIVE_PRIORITY = 0
BATCH_PRIORITY = 3
BATCH_START_PRIORITY = 9


class TurnEnvelope(BaseModel):
    """Which turn, which step, and where in the turn the step stands.

    Four counters place a message; the first three make its :attr:`step_key`
    (``round:hop:step:iteration``), the identity under which the driver records that the step ran:

    ============= ================================== ===================== =========================
    counter       counts                             set by                read by
    ============= ================================== ===================== =========================
    ``round``     runs of the turn: 0 for the first  the gateway (the      the entry steps (first run
                  run, +1 each time client tool      turn row's round);    or re-entry), persist, the
                  results are posted                 the reconciler        driver (first message,
                                                                           checkpoint), reconciler
    ``hop``       messages of this round's chain,    :meth:`to`: +1 per    the step key only (and the
                  from 0; steps run inline in one    step                  reconciler, to pick the
                  task still count one each                                furthest frontier)
    ``iteration`` the LLM call the step serves: 0    the reasoner, when it compose, llm_call,
                  before the round's first call      starts call n; kept   execute_server_tools, the
                  (the turn's count goes on across   by the steps after it reasoner's tool ledger,
                  rounds)                                                  logs and trace
    ``attempt``   times this same message was sent   the driver (model     the driver's back-off
                  again later (model retry-after,    retry-after and       (:mod:`workers.retry`);
                  step leased elsewhere, turn not    "later"); :meth:`to`  *not* in the step key
                  recorded yet, an outage)           resets it to 0
    ============= ================================== ===================== =========================

    Why all four: the reasoner runs twice at one iteration (before and after a server tool), so
    the step key needs ``hop``; ``hop`` restarts at 0 on re-entry, so it needs ``round``; a retry is
    the same step again, so ``attempt`` stays out of the key and a retried step is still skipped
    once it has run. ``iteration`` is what the LLM steps and the ledger read.

    Example, a turn with one server tool call and then one client tool call (each line one message;
    entry steps in brackets ran inline in the message before them)::

        round hop step                               iteration
        0     0   request_handler                    0   [1 session_creator, 2 session_context_resolver,
                                                          3 context_provider_initializer]
        0     4   reasoner                           0   -> first LLM call
        0     5   compose                            1
        0     6   llm_call                           1   model calls a server tool
        0     7   reasoner                           1
        0     8   execute_server_tools               1
        0     9   reasoner                           1   same step and iteration as hop 7
        0     10  compose                            2
        0     11  llm_call                           2   429: sent again as attempt 1, same step key
        0     12  reasoner                           2   model calls a client tool: exit 2
        0     13  persist                            2   turn waits (requires_client_tools)
        1     0   request_handler                    0   results posted; the gateway sends round 1
                                                         [1 client_tool_session_restorer,
                                                          2 session_context_resolver,
                                                          3 context_provider_initializer,
                                                          4 client_tool_continuation_resolver]
        1     5   reasoner                           0   verifies the results -> third LLM call
        1     6   compose                            3
        1     7   llm_call                           3   model answers
        1     8   reasoner                           3   exit 1
        1     9   persist                            3   turn completed

    The gateway builds envelopes too (by task name, without importing workers), so these fields
    are a wire format: a new field needs a default, and none may be renamed.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    turn_id: str
    step: StepName
    round: int = Field(default=0, ge=0)
    """Runs of the turn: 0 for the first, +1 per client-tool-results re-entry (the turn row's round)."""
    hop: int = Field(default=0, ge=0)
    """The message's position in this round's chain; a redelivered or retried message repeats it."""
    iteration: int = Field(default=0, ge=0)
    """The LLM call this step belongs to (0 before the round's first call; counted over the turn)."""
    attempt: int = Field(default=0, ge=0)
    """Times this same step was sent again later (model back-off, busy lease, outage); not in the step key."""
    priority: int = Field(default=0, ge=0, le=9)
    """Broker priority (0 first); see ``shared.broker``. A batch turn's later steps move up to 3."""

    @property
    def step_key(self) -> str:
        """The identity of this step within its turn (``round:hop:step:iteration``), for idempotency."""
        return f"{self.round}:{self.hop}:{self.step.value}:{self.iteration}"

    def to(self, step: StepName, *, iteration: int | None = None) -> TurnEnvelope:
        """The envelope of the next step of the same turn: one hop on, attempt 0.

        Args:
            step: the next step.
            iteration: the LLM call the next step serves; None keeps this envelope's.

        Returns:
            The next step's envelope. Its priority is at most ``BATCH_PRIORITY``: a batch turn
            that has started outranks batch turns that have not.
        """
        return TurnEnvelope(
            turn_id=self.turn_id,
            step=step,
            round=self.round,
            hop=self.hop + 1,
            iteration=self.iteration if iteration is None else iteration,
            priority=min(self.priority, BATCH_PRIORITY),
        )


def first_step(turn_id: str, *, batch: bool, round_: int = 0) -> TurnEnvelope:
    """The message that starts round ``round_`` of a turn: its ``request_handler``, at the turn's priority.

    The gateway sends it for a new turn and a re-entry, the admission scheduler for a released batch
    turn, the reconciler for a stalled turn with no recorded next step. An interactive turn's is
    ``INTERACTIVE_PRIORITY``; a batch turn's first round ``BATCH_START_PRIORITY`` (behind batch turns
    already started), its later rounds ``BATCH_PRIORITY``.
    """
    priority = BATCH_START_PRIORITY if round_ == 0 else BATCH_PRIORITY
    if not batch:
        priority = INTERACTIVE_PRIORITY
    return TurnEnvelope(turn_id=turn_id, step=StepName.REQUEST_HANDLER, round=round_, priority=priority)
