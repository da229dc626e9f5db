"""Turn contracts: TurnRequest in, TurnHandle and Turn out, and the pieces they carry."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
    StrictBool,
    StringConstraints,
    field_validator,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, core_schema

from shared.result import ErrorInfo

__all__ = [
    "NUL_FREE",
    "NUL_FREE_PATTERN",
    "UNFINISHED_STATUSES",
    "ClientMetadata",
    "ClientTool",
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
    "check_json_strings",
]

JsonObject = dict[str, Any]
_MAX_JSON_DEPTH = 64
ToolName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
NUL_FREE_PATTERN = r"^[^\x00]*$"
"""The JSON Schema ``pattern`` of a string that may not hold NUL (valid as ECMA-262, Python and Rust regex)."""


def _no_nul(value: str) -> str:
    # PostgreSQL text and JSON cannot hold NUL; refuse it at the edge instead of failing later.
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


class _NulFree:
    """``Annotated`` metadata: the string may not hold NUL, and its JSON Schema says so (``pattern``)."""

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        return core_schema.no_info_after_validator_function(_no_nul, handler(source))

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> JsonSchemaValue:
        json_schema = handler(schema)
        json_schema["pattern"] = NUL_FREE_PATTERN
        return json_schema


_NUL_FREE = _NulFree()
NUL_FREE = _NUL_FREE
"""``Annotated`` metadata for a request string that may not hold NUL (the schema says so with a ``pattern``)."""


def _constrain_keys(schema: JsonDict) -> None:
    # pydantic turns a key pattern into patternProperties, which lets keys that do not match through
    # unconstrained; as propertyNames it refuses them, as the server does.
    pattern_properties = schema.pop("patternProperties", None)
    if isinstance(pattern_properties, dict):
        ((pattern, values),) = pattern_properties.items()
        names = schema.setdefault("propertyNames", {})
        assert isinstance(names, dict)
        names["pattern"] = pattern
        schema["additionalProperties"] = values


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


def check_json_strings(value: Any) -> None:
    """Refuse NUL, lone surrogates and nesting deeper than 64 levels anywhere in a decoded JSON ``value``.

    Raises:
        ValueError: what is wrong (PostgreSQL cannot store NUL; a lone surrogate cannot be encoded).
    """
    _check_json_strings(value)


def _valid_text(value: str) -> str:
    # Free-form JSON (tool parameters) is not checked by pydantic's str validation: do it here.
    return _encodable(_no_nul(value))


def _encodable(value: str) -> str:
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
    """A client tool in the Responses API function-tool shape: the model may call it, the client runs it."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    type: Literal["function"] = "function"
    """Always `function`."""
    name: ToolName
    """The name the model calls it by: 1 to 64 letters, digits, `_` or `-`. Unique among the request's tools,
    and not the name of a server tool of the catalog (`GET /v1/modes` lists them): either is 422."""
    description: Annotated[str, StringConstraints(max_length=4096), _NUL_FREE] | None = None
    """What the tool does, for the model (at most 4096 characters)."""
    parameters: JsonObject = Field(default_factory=lambda: {"type": "object", "properties": {}})
    """A JSON Schema of `type` `object` for the tool's arguments (default: no arguments). No string in it (key
    or value) may hold NUL or a lone surrogate, and it may not nest deeper than 64 levels: each is 422."""
    strict: bool = Field(default=False, strict=True)
    """Whether the model must follow `parameters` exactly (Responses API strict mode); `true` or `false` only."""

    @field_validator("parameters")
    @classmethod
    def _schema_is_object(cls, value: JsonObject) -> JsonObject:
        if value.get("type", "object") != "object":
            raise ValueError("parameters must be a JSON Schema of type object")
        _check_json_strings(value)
        return value


ClientMetadata = Annotated[
    dict[
        Annotated[str, StringConstraints(min_length=1, max_length=64), _NUL_FREE],
        Annotated[str, StringConstraints(max_length=512), _NUL_FREE],
    ],
    Field(max_length=16, json_schema_extra=_constrain_keys),
]
"""The client's own string values: at most 16, keys of 1 to 64 characters, values of at most 512 (a turn's
``metadata``, an OpenAI conversation's)."""


class TurnRequest(BaseModel):
    """`POST /v1/turns`: a new session (no `session_id`) or a follow-up turn."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    session_id: Annotated[str, StringConstraints(max_length=128), _NUL_FREE] | None = None
    """The session to continue, as a `TurnHandle` returned it; absent, null or empty starts a new session. A
    session the caller's organisation does not have is 404 `session_not_found`; one with an unfinished turn
    is 409 `session_busy`."""
    mode: Annotated[str, StringConstraints(max_length=64), _NUL_FREE] | None = None
    """The mode of a new session, a name from `GET /v1/modes` (an unknown one is 422); absent: the catalog's
    default. Ignored on a follow-up turn, where the session's persisted mode wins."""
    input: Annotated[str, StringConstraints(min_length=1), _NUL_FREE]
    """The user's message; not blank (only whitespace is 422)."""
    tools: Annotated[list[ClientTool], Field(max_length=128)] = Field(default_factory=list)
    """The client's tools, at most 128, with unique names (a repeated name is 422)."""
    metadata: ClientMetadata = Field(default_factory=dict)
    """At most 16 string values of the client's own (keys of 1 to 64, values of at most 512 characters),
    kept with the turn's request."""
    idempotency_key: Annotated[str, StringConstraints(min_length=1, max_length=255), _NUL_FREE] | None = None
    """Makes a retried POST safe: the same key with the same body from the same organisation returns the
    turn the first POST created; with another body it is 409 `idempotency_key_reused`."""
    webhook_url: Annotated[str, StringConstraints(max_length=2048), _NUL_FREE] | None = None
    """Where this turn's events (completed, failed, cancelled, paused for client tools) are POSTed,
    signed; else the organisation's default, if any."""
    stream: StrictBool = False
    """Answer with the turn's events (`text/event-stream`, as `GET /v1/turns/{turn_id}/events`) instead of a
    `TurnHandle`, and have the model's text streamed as it is generated; `?stream=true` sets it too. Not part
    of what an `idempotency_key` stands for."""

    @field_validator("input")
    @classmethod
    def _input_has_text(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("input must not be blank")
        return value

    @field_validator("session_id", "mode", "idempotency_key", "webhook_url")
    @classmethod
    def _empty_is_none(cls, value: str | None) -> str | None:
        return value or None

    @model_validator(mode="after")
    def _unique_tool_names(self) -> TurnRequest:
        names = [tool.name for tool in self.tools]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"tool names must be unique; repeated: {', '.join(duplicates)}")
        return self


class TurnHandle(BaseModel):
    """What `POST /v1/turns` (and `POST /v1/turns/{turn_id}/tool-results`) answer at once: 202."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    turn_id: str
    """The turn's id (`turn_…`): read it with `GET /v1/turns/{turn_id}`."""
    session_id: str
    """The turn's session (`sess_…`), new or continued: send it back to continue the conversation."""
    status: TurnStatus
    """Where the turn stands: `queued` when just created (or as an idempotent retry found it)."""


class ModeChange(BaseModel):
    """One successful mode change inside a turn."""

    model_config = ConfigDict(populate_by_name=True, use_attribute_docstrings=True)

    from_mode: str = Field(alias="from")
    """The mode before the change."""
    to_mode: str = Field(alias="to")
    """The mode after the change."""
    reason: str | None = None
    """Why the model changed mode, as it said."""
    branch: bool = False
    """Whether the change branched the conversation (the new mode starts without the earlier turns' history)."""


class PendingToolCall(BaseModel):
    """A client tool call the model made; the client runs it and posts the output."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    call_id: str
    """The call's id: post its output under this `call_id`."""
    name: str
    """The client tool called."""
    arguments: str
    """The arguments as a JSON string (the Responses API's `function_call.arguments`)."""


class ToolResult(BaseModel):
    """One client tool output."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    call_id: Annotated[str, StringConstraints(min_length=1, max_length=128), _NUL_FREE]
    """The `call_id` of the pending tool call this answers."""
    output: Annotated[str, _NUL_FREE]
    """The tool's output, as text for the model (no NUL, no lone surrogates)."""

    @field_validator("output", "call_id")
    @classmethod
    def _valid_text(cls, value: str) -> str:
        # The output goes to the model as JSON text: a lone surrogate cannot be encoded there.
        return _encodable(value)


class ToolResultsRequest(BaseModel):
    """`POST /v1/turns/{turn_id}/tool-results`: the outputs of the turn's pending client tool calls."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    tool_results: Annotated[list[ToolResult], Field(max_length=128)]
    """One output per pending call, at most 128. The gateway does not judge the set: a missing, repeated,
    extra or unknown `call_id` fails the turn `continuation_mismatch` once a worker checks it."""


class Usage(BaseModel):
    """Token and call counts of a turn."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    llm_calls: int = 0
    """Model calls the turn made."""
    input_tokens: int = 0
    """Input tokens over those calls, as the model reported them."""
    output_tokens: int = 0
    """Output tokens over those calls, as the model reported them."""


class Turn(BaseModel):
    """A turn's state and result."""

    model_config = ConfigDict(populate_by_name=True, use_attribute_docstrings=True)

    turn_id: str
    """The turn's id (`turn_…`)."""
    session_id: str
    """The turn's session (`sess_…`)."""
    batch_id: str | None = None
    """The batch the turn belongs to (`batch_…`), or null."""
    status: TurnStatus
    """Where the turn stands."""
    mode: str | None
    """The authoritative mode after this turn (the requested or default one until the turn ran); clients
    send it back on their next turn."""
    mode_changes: list[ModeChange] = Field(default_factory=list)
    """The mode changes the model made during the turn, in order."""
    output_text: str | None = None
    """The final assistant text, or null (not finished, failed, or waiting for client tools)."""
    pending_tool_calls: list[PendingToolCall] = Field(default_factory=list)
    """When `status` is `requires_client_tools`: the client tool calls to run and post results for."""
    error: ErrorInfo | None = None
    """What went wrong when `status` is `failed` (or `cancelled`), else null."""
    usage: Usage = Field(default_factory=Usage)
    """The turn's model calls and tokens."""
    created_at: datetime
    """When the turn was created (ISO 8601, UTC)."""
    completed_at: datetime | None = None
    """When the turn finished (ISO 8601, UTC), or null."""
