"""The ``Idempotency-Key`` header of the OpenAI face's creates (a response, a batch): its length, and a repeat.

A create that names a key used before answers what the first one made, if it was the same request
(the same ``request_hash``), and ``409 idempotency_key_reused`` otherwise.
"""

from __future__ import annotations

from api_gateway.openai.errors import invalid
from api_gateway.services.errors import Conflict

__all__ = ["check_key", "check_repeat"]


def check_key(key: str, *, max_chars: int) -> None:
    """Refuse an empty key or one longer than ``max_chars``.

    Raises:
        InvalidRequest: 400 naming ``Idempotency-Key``.
    """
    if not key or len(key) > max_chars:
        raise invalid(f"Idempotency-Key must be 1 to {max_chars} characters", ("Idempotency-Key",))


def check_repeat(earlier_hash: str, request_hash: str) -> None:
    """Refuse a request that repeats a key with another body than the first request's.

    Raises:
        Conflict: ``idempotency_key_reused``.
    """
    if earlier_hash != request_hash:
        raise Conflict("idempotency_key_reused", "this Idempotency-Key was used before with a different request")
