"""h11's server side of a connection, refusing the request heads RFC 9112 lets a server refuse and h11 takes.

h11 bounds a request head only while it is incomplete (``max_incomplete_event_size``): a head that
arrives whole in one read may be any size (issue 29: 17 KiB, 64 KiB and 10,000 headers were served).
It ends lines at a bare LF as well as at CRLF, and it frames a request that carries both
``Transfer-Encoding: chunked`` and ``Content-Length`` by the former and keeps the connection, the shape
request smuggling through a proxy that reads the latter takes. :class:`StrictConnection` refuses all
three the way h11 refuses what it cannot parse: :meth:`~StrictConnection.next_event` raises
``h11.RemoteProtocolError`` (``error_status_hint`` 431 for a head too large, else 400) before the
request is handed on, and keeps it as :attr:`~StrictConnection.refusal` for whoever answers it (uvicorn
drops the exception; ``api_gateway.server`` answers with the error envelope and closes the connection).

To see a head's bytes, it keeps its own copy of what arrives while a head is awaited (at most the
limit plus one byte), and scans only the new bytes of each read for the head's end; once the end is
there, two counts and two searches of the head (in C, a few microseconds) decide. Bytes that arrive
during a request (its body, a pipelined request after it) are h11's alone; at the next cycle what h11
still holds is copied once (usually nothing).
"""

from __future__ import annotations

import re

import h11

__all__ = ["HeadTooLarge", "StrictConnection"]

_HEAD_END = re.compile(rb"\n\r?\n")
"""Where h11 ends a head: the first empty line, whether its lines end in CRLF or a bare LF."""
_CHUNKED = re.compile(rb"\r\ntransfer-encoding:", re.IGNORECASE)
_SIZED = re.compile(rb"\r\ncontent-length:", re.IGNORECASE)
_CONNECTION_CLOSE = b"connection: close\r\n\r\n"
"""The last header of an answer given while the request's body is still owed, and the empty line after it."""


class HeadTooLarge(h11.RemoteProtocolError):
    """A request line plus headers over the limit, however they arrived (h11's status hint: 431)."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the request line and headers exceed {limit} bytes", error_status_hint=431)


class StrictConnection(h11.Connection):
    """An ``h11.Connection`` (server role) that refuses heads over ``max_head_bytes``, bare LFs, and TE with CL."""

    def __init__(self, max_head_bytes: int) -> None:
        """Args:
        max_head_bytes: the largest request line plus headers (and the empty line that ends them).
        """
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.refusal: h11.RemoteProtocolError | None = None
        """The error :meth:`next_event` last raised (None until one is)."""
        self._head: bytearray | None = bytearray()
        # The bytes received since a head began to be awaited; None while a request is in progress.
        self._searched = 0
        # Where the search for the head's end resumes (a match may begin in the last two bytes searched).

    def receive_data(self, data: bytes) -> None:
        """h11's :meth:`~h11.Connection.receive_data`; while a head is awaited, a copy of ``data`` is kept too.

        Only up to one byte past the limit is kept: a head whose end is not within it is too large anyway.
        """
        head = self._head
        if head is not None and len(head) <= self.max_head_bytes:
            head += data[: self.max_head_bytes + 1 - len(head)]
        super().receive_data(data)

    def start_next_cycle(self) -> None:
        """h11's :meth:`~h11.Connection.start_next_cycle`: the next head begins with what h11 already holds."""
        super().start_next_cycle()
        self._head = bytearray(self.trailing_data[0][: self.max_head_bytes + 1])
        self._searched = 0

    def next_event(self) -> h11.Event | type[h11.NEED_DATA] | type[h11.PAUSED]:
        """h11's :meth:`~h11.Connection.next_event`, with the head checked before its request is returned.

        Raises:
            h11.RemoteProtocolError: what h11 raises, and: a head over ``max_head_bytes``
                (:class:`HeadTooLarge`, hint 431), a line of the head ending in a bare LF, a request with
                both ``Transfer-Encoding`` and ``Content-Length`` (hint 400). Also kept as :attr:`refusal`.
        """
        if self.refusal is not None:
            raise h11.RemoteProtocolError("nothing more is read from a connection whose request was refused")
        try:
            if self._head is not None:
                self._check_head(self._head)
            event = super().next_event()
            if type(event) is h11.Request:
                self._head = None
            return event
        except h11.RemoteProtocolError as exc:
            self.refusal = exc
            raise

    def send_with_data_passthrough(self, event: h11.Event) -> list[bytes] | None:
        """What :meth:`~h11.Connection.send` sends; an answer begun while body is still owed says ``Connection: close``.

        Such an answer is a refusal (a 401, a 413, a 429: the app answered without reading the body), and
        ``api_gateway.server`` drains the connection, half-closed, and then closes it. The header tells the
        client so, and a client that pools connections does not send its next request on this one. h11 is
        not told (a ``Connection: close`` it saw would make uvicorn close the connection at once, and the
        kernel reset it over the unread body): the header goes into the bytes of the head only.
        """
        data = super().send_with_data_passthrough(event)
        if (
            type(event) is h11.Response
            and self.their_state is h11.SEND_BODY
            and data
            and not any(name == b"connection" for name, _ in event.headers)
        ):
            data[-1] = bytes(data[-1][:-2]) + _CONNECTION_CLOSE
        return data

    def _check_head(self, head: bytearray) -> None:
        end = _HEAD_END.search(head, self._searched)
        if end is None:
            self._searched = max(0, len(head) - 2)
            if len(head) > self.max_head_bytes:
                raise HeadTooLarge(self.max_head_bytes)
            return
        size = end.end()
        if size > self.max_head_bytes:
            raise HeadTooLarge(self.max_head_bytes)
        if head.count(b"\n", 0, size) != head.count(b"\r\n", 0, size):
            raise h11.RemoteProtocolError(
                "a line of the request head ends in a bare LF; HTTP/1.1 lines end in CRLF (RFC 9112 §2.2)",
                error_status_hint=400,
            )
        # Every line ends in CRLF now, and a header name runs from a line's start to its colon (h11
        # refuses a space before the colon): two searches of the head find both headers, whatever their case.
        if _CHUNKED.search(head, 0, size) and _SIZED.search(head, 0, size):
            raise h11.RemoteProtocolError(
                "the request carries both Transfer-Encoding and Content-Length (RFC 9112 §6.1)", error_status_hint=400
            )
