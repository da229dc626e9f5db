"""ResponsesClient: one POST to ``{base_url}/responses`` per call, over a shared urllib3 connection pool,
read whole (:meth:`ResponsesClient.create`) or as an event stream (:meth:`ResponsesClient.stream`).

Why urllib3 and not httpx (``benchmarks/llm_inflight.py``, FIELD-NOTES "I/O-bound work"): the
``llm`` queue runs ``-P gevent -c 2000``, so one process keeps ~2,000 calls in flight. httpx's pool
costs CPU in proportion to its open connections on every request (≈ 4 ms per call with 2,000, ≈ 1.6 ms
when sharded into clients of 50); urllib3's costs ≈ 0.3 ms per call at any pool size.
"""

from __future__ import annotations

import json
import logging
import os
import urllib.request
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import urllib3
from urllib3.exceptions import HTTPError as Urllib3Error

from shared.errors import LlmError
from workers.llm.parsing import parse_error, parse_response
from workers.llm.streaming import ResponseStream, TextSink
from workers.llm.types import LlmResponse

__all__ = ["DEFAULT_MAX_CONNECTIONS", "LOCAL_ONLY_ENV", "ResponsesClient"]

logger = logging.getLogger(__name__)

LOCAL_ONLY_ENV = "APTIX_LLM_LOCAL_ONLY"
"""When this environment variable is "1", the client refuses non-loopback hosts (set by tests)."""

DEFAULT_MAX_CONNECTIONS = 2000
"""The pool bound: the ``llm`` queue's default gevent concurrency (``aptix_cli.worker_group``).

Connections open lazily, so a threads worker of 8 still opens at most 8. A caller finding all of
them busy waits for one (up to ``timeout``) rather than opening an extra one.
"""

_LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
_READ_SIZE = 65536
"""At most this many bytes per read of a streamed body; a read returns what has arrived, never waits for more."""


class ResponsesClient:
    """A Responses API client, built once per worker process.

    It never retries: a retryable :class:`LlmError` goes back to the caller, which reschedules. It
    follows no redirects (a 3xx is an error answer) and, like curl, honours the ``HTTP(S)_PROXY``,
    ``ALL_PROXY`` and ``NO_PROXY`` environment variables. Certificates are checked against the
    system store (``SSL_CERT_FILE`` / ``SSL_CERT_DIR`` override it).
    """

    def __init__(
        self,
        *,
        base_url: str,
        api_key: str,
        timeout: float = 120.0,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        """Build the client and its connection pool (no connection opens until the first call).

        Args:
            base_url: the API root, e.g. ``https://api.openai.com/v1``.
            api_key: the bearer key; no ``Authorization`` header is sent when empty.
            timeout: seconds for each of connect, each socket read or write, and the wait for a
                free pooled connection.
            max_connections: the most connections open at once; give at least the worker's
                concurrency, or callers wait for a connection.

        Raises:
            ValueError: ``APTIX_LLM_LOCAL_ONLY=1`` and ``base_url`` is not a loopback host, or
                ``max_connections`` is below 1.
        """
        if os.environ.get(LOCAL_ONLY_ENV) == "1" and not _is_loopback(base_url):
            raise ValueError(
                f"{LOCAL_ONLY_ENV}=1 allows only 127.0.0.1, localhost or ::1; refusing LLM base_url {base_url!r}"
            )
        if max_connections < 1:
            raise ValueError(f"max_connections must be at least 1, got {max_connections}")
        self._url = base_url.rstrip("/") + "/responses"
        self._headers = {"Content-Type": "application/json", "Accept-Encoding": "gzip, deflate"}
        if api_key:
            self._headers["Authorization"] = f"Bearer {api_key}"
        self._secrets = (api_key,) if api_key else ()
        self._pool_timeout = timeout
        # block=True: a caller waits for a free connection instead of opening one more that the
        # pool would close again on return (block=False churns TCP and TLS handshakes under load).
        # retries=False: no retry, no redirect; urllib3 raises the first failure.
        pool_args: dict[str, Any] = {
            "num_pools": 4,
            "maxsize": max_connections,
            "block": True,
            "retries": False,
            "timeout": urllib3.Timeout(connect=timeout, read=timeout),
        }
        proxy = _proxy_for(self._url)
        self._http: urllib3.PoolManager = (
            urllib3.ProxyManager(proxy, **pool_args) if proxy else urllib3.PoolManager(**pool_args)
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
            ValueError: the request is not JSON-serialisable (e.g. holds NaN).
        """
        answer = self._post(request, preload=True)
        return self._parsed_json(answer.status, answer.data)

    def stream(
        self, request: dict[str, Any], on_text: TextSink, *, on_text_done: Callable[[], None] | None = None
    ) -> LlmResponse:
        """POST one request with ``"stream": true``, relay its text as it is generated, and parse the answer.

        The body is read as it arrives; ``on_text`` gets each ``response.output_text.delta``'s text
        before the next event is read. The result is built from the terminal ``response.completed``
        event by the same parser as :meth:`create` (:mod:`workers.llm.streaming`), so it is what the
        same call without streaming returns. A server that answers with JSON instead of an event
        stream is read as :meth:`create` reads it (and relays nothing).

        Args:
            request: the Responses API request body; it is sent with ``"stream": true`` added.
            on_text: called with each text delta. What it raises ends the call and propagates.
            on_text_done: called when a text part is complete (``response.output_text.done``).

        Returns:
            The parsed response.

        Raises:
            LlmError: as :meth:`create` (an error status is answered before any event, so nothing
                was relayed); and mid-stream: an ``error`` or ``response.failed`` event (retryable
                for ``server_error`` and ``rate_limit_exceeded``), ``response.incomplete``, a body
                that ends or breaks before its terminal event or a read timeout (``status_code`` 0,
                retryable).
            ValueError: the request is not JSON-serialisable.
        """
        answer = self._post({**request, "stream": True}, preload=False)
        finished = False
        try:
            reader = ResponseStream(on_text, on_text_done=on_text_done)
            try:
                if not answer.headers.get("content-type", "").startswith("text/event-stream"):
                    body = answer.data
                    finished = True
                    return self._parsed_json(answer.status, body)
                while not reader.finished and (chunk := answer.read1(_READ_SIZE)):
                    reader.feed(chunk)
            except Urllib3Error as exc:
                logger.warning("LLM stream from %s broke after %d event(s): %s", self._url, reader.events, _name(exc))
                raise LlmError(
                    f"LLM stream broke after {reader.events} event(s) ({_name(exc)})", status_code=0, retryable=True
                ) from exc
            result = reader.result()
            # The body ends right after the terminal event; reading its end lets the connection be reused.
            # A server that keeps the body open instead costs one read timeout here, and its connection.
            try:
                finished = not answer.read1(_READ_SIZE)
            except Urllib3Error:
                finished = False
            return result
        finally:
            if not finished:
                answer.close()  # a half-read body cannot be reused: drop the connection
            answer.release_conn()

    def _post(self, request: dict[str, Any], *, preload: bool) -> urllib3.BaseHTTPResponse:
        """Send the request; the answer when its status is 2xx (its body read when ``preload``).

        Raises:
            LlmError: a transport failure, or an answer whose status is not 2xx.
        """
        payload = json.dumps(request, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        try:
            answer = self._http.request(
                "POST",
                self._url,
                body=payload,
                headers=self._headers,
                redirect=False,
                retries=False,
                pool_timeout=self._pool_timeout,
                preload_content=preload,
            )
        except Urllib3Error as exc:
            logger.warning("LLM request to %s failed: %s", self._url, _name(exc))
            raise LlmError(
                f"LLM request failed before an answer ({_name(exc)})", status_code=0, retryable=True
            ) from exc
        if not 200 <= answer.status < 300:
            try:
                body = answer.data  # read now when not preloaded
            except Urllib3Error:
                body = b""
            finally:
                answer.release_conn()
            error = parse_error(answer.status, body, answer.headers, secrets=self._secrets)
            logger.warning("LLM answered %d (retryable=%s)", answer.status, error.retryable)
            raise error
        return answer

    def _parsed_json(self, status: int, data: bytes) -> LlmResponse:
        try:
            body = json.loads(data)
        except ValueError as exc:
            raise LlmError(f"LLM server answered {status} with a body that is not JSON", status_code=status) from exc
        return parse_response(body)

    def close(self) -> None:
        """Close the idle pooled connections; busy ones close when their call ends."""
        self._http.clear()


def _name(exc: Exception) -> str:
    return type(exc).__name__


def _is_loopback(base_url: str) -> bool:
    """Whether the URL's host is 127.0.0.1, localhost or ::1."""
    return (urlsplit(base_url).hostname or "").lower() in _LOCAL_HOSTS


def _proxy_for(url: str) -> str | None:
    """The proxy the environment names for ``url`` (``<scheme>_proxy``, then ``all_proxy``), unless
    ``no_proxy`` exempts its host."""
    proxies = urllib.request.getproxies()  # on Linux: the environment variables, any case
    parts = urlsplit(url)
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy or urllib.request.proxy_bypass(parts.netloc):
        return None
    return proxy
