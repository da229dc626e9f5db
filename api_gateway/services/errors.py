"""The gateway services' domain errors; ``api_gateway.errors`` maps each kind to an HTTP status.

AptixError
└── ServiceError            a request the services refuse, with a stable ``code``
    ├── NotFound            no such turn, session or batch for this caller (404)
    ├── Conflict            the request does not fit the current state (409)
    ├── InvalidRequest      the request breaks a rule of the catalog or the limits (422)
    ├── Limited             the organisation is over a limit of its own, for ``retry_after`` seconds (429)
    └── Unavailable         the broker or the state store refused; nothing was recorded (503)
"""

from __future__ import annotations

from typing import Any

from shared.errors import AptixError

__all__ = ["Conflict", "InvalidRequest", "Limited", "NotFound", "ServiceError", "Unavailable"]


class ServiceError(AptixError):
    """A request a gateway service refuses.

    Attributes:
        code: the stable error code of the contract (``session_busy``, ``not_found``, ...).
        message: what went wrong, for the client.
        details: structured details (such as pydantic-style ``loc``/``msg``/``type`` entries), or None.
    """

    def __init__(self, code: str, message: str, details: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details


class NotFound(ServiceError):
    """No turn, session or batch with that id belongs to the caller."""


class Conflict(ServiceError):
    """The request does not fit where the turn or session stands (busy, finished, key reused)."""


class InvalidRequest(ServiceError):
    """The request breaks a rule the request model cannot check (catalog names, limits, webhook URLs)."""

    def __init__(self, message: str, details: Any = None, *, code: str = "invalid_request") -> None:
        super().__init__(code, message, details)


class Limited(ServiceError):
    """The caller's organisation is over one of its limits (``rate_limited``, ``quota_exceeded``); nothing
    was recorded. ``retry_after``: whole seconds until it may be under it again (the ``Retry-After``)."""

    def __init__(self, code: str, message: str, *, retry_after: int) -> None:
        super().__init__(code, message, {"retry_after": retry_after})
        self.retry_after = retry_after


class Unavailable(ServiceError):
    """The broker or the state store refused, so nothing was recorded; the client may retry."""

    def __init__(self, message: str) -> None:
        super().__init__("unavailable", message)
