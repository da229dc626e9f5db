"""Parsing of Responses API bodies: a response into an LlmResponse, an error answer into an LlmError.

Replay: the composer sends a response's output items back as ``input`` of the next request of the
same turn (stateless, ``store: false``). The SDK input type of a replayed ``function_call`` item
(``ResponseFunctionToolCallParam``, checked with the fixtures' ``validate.py``, openai 3.54) accepts
exactly ``type``, ``call_id``, ``name``, ``arguments`` (a JSON string), ``id`` (optional) and
``status`` (optional, one of ``in_progress``/``completed``/``incomplete``; ``null`` is rejected).
Unknown keys are rejected. Recorded message and reasoning items replay unchanged, so
:func:`replay_items` only whitelists ``function_call`` keys and drops ``None`` values.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from shared.errors import LlmError
from shared.redaction import redact
from workers.llm.types import FunctionCall, LlmResponse

__all__ = ["failed_error", "parse_error", "parse_response", "replay_items"]

logger = logging.getLogger(__name__)

_MAX_MESSAGE_CHARS = 500
_RETRYABLE_FAILED_CODES = frozenset({"server_error", "rate_limit_exceeded"})
_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_FUNCTION_CALL_REPLAY_KEYS = ("type", "id", "call_id", "name", "arguments", "status")
_ITEM_STATUSES = frozenset({"in_progress", "completed", "incomplete"})


def parse_response(body: object) -> LlmResponse:
    """Normalise a Responses API response object.

    Args:
        body: the decoded JSON body of a 2xx answer.

    Returns:
        The response text, function calls, raw output items and token usage.

    Raises:
        LlmError: the body is not a usable response, or the response failed or is incomplete.
    """
    if not isinstance(body, dict):
        raise LlmError(f"LLM response is not a JSON object (got {type(body).__name__})")
    status = body.get("status")
    if status == "failed":
        raise failed_error(body.get("error"))
    if status == "incomplete":
        details = body.get("incomplete_details")
        reason = details.get("reason") if isinstance(details, dict) else None
        raise LlmError(f"LLM response is incomplete (reason: {reason!r})", code="incomplete")
    output = body.get("output")
    if not isinstance(output, list):
        raise LlmError("LLM response has no 'output' list")
    texts: list[str] = []
    calls: list[FunctionCall] = []
    items: list[dict[str, Any]] = []
    for index, item in enumerate(output):
        if not isinstance(item, dict):
            raise LlmError(f"LLM response output item {index} is not an object")
        items.append(item)
        kind = item.get("type")
        if kind == "message":
            texts.extend(_message_texts(item, index))
        elif kind == "function_call":
            calls.append(_function_call(item, index))
    input_tokens, output_tokens = _usage(body.get("usage"))
    response_id = body.get("id")
    return LlmResponse(
        response_id=response_id if isinstance(response_id, str) else "",
        output_text="".join(texts) if texts else None,
        function_calls=tuple(calls),
        output_items=tuple(items),
        input_tokens=input_tokens,
        output_tokens=output_tokens,
    )


def parse_error(
    status_code: int, body: bytes | str, headers: Mapping[str, str], *, secrets: Sequence[str] = ()
) -> LlmError:
    """Map a non-2xx answer to an LlmError.

    Args:
        status_code: the HTTP status.
        body: the raw body, usually the OpenAI error envelope ``{"error": {...}}``.
        headers: the response headers (any mapping; names are matched case-insensitively).
        secrets: values redacted from the provider's message (it becomes the turn's error, a
            trace record and a batch result; some providers echo the key they received).

    Returns:
        The error, retryable for 408/409/5xx and 429 other than ``insufficient_quota``.
    """
    text = body.decode("utf-8", errors="replace") if isinstance(body, bytes) else body
    error_type: str | None = None
    code: str | None = None
    message = ""
    try:
        decoded = json.loads(text) if text else None
    except ValueError:
        decoded = None
    envelope = decoded.get("error") if isinstance(decoded, dict) else None
    if isinstance(envelope, dict):
        error_type = _str_or_none(envelope.get("type"))
        code = _str_or_none(envelope.get("code"))
        message = str(envelope.get("message") or "")
    elif isinstance(envelope, str):
        message = envelope
    else:
        message = text.strip()
    if status_code == 429:
        retryable = "insufficient_quota" not in (code, error_type)
    else:
        retryable = status_code in _RETRYABLE_STATUSES or status_code >= 500
    label = "/".join(part for part in (error_type, code) if part)
    prefix = f"LLM server answered {status_code}" + (f" ({label})" if label else "")
    return LlmError(
        f"{prefix}: {_truncate(redact(message, secrets)) or '<no message>'}",
        status_code=status_code,
        code=code or error_type,
        retryable=retryable,
        retry_after=_retry_after(headers),
    )


def replay_items(response: LlmResponse) -> list[dict[str, Any]]:
    """The response's output items, cleaned to be sent back as ``input`` of the next request.

    Args:
        response: a parsed response.

    Returns:
        New dicts: ``function_call`` items keep only the keys the API input type accepts (and a
        valid ``status``); every item loses ``None``-valued keys.
    """
    cleaned: list[dict[str, Any]] = []
    for item in response.output_items:
        if item.get("type") == "function_call":
            kept = {key: item[key] for key in _FUNCTION_CALL_REPLAY_KEYS if key in item}
            if kept.get("status") not in _ITEM_STATUSES:
                kept.pop("status", None)
        else:
            kept = dict(item)
        cleaned.append({key: value for key, value in kept.items() if value is not None})
    return cleaned


def failed_error(error: object) -> LlmError:
    """The LlmError for a generation the server reports failed after a 200 (``status: "failed"``, a
    stream's ``error`` event).

    Args:
        error: the ``error`` object (``{"code", "message"}``), if any.

    Returns:
        The error, retryable for ``server_error`` and ``rate_limit_exceeded``.
    """
    code = message = None
    if isinstance(error, dict):
        code = _str_or_none(error.get("code"))
        message = _str_or_none(error.get("message"))
    return LlmError(
        f"LLM response failed ({code or 'no code'}): {_truncate(message or '<no message>')}",
        code=code,
        retryable=code in _RETRYABLE_FAILED_CODES,
    )


def _message_texts(item: dict[str, Any], index: int) -> list[str]:
    """The ``output_text`` parts of one message item."""
    content = item.get("content")
    if not isinstance(content, list):
        raise LlmError(f"LLM response message item {index} has no content list")
    return [
        part["text"]
        for part in content
        if isinstance(part, dict) and part.get("type") == "output_text" and isinstance(part.get("text"), str)
    ]


def _function_call(item: dict[str, Any], index: int) -> FunctionCall:
    """One ``function_call`` item, checked."""
    call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments")
    if not isinstance(call_id, str) or not call_id:
        raise LlmError(f"LLM function_call item {index} has no call_id")
    if not isinstance(name, str) or not name:
        raise LlmError(f"LLM function_call item {index} ({call_id!r}) has no name")
    if not isinstance(arguments, str):
        raise LlmError(
            f"LLM function_call item {index} ({call_id!r}) has arguments of type "
            f"{type(arguments).__name__}, expected a JSON string"
        )
    item_id = item.get("id")
    return FunctionCall(
        call_id=call_id, name=name, arguments=arguments, item_id=item_id if isinstance(item_id, str) else None
    )


def _usage(usage: object) -> tuple[int, int]:
    """Input and output tokens; 0 for whatever is missing."""
    if not isinstance(usage, dict):
        return 0, 0
    return _int_or_zero(usage.get("input_tokens")), _int_or_zero(usage.get("output_tokens"))


def _retry_after(headers: Mapping[str, str]) -> float | None:
    """Seconds to wait: ``retry-after-ms`` first, then ``retry-after`` in seconds (dates ignored)."""
    lowered = {key.lower(): value for key, value in headers.items()}
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = lowered.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw) / scale
        except ValueError:
            logger.debug("ignoring unparsable %s header %r", name, raw)
            continue
        if math.isfinite(seconds) and seconds >= 0:
            return seconds
    return None


def _truncate(text: str) -> str:
    """Bound a provider message for logs and traces."""
    text = text.strip()
    if len(text) <= _MAX_MESSAGE_CHARS:
        return text
    return text[:_MAX_MESSAGE_CHARS] + "…"


def _str_or_none(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _int_or_zero(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0
