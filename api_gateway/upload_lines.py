"""An upload's body written to its spool as it arrives, refused at the first line longer than a request may be.

A JSON Lines upload (``api_gateway.uploads``) may be far larger than memory should hold: the route
spools it (memory while small, then a temporary file) and reads it back line by line
(``api_gateway.services.batch_upload``). Each line is one request, so no line may be longer than
``APTIX_MAX_BODY_BYTES``, what one ``POST /v1/turns`` may carry: :func:`spool_lines` counts each
line's bytes as they arrive and refuses the upload (413 ``request_too_large``, naming the line) as
soon as one line has more, without reading the rest of the body. A line read back from the spool
is then never longer than that limit.
"""

from __future__ import annotations

from collections.abc import AsyncIterable
from typing import IO

from api_gateway.errors import ApiError

__all__ = ["LineMeter", "spool_lines"]


async def spool_lines(chunks: AsyncIterable[bytes], spool: IO[bytes], *, max_line_bytes: int) -> None:
    """Write the body's ``chunks`` to ``spool`` as they arrive, refusing a line over ``max_line_bytes``.

    Reads ``chunks`` (the request's body stream) up to the first line too long; writes ``spool``.

    Raises:
        ApiError: 413 ``request_too_large`` whose message starts ``line N:`` and whose detail's ``loc``
            is ``["line", N]`` (N counts from 1, blank lines included, as the upload's other refusals do).
    """
    meter = LineMeter(max_line_bytes)
    async for chunk in chunks:
        meter.feed(chunk)
        spool.write(chunk)


class LineMeter:
    """Follows a body's lines (ended by ``\\n``) across the chunks it arrives in, and refuses one too long.

    A line's length is its bytes, its ``\\n`` aside.
    """

    def __init__(self, max_bytes: int) -> None:
        """Start at line 1, empty, with lines of at most ``max_bytes`` bytes."""
        self.max_bytes = max_bytes
        self.number = 1
        """The line the next byte belongs to (1-based)."""
        self.length = 0
        """The bytes of line :attr:`number` seen so far."""

    def feed(self, chunk: bytes) -> None:
        """Count the next ``chunk`` of the body.

        Raises:
            ApiError: 413, a line has more than ``max_bytes`` bytes.
        """
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            self._grow(end - start)
            self.number, self.length, start = self.number + 1, 0, end + 1
            if len(chunk) <= self.max_bytes:
                # No line that begins and ends within this chunk can be too long: count the rest at once.
                last = chunk.rfind(b"\n")
                self.number += chunk.count(b"\n", start, last + 1)
                start = last + 1
                break
        self._grow(len(chunk) - start)

    def _grow(self, size: int) -> None:
        self.length += size
        if self.length > self.max_bytes:
            raise ApiError(
                413,
                "request_too_large",
                f"line {self.number}: longer than {self.max_bytes} bytes (APTIX_MAX_BODY_BYTES, what one "
                "POST /v1/turns may carry)",
                [{"loc": ["line", self.number], "msg": "line too long", "type": "too_long"}],
            )
