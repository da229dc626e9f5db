"""The few real exceptions of Aptix. Expected domain failures are InvokeResult failures, not these.

AptixError
├── ConfigurationError      bad settings or mode catalog, refused at start-up
├── LlmError                the Responses API answered with an error or an unusable body
├── StateConflict           a concurrent writer changed turn state first
├── StepBusy                another worker holds the step's lease
├── TurnNotRecorded         a message arrived before the gateway's commit of its turn was visible
└── TurnFailed              a step failed its turn: the step's task reports it, so Celery and
                            Flower show that task as failed (the turn's failure is already recorded)
"""

from __future__ import annotations

__all__ = [
    "AptixError",
    "ConfigurationError",
    "LlmError",
    "StateConflict",
    "StepBusy",
    "TurnFailed",
    "TurnNotRecorded",
]


class AptixError(Exception):
    """Base of every Aptix exception."""


class ConfigurationError(AptixError):
    """Settings or the mode catalog are unusable; the process refuses to start."""


class StateConflict(AptixError):
    """Turn state changed under us (a duplicate delivery raced this one)."""


class StepBusy(AptixError):
    """Another worker holds this step's lease: it is running the step now."""


class TurnNotRecorded(AptixError):
    """The turn's row (or its latest change) is not visible yet: the gateway enqueues before it commits."""


class TurnFailed(AptixError):
    """A step failed its turn; raised by the step's task once the failure is recorded and sent on.

    It carries only the turn's error code and message, which the turn records and its client sees
    (model errors are redacted before they are recorded), never an exception or a traceback of the
    step: Celery puts this exception's repr in the task-failed event Flower shows. Celery is told
    to expect it (no traceback in the worker's log) and acknowledges the message (never retried).

    Attributes:
        code: the turn's error code (``shared.result.ErrorCode`` value).
        message: the turn's error message, cut to :data:`MESSAGE_LIMIT` characters.
    """

    MESSAGE_LIMIT = 300
    """Longer messages are cut: the turn keeps the whole message; this is a pointer to it."""

    def __init__(self, code: str, message: str) -> None:
        if len(message) > self.MESSAGE_LIMIT:
            message = message[: self.MESSAGE_LIMIT - 1] + "…"
        # Both in args: a prefork child pickles the exception back to its parent, which rebuilds it
        # from args.
        super().__init__(code, message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class LlmError(AptixError):
    """The LLM server answered with an error, or with a body we cannot use.

    Attributes:
        status_code: the HTTP status (0 when the request never got an answer).
        code: the provider's error code, when it gave one.
        retryable: whether trying again later may succeed (429 rate limits, 5xx, transport errors).
        retry_after: seconds the server asked us to wait, when it said.
    """

    def __init__(
        self,
        message: str,
        *,
        status_code: int = 0,
        code: str | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.code = code
        self.retryable = retryable
        self.retry_after = retry_after
