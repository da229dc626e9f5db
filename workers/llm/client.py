"""ResponsesClient: one POST to ``{base_url}/responses`` per call, over a shared ``httpx.Client``."""

from __future__ import annotations

import logging
import os
from typing import Any
from urllib.parse import urlsplit

import httpx

from shared.errors import LlmError
from workers.llm.parsing import parse_error, parse_response
from workers.llm.types import LlmResponse

__all__ = ["LOCAL_ONLY_ENV", "ResponsesClient"]

logger = logging.getLogger(__name__)

LOCAL_ONLY_ENV = "APTIX_LLM_LOCAL_ONLY"
"""When this environment variable is "1", the client refuses non-loopback hosts (set by tests)."""

_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class ResponsesClient:
    """A Responses API client, built once per worker process.

    It never retries: a retryable :class:`LlmError` goes back to the caller, which reschedules.
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        timeout: float = 120.0,
        transport: httpx.BaseTransport | None = None,
        max_connections: int = 50,
    ) -> None:
        """Build the client and its connection pool.

        Args:
            base_url: the API root, e.g. ``https://api.openai.com/v1``.
            api_key: the bearer key; no ``Authorization`` header is sent when empty.
            timeout: seconds for each of connect, read, write and pool waits.
            transport: an httpx transport to use instead of the network (tests).
            max_connections: the connection pool size.

        Raises:
            ValueError: ``APTIX_LLM_LOCAL_ONLY=1`` and ``base_url`` is not a loopback host.
        """
        if os.environ.get(LOCAL_ONLY_ENV) == "1" and not _is_loopback(base_url):
            raise ValueError(
                f"{LOCAL_ONLY_ENV}=1 allows only 127.0.0.1, localhost or ::1; refusing LLM base_url {base_url!r}"
            )
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._url = base_url.rstrip("/") + "/responses"
        self._http = httpx.Client(
            headers=headers,
            timeout=httpx.Timeout(timeout),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
            transport=transport,
        )

    def create(self, request: dict[str, Any]) -> LlmResponse:
        """POST one request and parse the answer.

        Args:
            request: the Responses API request body, sent unchanged as JSON.

        Returns:
            The parsed response.

        Raises:
            LlmError: an error answer (see :func:`parse_error`), a transport failure or timeout
                (``status_code`` 0, retryable), or a body that is not a usable response.
        """
        try:
            answer = self._http.post(self._url, json=request)
        except httpx.TransportError as exc:
            logger.warning("LLM request to %s failed: %s", self._url, type(exc).__name__)
            raise LlmError(
                f"LLM request failed before an answer ({type(exc).__name__})", status_code=0, retryable=True
            ) from exc
        if not answer.is_success:
            error = parse_error(answer.status_code, answer.content, answer.headers)
            logger.warning("LLM answered %d (retryable=%s)", answer.status_code, error.retryable)
            raise error
        try:
            body = answer.json()
        except ValueError as exc:
            raise LlmError(
                f"LLM server answered {answer.status_code} with a body that is not JSON",
                status_code=answer.status_code,
            ) from exc
        return parse_response(body)

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()


def _is_loopback(base_url: str) -> bool:
    """Whether the URL's host is 127.0.0.1, localhost or ::1."""
    return (urlsplit(base_url).hostname or "").lower() in _LOCAL_HOSTS
