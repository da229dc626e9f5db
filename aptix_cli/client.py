"""``ApiClient``: a small synchronous HTTP client for the gateway's public API (API.md).

One method per endpoint, each returning the decoded JSON body. A response that is not a success
raises :class:`GatewayError` with the ``{"error": {"code", "message"}}`` of the body; a gateway that
cannot be reached raises :class:`GatewayUnreachable`. Both derive from :class:`ClientError`::

    with ApiClient("http://127.0.0.1:8000", key="…") as api:
        turn = api.create_turn({"input": "Hello"}, wait=30)

The ``aptix`` client commands and the demo use it; it imports nothing of the server packages.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO

import httpx

from aptix_cli.sse import ServerEvent, parse_events

__all__ = ["MAX_WAIT_SECONDS", "ApiClient", "ClientError", "GatewayError", "GatewayUnreachable"]

MAX_WAIT_SECONDS = 60.0
"""The longest ``?wait=`` the gateway accepts (API.md)."""

_CONNECT_TIMEOUT = 10.0
_READ_MARGIN = 30.0
"""Seconds a read may take beyond the long-poll the request asked for."""
_STREAM_READ_TIMEOUT = 60.0
"""Seconds an event stream may stay silent (the gateway sends a comment every 15 s) before it counts as cut."""
_UPLOAD_READ_TIMEOUT = 900.0
"""Seconds an upload's answer may take (the gateway checks and records every line first)."""
_STREAM_RETRIES = 5
"""Reconnections in a row, after a cut stream, before giving up."""


class ClientError(Exception):
    """Any failure of a call through :class:`ApiClient`."""


class GatewayError(ClientError):
    """The gateway answered with an error status (as seen by a client).

    Not the gateway's own ``api_gateway.errors.ApiError``, which a route raises to produce such an
    answer; this is the answer decoded on the other side of the wire.

    Attributes:
        status: The HTTP status code.
        code: The ``error.code`` of the body (``http_<status>`` when the body has none).
        message: The ``error.message`` of the body (or the start of the raw body).
        details: The ``error.details`` of the body, if any.
    """

    def __init__(self, status: int, code: str, message: str, details: object = None) -> None:
        super().__init__(f"error {status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details = details


class GatewayUnreachable(ClientError):
    """No HTTP answer came from the gateway (refused, DNS, timeout, broken connection).

    Attributes:
        url: The gateway's base URL.
        reason: What went wrong, from the transport.
    """

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the gateway at {url}: {reason}")
        self.url = url
        self.reason = reason


class ApiClient:
    """The gateway's ``/v1`` API over one pooled ``httpx.Client``.

    Args:
        base_url: The gateway, e.g. ``http://127.0.0.1:8000`` (without ``/v1``).
        key: The API key sent as ``Authorization: Bearer <key>``.
        timeout: Seconds for calls that do not long-poll (long-polls add their ``wait``).
        transport: An httpx transport to use instead of the network (tests).
    """

    def __init__(
        self, base_url: str, *, key: str, timeout: float = 30.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._timeout = timeout
        self._http = httpx.Client(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {key}", "User-Agent": "aptix-cli"},
            timeout=httpx.Timeout(timeout, connect=_CONNECT_TIMEOUT),
            transport=transport,
        )

    def __enter__(self) -> ApiClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool."""
        self._http.close()

    def create_turn(self, request: Mapping[str, Any], *, wait: float | None = None) -> dict[str, Any]:
        """``POST /v1/turns``.

        Args:
            request: A TurnRequest (``input``, optional ``session_id``, ``mode``, ``tools``, …).
            wait: Long-poll up to this many seconds (capped at 60); falsy returns at once.

        Returns:
            A ``Turn`` when ``wait`` is given, else a ``TurnHandle`` (``turn_id``, ``session_id``, ``status``).

        Raises:
            GatewayError: The gateway refused the request.
            GatewayUnreachable: No answer.
        """
        return self._call("POST", "/v1/turns", json_body=request, wait=wait)

    def post_tool_results(
        self, turn_id: str, results: Sequence[Mapping[str, str]], *, wait: float | None = None
    ) -> dict[str, Any]:
        """``POST /v1/turns/{turn_id}/tool-results`` with ``[{"call_id", "output"}, …]``.

        Returns:
            A ``Turn`` when ``wait`` is given, else a ``TurnHandle``.

        Raises:
            GatewayError: E.g. 409 when the turn is not waiting for tool results.
            GatewayUnreachable: No answer.
        """
        body = {"tool_results": [dict(result) for result in results]}
        return self._call("POST", f"/v1/turns/{turn_id}/tool-results", json_body=body, wait=wait)

    def get_turn(self, turn_id: str, *, wait: float | None = None) -> dict[str, Any]:
        """``GET /v1/turns/{turn_id}``, long-polling up to ``wait`` seconds while queued or running."""
        return self._call("GET", f"/v1/turns/{turn_id}", wait=wait)

    def get_trace(self, turn_id: str) -> dict[str, Any]:
        """``GET /v1/turns/{turn_id}/trace``: ``{"turn_id", "steps": [...]}``."""
        return self._call("GET", f"/v1/turns/{turn_id}/trace")

    def get_session(self, session_id: str) -> dict[str, Any]:
        """``GET /v1/sessions/{session_id}``: mode, mode history and turns."""
        return self._call("GET", f"/v1/sessions/{session_id}")

    def create_batch(self, requests: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """``POST /v1/batches`` with ``{"requests": [TurnRequest, …]}``; returns the ``Batch``."""
        return self._call("POST", "/v1/batches", json_body={"requests": list(requests)})

    def upload_batch(self, path: Path, *, idempotency_key: str | None = None) -> dict[str, Any]:
        """``POST /v1/batches`` with the JSON Lines file ``path`` as the body, streamed from disk.

        Returns the ``Batch``.

        The upload's body deadline is the gateway's ``APTIX_HTTP_UPLOAD_TIMEOUT_SECONDS``; the answer may
        take a while for a large file (every line is checked, then recorded), so the read waits up to
        :data:`_UPLOAD_READ_TIMEOUT`.
        """
        params = {"idempotency_key": idempotency_key} if idempotency_key else {}
        timeout = httpx.Timeout(_UPLOAD_READ_TIMEOUT, connect=_CONNECT_TIMEOUT)
        with path.open("rb") as body:
            return self._call(
                "POST", "/v1/batches", content=_file_chunks(body), params=params, timeout=timeout,
                headers={"Content-Type": "application/jsonl"},
            )  # fmt: skip

    def cancel_batch(self, batch_id: str, *, running: str = "finish") -> dict[str, Any]:
        """``POST /v1/batches/{batch_id}/cancel``: queued turns cancelled; running ones ``finish`` or ``cancel``."""
        return self._call("POST", f"/v1/batches/{batch_id}/cancel", json_body={"running": running})

    def list_batches(self, *, limit: int = 20, after: str | None = None) -> dict[str, Any]:
        """``GET /v1/batches``: a page of the organisation's batches, newest first (``last_id``: the next cursor)."""
        params = {"limit": str(limit), **({"after": after} if after else {})}
        return self._call("GET", "/v1/batches", params=params)

    def get_batch(self, batch_id: str) -> dict[str, Any]:
        """``GET /v1/batches/{batch_id}``: the ``Batch`` with its counts by status."""
        return self._call("GET", f"/v1/batches/{batch_id}")

    def batch_results(self, batch_id: str) -> list[dict[str, Any]]:
        """``GET /v1/batches/{batch_id}/results``: one ``Turn`` per JSON line, in order.

        Raises:
            GatewayError: An error status, or a line that is not a JSON object.
            GatewayUnreachable: No answer.
        """
        response = self._send("GET", f"/v1/batches/{batch_id}/results", json_body=None, wait=None)
        turns: list[dict[str, Any]] = []
        for number, line in enumerate(response.text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                turn = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GatewayError(response.status_code, "bad_response", f"results line {number}: {exc}") from exc
            if not isinstance(turn, dict):
                raise GatewayError(response.status_code, "bad_response", f"results line {number} is not an object")
            turns.append(turn)
        return turns

    def stream_turn(self, request: Mapping[str, Any]) -> Iterator[ServerEvent]:
        """``POST /v1/turns?stream=true``: start a turn and yield its events as they happen.

        The stream ends after the turn's final event or its pause for client tools. A connection
        cut before that is resumed with ``GET /v1/turns/{id}/events`` and ``Last-Event-ID``: no event
        is lost or repeated.

        Raises:
            GatewayError: The gateway refused the request.
            GatewayUnreachable: No answer, or the stream could not be resumed.
        """
        return self._events("POST", "/v1/turns", json_body=dict(request), params={"stream": "true"})

    def turn_events(self, turn_id: str, *, after: str | None = None) -> Iterator[ServerEvent]:
        """``GET /v1/turns/{turn_id}/events``: the turn's events after ``after`` (all when None), then the
        new ones as they happen, until it ends or pauses for client tools; resumed as :meth:`stream_turn`."""
        return self._events("GET", f"/v1/turns/{turn_id}/events", turn_id=turn_id, after=after)

    def _events(
        self,
        method: str,
        path: str,
        *,
        json_body: object = None,
        params: Mapping[str, str] | None = None,
        turn_id: str | None = None,
        after: str | None = None,
    ) -> Iterator[ServerEvent]:
        timeout = httpx.Timeout(self._timeout, connect=_CONNECT_TIMEOUT, read=_STREAM_READ_TIMEOUT)
        retries = 0
        while True:
            headers = {"Last-Event-ID": after} if after else {}
            try:
                with self._http.stream(
                    method, path, json=json_body, params=params, headers=headers, timeout=timeout
                ) as response:
                    if not response.is_success:
                        response.read()
                        raise _gateway_error(response)
                    turn_id = turn_id or response.headers.get("aptix-turn-id")
                    for event in parse_events(response.iter_lines()):
                        after, retries = event.event_id or after, 0
                        yield event
                return  # the gateway ended the stream: the turn ended or paused
            except httpx.TransportError as exc:
                retries += 1
                if turn_id is None or retries > _STREAM_RETRIES:
                    raise GatewayUnreachable(self.base_url, str(exc) or type(exc).__name__) from exc
            time.sleep(min(0.25 * 2**retries, 5.0))
            method, path, json_body, params = "GET", f"/v1/turns/{turn_id}/events", None, None

    def _call(
        self,
        method: str,
        path: str,
        *,
        json_body: object = None,
        wait: float | None = None,
        params: Mapping[str, str] | None = None,
        content: Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> dict[str, Any]:
        response = self._send(
            method, path, json_body=json_body, wait=wait, params=params, content=content, headers=headers,
            timeout=timeout,
        )  # fmt: skip
        try:
            body = response.json()
        except ValueError as exc:
            raise GatewayError(response.status_code, "bad_response", "the response is not JSON") from exc
        if not isinstance(body, dict):
            raise GatewayError(response.status_code, "bad_response", "the response is not a JSON object")
        return body

    def _send(
        self,
        method: str,
        path: str,
        *,
        json_body: object,
        wait: float | None,
        params: Mapping[str, str] | None = None,
        content: Iterator[bytes] | None = None,
        headers: Mapping[str, str] | None = None,
        timeout: httpx.Timeout | None = None,
    ) -> httpx.Response:
        params = dict(params or {})
        timeout = timeout or httpx.Timeout(self._timeout, connect=_CONNECT_TIMEOUT)
        if wait and wait > 0:
            seconds = min(float(wait), MAX_WAIT_SECONDS)
            params["wait"] = f"{seconds:g}"
            timeout = httpx.Timeout(seconds + _READ_MARGIN, connect=_CONNECT_TIMEOUT)
        try:
            response = self._http.request(
                method, path, json=json_body, params=params, timeout=timeout, content=content, headers=headers
            )
        except httpx.TransportError as exc:
            raise GatewayUnreachable(self.base_url, str(exc) or type(exc).__name__) from exc
        if response.is_success:
            return response
        raise _gateway_error(response)


def _file_chunks(body: BinaryIO, size: int = 64 * 1024) -> Iterator[bytes]:
    """The file's bytes in chunks (an httpx body sent chunked, never read whole)."""
    while chunk := body.read(size):
        yield chunk


def _gateway_error(response: httpx.Response) -> GatewayError:
    """Decode ``{"error": {"code", "message", "details"}}``, tolerating other bodies (proxies, 404s)."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        return GatewayError(status, f"http_{status}", response.text.strip()[:200] or response.reason_phrase)
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict):
        return GatewayError(
            status,
            str(error.get("code") or f"http_{status}"),
            str(error.get("message") or response.reason_phrase),
            error.get("details"),
        )
    detail = body.get("detail") if isinstance(body, dict) else None
    return GatewayError(status, f"http_{status}", str(detail or response.reason_phrase))
