"""api_gateway.upload_lines: an upload's lines counted across its chunks, the first one too long refused."""

from __future__ import annotations

import asyncio
import io
import random
from collections.abc import AsyncIterator

import pytest

from api_gateway.errors import ApiError
from api_gateway.upload_lines import LineMeter, spool_lines


def _first_too_long(body: bytes, max_bytes: int) -> int | None:
    """The 1-based number of the first line of ``body`` longer than ``max_bytes``, by splitting it whole."""
    for number, line in enumerate(body.split(b"\n"), start=1):
        if len(line) > max_bytes:
            return number
    return None


def _feed(body: bytes, cuts: list[int], max_bytes: int) -> int | None:
    meter = LineMeter(max_bytes)
    try:
        for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True):
            meter.feed(body[start:end])
    except ApiError as refused:
        assert refused.status_code == 413 and refused.code == "request_too_large"
        number: int = refused.details[0]["loc"][1]
        assert refused.details[0]["loc"] == ["line", number]
        assert refused.message.startswith(f"line {number}: ") and "APTIX_MAX_BODY_BYTES" in refused.message
        return number
    return None


def test_a_line_is_refused_wherever_the_chunks_cut_the_body() -> None:
    # Given bodies of short, long and blank lines, cut into chunks smaller and larger than a line may be
    chooser = random.Random(29)
    for _ in range(3000):
        max_bytes = chooser.randint(1, 12)
        lines = [b"x" * chooser.choice([0, 0, 1, 3, max_bytes, max_bytes + 1, 2 * max_bytes]) for _ in range(6)]
        body = b"\n".join(lines) + chooser.choice([b"", b"\n"])
        cuts = sorted(chooser.sample(range(1, len(body)), k=min(len(body) - 1, chooser.randint(0, 5)))) if body else []
        # When each is counted chunk by chunk, then the refused line is the one a whole split finds
        assert _feed(body, cuts, max_bytes) == _first_too_long(body, max_bytes), (body, cuts, max_bytes)


def test_a_line_of_exactly_the_limit_passes_and_one_byte_more_is_refused_with_its_number() -> None:
    assert _feed(b"ab\n\n" + b"c" * 10 + b"\n", [], 10) is None
    assert _feed(b"ab\n\n" + b"c" * 11 + b"\n", [5], 10) == 3


def test_spooling_stops_reading_at_the_line_too_long() -> None:
    # Given a body whose second line is too long, and more chunks after it
    read: list[bytes] = []

    async def chunks() -> AsyncIterator[bytes]:
        for chunk in (b'{"input": "a"}\n', b"y" * 40, b"y" * 40, b"\n", b'{"input": "b"}\n'):
            read.append(chunk)
            yield chunk

    spool = io.BytesIO()
    # When it is spooled with lines of at most 64 bytes
    with pytest.raises(ApiError) as refused:
        asyncio.run(spool_lines(chunks(), spool, max_line_bytes=64))
    # Then the second line is refused as soon as it passed the limit: nothing after it was read
    assert refused.value.details == [{"loc": ["line", 2], "msg": "line too long", "type": "too_long"}]
    assert len(read) == 3
    # And a body within the limit is spooled whole
    spool = io.BytesIO()
    asyncio.run(spool_lines(_aiter([b'{"input": "a"}\n{"in', b'put": "b"}\n']), spool, max_line_bytes=64))
    assert spool.getvalue() == b'{"input": "a"}\n{"input": "b"}\n'


async def _aiter(chunks: list[bytes]) -> AsyncIterator[bytes]:
    for chunk in chunks:
        yield chunk
