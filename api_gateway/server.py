"""The gateway's HTTP server: uvicorn, plus the read deadlines and connection caps it lacks.

uvicorn closes a kept-alive connection left idle (``timeout_keep_alive``), but nothing bounds how
long a client may take to *send* a request: a connection that opens and says nothing, sends half a
request line, or declares a body that never comes is held until the client leaves (issue 11: 500
half-sent requests held for minutes). A process that holds connections for whoever opens them
runs out of file descriptors, and then serves nobody.

:func:`serve` runs uvicorn's h11 protocol with these guards (:class:`ConnectionLimits`):

- a header deadline: a new connection must deliver a request's line and headers within
  ``APTIX_HTTP_HEADER_TIMEOUT_SECONDS``; on a kept-alive connection the clock starts at the next
  request's first byte (until then uvicorn's keep-alive timeout applies);
- a body deadline: a request's body must have arrived in full ``APTIX_HTTP_BODY_TIMEOUT_SECONDS``
  after its headers, however it trickles in. A JSON Lines upload to ``POST /v1/batches`` whose key
  the app has checked gets ``APTIX_HTTP_UPLOAD_TIMEOUT_SECONDS`` instead (when longer): the app
  marks the request (``api_gateway.uploads.grant_upload_time``, from ``api_gateway.deps``) and the
  server, when the body deadline passes, reads the mark and extends the deadline to the upload's.
  Reading the mark only then costs nothing per request, and an upload never gets the long deadline
  before its key is known (issue 29: an unauthenticated upload held its connection for 600 s);
- a request answered before its body arrived in full (a 401 before the body is read, a 413 on the
  declared length) keeps no connection: once the answer is sent the server half-closes the
  connection, discards what the client still sends for at most :data:`LINGER_SECONDS` (so that the
  client can read the answer before the connection is reset), and closes it;
- request heads as RFC 9112 has them (``api_gateway.strict_h11``): at most :data:`MAX_HEAD_BYTES` of
  request line and headers however they arrive (more: ``431 request_header_fields_too_large``),
  lines ending in CRLF, never both ``Transfer-Encoding`` and ``Content-Length``; a head that breaks
  these, or that h11 cannot parse, is answered ``400 bad_request`` with the error envelope (uvicorn's
  own answer is plain text) and the connection is closed;
- caps on the connections held at once, per client address (``APTIX_HTTP_MAX_CONNECTIONS_PER_CLIENT``)
  and in all (``APTIX_HTTP_MAX_CONNECTIONS``): a connection beyond either is answered
  ``503 unavailable`` (with ``Retry-After``) and closed as soon as it is accepted, before it costs
  anything more. uvicorn's own ``limit_concurrency`` is not used: it accepts and keeps such
  connections and answers their requests with a plain-text 503.

A missed deadline is answered ``408 request_timeout`` when the client had begun a request and no
answer had begun, and the connection is closed; a connection that never sent a byte is closed
without a word. h11 is the protocol the runtime image installs (httptools is only in the test
extras), so pinning it keeps the tested server the deployed one.
"""

from __future__ import annotations

import asyncio
import http
import logging
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import h11
import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from api_gateway.errors import error_response
from api_gateway.security_headers import SECURITY_HEADERS
from api_gateway.strict_h11 import HeadTooLarge, StrictConnection
from api_gateway.uploads import upload_time_granted
from shared.settings import Settings

__all__ = [
    "BACKLOG", "DRAIN_SECONDS", "LINGER_SECONDS", "MAX_HEAD_BYTES", "ConnectionLimits", "GuardedH11Protocol", "serve",
    "server_config",
]  # fmt: skip

logger = logging.getLogger(__name__)

BACKLOG = 2048
"""Connections the kernel queues before the gateway accepts them (capped by ``net.core.somaxconn``)."""
MAX_HEAD_BYTES = 16 * 1024
"""Largest request line plus headers (with the empty line that ends them); a longer one is answered 431."""
LINGER_SECONDS = 2.0
"""How long a connection answered before its request's body arrived is drained, half-closed, before it is closed."""
DRAIN_SECONDS = 65
"""How long a stopping gateway lets requests in progress finish before it cuts them."""


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """The deadlines and caps one gateway server enforces."""

    header_timeout: float
    """Seconds a client has to send a request's line and headers."""
    body_timeout: float
    """Seconds a request's body has to arrive in full after its headers."""
    upload_timeout: float
    """The same for a JSON Lines upload whose key the app checked, when longer (``api_gateway.uploads``)."""
    max_connections: int
    """Connections held at once in all."""
    max_per_client: int
    """Connections one client address may hold at once; 0 means no cap."""

    @classmethod
    def from_settings(cls, settings: Settings) -> ConnectionLimits:
        """The limits ``settings`` configure (``APTIX_HTTP_*``)."""
        return cls(
            header_timeout=settings.http_header_timeout_seconds,
            body_timeout=settings.http_body_timeout_seconds,
            upload_timeout=settings.http_upload_timeout_seconds,
            max_connections=settings.http_max_connections,
            max_per_client=settings.http_max_connections_per_client,
        )


def server_config(app: ASGIApp, settings: Settings, *, host: str, port: int) -> uvicorn.Config:
    """The uvicorn configuration of the gateway: guarded h11 protocol, keep-alive, backlog, head size.

    Args:
        app: the gateway app (``create_app``).
        settings: supply the limits (``APTIX_HTTP_*``).
        host: the address to listen on.
        port: the port to listen on.

    Returns:
        A configuration for ``uvicorn.Server``.
    """
    return uvicorn.Config(
        app,
        host=host,
        port=port,
        http=_guarded_protocol(ConnectionLimits.from_settings(settings)),
        timeout_keep_alive=settings.http_keepalive_seconds,
        backlog=BACKLOG,
        h11_max_incomplete_event_size=MAX_HEAD_BYTES,
        # The gateway has no WebSocket route, and a connection handed to a WebSocket protocol would
        # leave these guards (and the runtime image installs no WebSocket library anyway).
        ws="none",
        # On SIGTERM, requests in progress may finish for this long (a long-poll takes at most 60 s);
        # then what still runs (event streams, which last as long as their turns) is cut, and their
        # clients resume on another replica with Last-Event-ID. Inside the Deployment's 75 s grace.
        timeout_graceful_shutdown=DRAIN_SECONDS,
        log_level="warning",
        # Our logging, not uvicorn's (log_config=None): its lines in our format; our access line
        # (api_gateway.access_log), not its.
        access_log=False,
        log_config=None,
    )


def serve(app: ASGIApp, settings: Settings, *, host: str, port: int) -> None:
    """Run the gateway's HTTP server until it is told to stop (SIGINT, SIGTERM).

    Args:
        app: the gateway app (``create_app``).
        settings: supply the limits (``APTIX_HTTP_*``).
        host: the address to listen on.
        port: the port to listen on.
    """
    uvicorn.Server(server_config(app, settings, host=host, port=port)).run()


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on whatever the client owes, connection caps, strict heads.

    A subclass bound to one server's :class:`_Guard` comes from :func:`_guarded_protocol`.
    """

    guard: ClassVar[_Guard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.conn: StrictConnection = StrictConnection(self.config.h11_max_incomplete_event_size or MAX_HEAD_BYTES)
        self._peer: str | None = None
        self._awaiting: _Awaiting = "nothing"
        self._deadline: asyncio.TimerHandle | None = None
        self._since = 0.0
        self._served = False
        self._lingering = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]  # as uvicorn's
        super().connection_made(transport)
        peer = self.client[0] if self.client else None
        refusal = self.guard.accept(peer, open_connections=len(self.connections))
        if refusal is not None:
            transport.write(refusal)
            transport.close()
            return
        self._peer = peer
        self._follow()

    def connection_lost(self, exc: Exception | None) -> None:
        self._expect("nothing")
        if self._peer is not None:
            self.guard.release(self._peer)
            self._peer = None
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # the rest of a body whose request was answered: dropped unparsed
        super().data_received(data)
        self._follow()

    def on_response_complete(self) -> None:
        self._served = True
        super().on_response_complete()
        if self.conn.their_state is h11.SEND_BODY and not self.transport.is_closing():
            self._linger()
        self._follow()

    def send_400_response(self, msg: str) -> None:
        # uvicorn calls this when h11 (or StrictConnection) refuses what the client sent, and answers in
        # plain text; the error envelope instead, with h11's status hint (431 for a head too large).
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete:
            # The body of a request in progress broke off: the app reads a disconnect, its answer is dropped.
            cycle.disconnected = True
            cycle.message_event.set()
            if cycle.response_started:
                self.transport.close()
                return
        self.transport.write(self.guard.refusal_response(self.conn.refusal))
        self.transport.close()

    def _linger(self) -> None:
        # The answer is out and the client still owes body: nothing more of it is read into h11, the
        # connection is half-closed (the client reads the answer, then the end), and what arrives is
        # dropped until the client closes its side or LINGER_SECONDS pass. Closing at once would make
        # the kernel reset the connection over the unread bytes, and the reset can destroy the answer.
        self._unset_keepalive_if_required()
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self._lingering = True
        self.transport.write_eof()
        self.flow.resume_reading()

    def _follow(self) -> None:
        # What the client owes now: a request's head (a new connection, or the first bytes of the
        # next request on a kept-alive one), the rest of a body, or nothing (the app is answering,
        # or the connection idles under uvicorn's keep-alive timeout). A lingering connection owes
        # nothing more but has LINGER_SECONDS to go.
        owes = self.conn.their_state
        if self.transport.is_closing():
            self._expect("nothing")
        elif self._lingering:
            self._expect("linger")
        elif owes is h11.SEND_BODY:
            self._expect("body")
        elif owes is h11.IDLE and (not self._served or self.conn.trailing_data[0]):
            self._expect("headers")
        else:
            self._expect("nothing")

    def _expect(self, awaiting: _Awaiting) -> None:
        # The clock starts when the client starts owing something; more bytes do not reset it.
        if awaiting == self._awaiting:
            return
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._awaiting = awaiting
        if awaiting != "nothing":
            self._since = self.loop.time()
            self._deadline = self.loop.call_later(self._seconds(awaiting), self._on_deadline)

    def _seconds(self, awaiting: _Awaiting) -> float:
        limits = self.guard.limits
        if awaiting == "headers":
            return limits.header_timeout
        if awaiting == "linger":
            return LINGER_SECONDS
        return limits.body_timeout

    def _upload(self) -> bool:
        # Whether the body owed is an upload whose key the app checked (api_gateway.uploads).
        cycle = self.cycle
        return cycle is not None and upload_time_granted(cycle.scope)

    def _on_deadline(self) -> None:
        self._deadline = None
        awaiting = self._awaiting
        upload = awaiting == "body" and self._upload()
        if upload:
            rest = self._since + self.guard.limits.upload_timeout - self.loop.time()
            if rest > 0:
                self._deadline = self.loop.call_later(rest, self._on_deadline)
                return
        self._awaiting = "nothing"
        if self.transport.is_closing():
            return
        if awaiting == "linger":
            self.transport.close()
            return
        cycle = self.cycle if awaiting == "body" else None
        begun = cycle is not None or bool(self.conn.trailing_data[0])
        if begun and not (cycle is not None and cycle.response_started):
            if cycle is not None:
                # The app may still wait on the body: it now reads a disconnect and its answer is dropped.
                cycle.disconnected = True
                cycle.message_event.set()
            late: Literal["headers", "body", "upload"] = (
                "upload" if upload else "headers" if awaiting == "headers" else "body"
            )
            self.transport.write(self.guard.timeout_response(late))
        logger.debug("closed a connection from %s: its request %s did not arrive in time", self._peer, awaiting)
        self.transport.close()


_Awaiting = Literal["nothing", "headers", "body", "linger"]
"""What a connection's client owes the server next (``linger``: nothing, but its connection is drained)."""


class _Guard:
    """The limits of one server, the connections it holds per client address, and its canned answers."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self._per_peer: dict[str, int] = {}
        self._capped: set[str] = set()
        self._full = False
        self._answers = {
            "client": _raw_response(
                503,
                "unavailable",
                f"this address already holds {limits.max_per_client} connections to the gateway "
                "(APTIX_HTTP_MAX_CONNECTIONS_PER_CLIENT); reuse or close them",
            ),
            "all": _raw_response(
                503,
                "unavailable",
                f"the gateway holds {limits.max_connections} connections already "
                "(APTIX_HTTP_MAX_CONNECTIONS); retry shortly",
            ),
            "headers": _raw_response(
                408,
                "request_timeout",
                f"the request line and headers did not arrive within {limits.header_timeout:g}s "
                "(APTIX_HTTP_HEADER_TIMEOUT_SECONDS)",
            ),
            "body": _raw_response(
                408,
                "request_timeout",
                f"the request body did not arrive within {limits.body_timeout:g}s of its headers "
                "(APTIX_HTTP_BODY_TIMEOUT_SECONDS)",
            ),
            "upload": _raw_response(
                408,
                "request_timeout",
                f"the upload did not arrive within {max(limits.upload_timeout, limits.body_timeout):g}s of its "
                "headers (APTIX_HTTP_UPLOAD_TIMEOUT_SECONDS)",
            ),
            "head_too_large": _raw_response(
                431,
                "request_header_fields_too_large",
                f"the request line and headers exceed {MAX_HEAD_BYTES} bytes",
            ),
        }

    def accept(self, peer: str | None, *, open_connections: int) -> bytes | None:
        """Count a new connection from ``peer``; the answer that refuses it when a cap is reached.

        Args:
            peer: the client address (None for a Unix socket: not capped per client).
            open_connections: the connections the server holds, this one included.
        """
        if open_connections > self.limits.max_connections:
            if not self._full:
                logger.warning("refusing connections: %d held (APTIX_HTTP_MAX_CONNECTIONS)", open_connections - 1)
            self._full = True
            return self._answers["all"]
        self._full = False
        if peer is None or not self.limits.max_per_client:
            return None
        held = self._per_peer.get(peer, 0)
        if held >= self.limits.max_per_client:
            if peer not in self._capped:
                self._capped.add(peer)
                logger.warning(
                    "refusing connections from %s: it holds %d (APTIX_HTTP_MAX_CONNECTIONS_PER_CLIENT)", peer, held
                )
            return self._answers["client"]
        self._per_peer[peer] = held + 1
        return None

    def release(self, peer: str) -> None:
        """Forget one closed connection from ``peer`` (accepted by :meth:`accept`)."""
        held = self._per_peer.pop(peer, 1) - 1
        if held > 0:
            self._per_peer[peer] = held
        self._capped.discard(peer)

    def timeout_response(self, awaiting: Literal["headers", "body", "upload"]) -> bytes:
        """The 408 for a request whose ``awaiting`` part (or upload body) did not arrive in time."""
        return self._answers[awaiting]

    def refusal_response(self, refusal: h11.RemoteProtocolError | None) -> bytes:
        """The answer to a request h11 or ``StrictConnection`` refused (``refusal``, None if unknown).

        A head too large (:class:`HeadTooLarge`) is ``431 request_header_fields_too_large``; anything
        else ``400 bad_request``, its message saying what was wrong (h11's words, cut to 200 characters).
        """
        if isinstance(refusal, HeadTooLarge):
            return self._answers["head_too_large"]
        reason = str(refusal)[:200] if refusal is not None else "unreadable"
        return _raw_response(400, "bad_request", f"the request is not valid HTTP/1.1: {reason}")


def _guarded_protocol(limits: ConnectionLimits) -> type[GuardedH11Protocol]:
    # One class per server: uvicorn builds each connection's protocol from the class alone.
    class _ServerProtocol(GuardedH11Protocol):
        guard = _Guard(limits)

    return _ServerProtocol


def _raw_response(status: int, code: str, message: str) -> bytes:
    # Written straight to the socket (no request cycle exists yet, or it is abandoned), so it takes
    # the error body from errors.py and the protective headers by hand, and always closes.
    response = error_response(status, code, message)
    headers = [
        *response.raw_headers,
        *SECURITY_HEADERS,
        (b"cache-control", b"no-store"),
        (b"connection", b"close"),
    ]
    head = f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n".encode()
    return head + b"".join(name + b": " + value + b"\r\n" for name, value in headers) + b"\r\n" + response.body
