"""TurnState: everything a step of one turn may read or write, kept in Redis between hops.

Holds the context providers (session- and turn-scoped, AGN-031 §5), the tool ledger, the in-flight
mode, the iteration counter, the composed request and last LLM response, the trace, which
steps already ran (for idempotency under redelivery), and the turn events its next save appends to
the turn's event log (``shared.turn_events``): the trace records it has not sent yet and its outbox.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from shared.models.trace import ExitMode, TraceStep
from shared.models.turn import ClientTool, ModeChange, PendingToolCall, TurnStatus, Usage
from shared.result import ErrorInfo

__all__ = ["LedgerEntry", "ModelRetry", "OutboxEvent", "Providers", "TurnState"]


class Providers(BaseModel):
    """Context providers' content."""

    session_context: list[str] = Field(default_factory=list)
    """Emitted into every LLM call (after the mode's prompt layer)."""
    turn_context: list[str] = Field(default_factory=list)
    """Emitted once (welcome/bootstrap), then cleared by the reasoner."""
    turn_context_emitted: bool = False
    """Set by compose when the turn context went into a request; the reasoner clears it after the call."""
    client_results: list[dict[str, str]] = Field(default_factory=list)
    """ToolResults provider: client tool outputs written by the re-entry path, verified by the reasoner."""


class LedgerEntry(BaseModel):
    """One tool call the model made in this turn, and what became of it."""

    call_id: str
    name: str
    arguments: str
    kind: Literal["server", "client"]
    iteration: int
    status: Literal["pending", "done", "failed"] = "pending"
    output: str | None = None


class ModelRetry(BaseModel):
    """How long one LLM step has been retrying, for its budget (APTIX_LLM_RETRY_BUDGET_SECONDS)."""

    step_key: str
    since: datetime
    """When the step's first try failed (or found the model's breaker open)."""
    calls: int = 0
    """Calls made and failed; waits while the breaker was open are not calls."""


class OutboxEvent(BaseModel):
    """A turn event other than a trace record (the pause, the final status), to append at the next save."""

    event: str
    data: dict[str, Any]


class TurnState(BaseModel):
    """The whole hot state of one turn.

    Its identity fields come from the turn's record and its outcome fields go to the commit point,
    under the same names (``shared.db.records``: ``IDENTITY_FIELDS``, ``TurnOutcome``); its
    ``checkpoint()`` is the snapshot.
    """

    turn_id: str
    session_id: str
    org_id: str
    user_id: str
    batch_id: str | None = None
    created_at: datetime | None = None
    """When the gateway accepted the turn: the conversation context is the turns before it."""
    version: int = 0
    """Bumped by every save; a save from a stale copy is refused."""
    round: int = 0
    status: TurnStatus = TurnStatus.RUNNING
    new_session: bool
    session_created: bool = False
    """The turn's start created its new session (``TurnRepository.start``, in the same write), in ``mode``: the session
    creator step only records it."""
    requested_mode: str | None = None
    mode: str | None = None
    user_input: str
    client_tools: list[ClientTool] = Field(default_factory=list)
    stream: bool = False
    """The request asked to stream (``TurnRequest.stream``): the model's text goes to the turn's event log
    as ``output_text.delta`` events while it is generated."""
    input_items: list[dict[str, Any]] | None = None
    """The turn's own input as Responses API items (``TurnExtras.input_items``): its transcript starts as
    them instead of one user message of ``user_input``; None for a turn without them."""
    instructions: str | None = None
    """Added after the mode's prompt layer and the session context in every model call (``TurnExtras``)."""
    model: str | None = None
    """The model of the turn's calls (``TurnExtras.model``); None: the mode's, else ``APTIX_LLM_MODEL``."""
    model_options: dict[str, Any] = Field(default_factory=dict)
    """Copied into every model request of the turn (``TurnExtras.model_options``); they never replace
    the request's model, input, instructions, tools, store or stream."""
    history: list[dict[str, Any]] = Field(default_factory=list)
    """Conversation context: earlier turns' inputs and answers, as Responses API input items."""
    transcript: list[dict[str, Any]] = Field(default_factory=list)
    """This turn's input items so far: the user message, replayed outputs, tool outputs."""
    providers: Providers = Field(default_factory=Providers)
    pending_request: dict[str, Any] | None = None
    last_response: dict[str, Any] | None = None
    ledger: list[LedgerEntry] = Field(default_factory=list)
    mode_changes: list[ModeChange] = Field(default_factory=list)
    pending_tool_calls: list[PendingToolCall] = Field(default_factory=list)
    output_text: str | None = None
    usage: Usage = Field(default_factory=Usage)
    error: ErrorInfo | None = None
    exit_mode: ExitMode | None = None
    """How the reasoner last ended a run of the turn; None until it first did."""
    continuation: bool = False
    """Set on re-entry once client results are in the ToolResults provider; the reasoner verifies them."""
    steps_done: dict[str, dict[str, Any] | None] = Field(default_factory=dict)
    """step key -> the next envelope it sent (None at the end of the chain)."""
    next_envelope: dict[str, Any] | None = None
    """The envelope of the step the turn waits to run (its frontier); None once its chain ended.
    The reconciler sends it again when the turn stops moving."""
    model_retry: ModelRetry | None = None
    trace: list[TraceStep] = Field(default_factory=list)
    events_through: int = 0
    """The trace records up to this ``seq`` are in the turn's event log; the next save appends the others."""
    outbox: list[OutboxEvent] = Field(default_factory=list)
    """Events the next save appends to the turn's event log after the trace records it has not sent."""

    def checkpoint(self) -> dict[str, Any]:
        """The state as the database keeps it: without the conversation history, which is reloaded."""
        return self.model_dump(mode="json", exclude={"history"})

    def unsent_events(self) -> list[tuple[str, dict[str, Any]]]:
        """The events a save of this state appends to the turn's log: the trace records not sent yet
        (``trace``, data: the record), then the outbox, in order; as (name, data) pairs."""
        unsent: list[tuple[str, dict[str, Any]]] = [
            ("trace", step.model_dump(mode="json")) for step in self.trace if step.seq > self.events_through
        ]
        unsent += [(item.event, item.data) for item in self.outbox]
        return unsent

    def record(
        self,
        kind: str,
        *,
        at: datetime,
        step: str,
        worker: str,
        duration_ms: float | None = None,
        **data: Any,
    ) -> None:
        """Append a trace step."""
        self.trace.append(
            TraceStep(
                seq=len(self.trace) + 1,
                kind=kind,
                at=at,
                step=step,
                worker=worker,
                duration_ms=duration_ms,
                data=data,
            )
        )
