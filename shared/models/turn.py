"""Turn contracts: TurnRequest in, TurnHandle and Turn out, and the pieces they carry."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

from shared.result import ErrorInfo

__all__ = [
    "UNFINISHED_STATUSES",
    "ClientTool",
    "ErrorBody",
    "JsonObject",
    "ModeChange",
    "PendingToolCall",
    "ToolResult",
    "ToolResultsRequest",
    "Turn",
    "TurnHandle",
    "TurnRequest",
    "TurnStatus",
    "Usage",
]

JsonObject = dict[str, Any]
_MAX_JSON_DEPTH = 64
ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]


def _no_nul(value: str) -> str:
    # PostgreSQL text and JSON cannot hold NUL; refuse it at the edge instead of failing later.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


def _check_json_strings(value: Any) -> None:
    """Refuse NUL, lone surrogates and nesting deeper than ``_MAX_JSON_DEPTH`` anywhere in ``value``.

    Iterative, so a hostile nesting depth is a validation error, never a RecursionError.
    """
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, str):
            _valid_text(item)
        elif isinstance(item, dict | list):
            if depth > _MAX_JSON_DEPTH:
                raise ValueError(f"must not be nested deeper than {_MAX_JSON_DEPTH} levels")
            if isinstance(item, dict):
                stack.extend((key, depth) for key in item)
                stack.extend((child, depth + 1) for child in item.values())
            else:
                stack.extend((child, depth + 1) for child in item)


def _valid_text(value: str) -> str:
    # Free-form JSON (tool parameters) is not checked by pydantic's str validation: do it here.
    _no_nul(value)
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must be valid Unicode (no lone surrogates)") from None
    return value


class TurnStatus(StrEnum):
    """Where a turn stands."""

    QUEUED = "queued"
    RUNNING = "running"
    REQUIRES_CLIENT_TOOLS = "requires_client_tools"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def is_terminal(self) -> bool:
        """The turn is over (completed, failed or cancelled): nothing changes it again."""
        return self in _TERMINAL

    @property
    def is_unfinished(self) -> bool:
        """The turn may still change: queued, running or paused for client tools.

        A session with an unfinished turn is busy.
        """
        return self not in _TERMINAL

    @property
    def is_in_flight(self) -> bool:
        """The pipeline owes the turn its next step (queued or running): the reconciler watches it.

        Unfinished but not in flight means paused for client tools: the client owes the next move.
        """
        return self in _IN_FLIGHT

    @classmethod
    def terminal(cls) -> frozenset[TurnStatus]:
        """Every status for which :attr:`is_terminal` holds."""
        return _TERMINAL

    @classmethod
    def unfinished(cls) -> frozenset[TurnStatus]:
        """Every status for which :attr:`is_unfinished` holds."""
        return frozenset(cls) - _TERMINAL

    @classmethod
    def in_flight(cls) -> frozenset[TurnStatus]:
        """Every status for which :attr:`is_in_flight` holds."""
        return _IN_FLIGHT


_TERMINAL = frozenset({TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.CANCELLED})
_IN_FLIGHT = frozenset({TurnStatus.QUEUED, TurnStatus.RUNNING})

UNFINISHED_STATUSES = TurnStatus.unfinished()
"""A session with a turn in one of these is busy (the same set as :meth:`TurnStatus.unfinished`)."""


class ClientTool(BaseModel):
    """A client tool in the Responses API function-tool shape."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: Literal["function"] = "function"
    name: ToolName
    description: Annotated[str, StringConstraints(max_length=4096)] | None = None
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})
    strict: bool = False

    @field_validator("parameters")
    @classmethod
    def _schema_is_object(cls, value: JsonObject) -> JsonObject:
        if value.get("type", "object") != "object":
            raise ValueError("parameters must be a JSON Schema of type object")
        _check_json_strings(value)
        return value

    @field_validator("description")
    @classmethod
    def _description_no_nul(cls, value: str | None) -> str | None:
        return None if value is None else _no_nul(value)


class TurnRequest(BaseModel):
    """``POST /v1/turns``: a new session (no ``session_id``) or a follow-up turn."""

    model_config = ConfigDict(extra="forbid")

    session_id: Annotated[str, StringConstraints(max_length=128)] | None = None
    mode: Annotated[str, StringConstraints(max_length=64)] | None = None
    input: Annotated[str, StringConstraints(min_length=1)]
    tools: Annotated[list[ClientTool], Field(max_length=128)] = Field(default_factory=list)
    metadata: dict[
        Annotated[str, StringConstraints(min_length=1, max_length=64)],
        Annotated[str, StringConstraints(max_length=512)],
    ] = Field(default_factory=dict, max_length=16)
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=255)] | None = None
    stream: bool = False
    """Answer with the turn's events (``text/event-stream``) and have the model's text streamed as it is
    generated; ``POST /v1/turns?stream=true`` sets it. Recorded with the request only when true."""

    @field_validator("input")
    @classmethod
    def _input_has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must not be blank")
        return _no_nul(value)

    @field_validator("session_id", "mode", "idempotency_key")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return _no_nul(value) or None if value is not None else None

    @field_validator("metadata")
    @classmethod
    def _metadata_no_nul(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            _no_nul(key)
            _no_nul(item)
        return value

    @model_validator(mode="after")
    def _unique_tool_names(self) -> TurnRequest:
        names = [tool.name for tool in self.tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(duplicates)}")
        return self


class TurnHandle(BaseModel):
    """What ``POST /v1/turns`` answers at once."""

    turn_id: str
    session_id: str
    status: TurnStatus


class ModeChange(BaseModel):
    """One successful mode change inside a turn."""

    model_config = ConfigDict(populate_by_name=True)

    from_mode: str = Field(alias="from")
    to_mode: str = Field(alias="to")
    reason: str | None = None
    branch: bool = False


class PendingToolCall(BaseModel):
    """A client tool call the model made; the client runs it and posts the output."""

    call_id: str
    name: str
    arguments: str


class ToolResult(BaseModel):
    """One client tool output."""

    model_config = ConfigDict(extra="forbid")

    call_id: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    output: str

    @field_validator("output", "call_id")
    @classmethod
    def _valid_text(cls, value: str) -> str:
        # The output goes to the model as JSON text: a lone surrogate cannot be encoded there.
        return _valid_text(value)


class ToolResultsRequest(BaseModel):
    """``POST /v1/turns/{turn_id}/tool-results``."""

    model_config = ConfigDict(extra="forbid")

    tool_results: Annotated[list[ToolResult], Field(max_length=128)]


class Usage(BaseModel):
    """Token and call counts of a turn."""

    llm_calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0


class Turn(BaseModel):
    """A turn's state and result."""

    model_config = ConfigDict(populate_by_name=True)

    turn_id: str
    session_id: str
    batch_id: str | None = None
    status: TurnStatus
    mode: str | None
    mode_changes: list[ModeChange] = Field(default_factory=list)
    output_text: str | None = None
    pending_tool_calls: list[PendingToolCall] = Field(default_factory=list)
    error: ErrorInfo | None = None
    usage: Usage = Field(default_factory=Usage)
    created_at: datetime
    completed_at: datetime | None = None


class ErrorBody(BaseModel):
    """The one error body of the HTTP API: ``{"error": {"code", "message", "details"}}``."""

    class Detail(BaseModel):
        code: str
        message: str
        details: Any = None

    error: Detail
