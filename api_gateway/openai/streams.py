"""ResponseStreams: a response's OpenAI event stream served as Server-Sent Events, on any gateway process.

What a stream sends is :func:`api_gateway.openai.stream_events.stream_events` of the response as the
caller's ``load`` renders it from the database: never this process's memory, so the stream of
``POST /openai/v1/responses`` with ``stream: true`` and a ``GET .../responses/{id}?stream=true
&starting_after=N`` on another process send the same events with the same sequence numbers. The
opening events go out at once; the rest when the response is terminal, then the stream ends.

Waiting for that uses the turn's event log (``shared.state.keys.events_key``, a Redis Stream the
workers append to) only as a wake-up signal: ``XREAD BLOCK`` from the last entry seen, on an asyncio
Redis connection, with the keep-alive interval as the timeout. An entry that ends a round
(``shared.turn_events.ROUND_END_EVENTS``: the worker commits the turn before appending it) and
every timeout call ``load`` again; the model's text deltas, appended every few milliseconds, do not
(they would cost a database read each). While nothing is sent for the keep-alive interval, a
comment line goes out. A Redis that fails does not cut the stream: it then calls ``load`` every
``poll_seconds`` until the response is terminal; so does a database error in ``load`` (the stream
waits for the database as it waits for the model).

At most ``max_streams`` streams run at once in a process; one more is refused with ``Unavailable``
(503). A stream gives its place back however it ends. A client that goes away only ends its stream:
nothing here cancels a response.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import redis
import redis.asyncio as aioredis
from sqlalchemy.exc import SQLAlchemyError
from starlette.responses import StreamingResponse

from api_gateway.openai.stream_events import sse_frame, stream_events
from api_gateway.openai.view import TERMINAL_STATUSES
from api_gateway.services.errors import Unavailable
from api_gateway.sse import EventStreamResponse
from shared.state.keys import events_key
from shared.turn_events import ROUND_END_EVENTS

__all__ = ["KEEP_ALIVE", "Load", "ResponseStreams"]

logger = logging.getLogger(__name__)

KEEP_ALIVE = b": keep-alive\n\n"
"""The comment line an idle stream sends (SSE clients, the ``openai`` SDK among them, skip it)."""
_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
_BATCH = 200
"""Log entries read per ``XREAD`` (only their names matter)."""
_ROUND_ENDS = frozenset(ROUND_END_EVENTS.values())

Load = Callable[[], Awaitable[dict[str, Any]]]
"""Reads the response and renders it (``render_response``) as it stands now."""


class ResponseStreams:
    """The response streams of one gateway process: how many run, and each one's wait for its response."""

    def __init__(
        self, *, client: aioredis.Redis, max_streams: int, keepalive_seconds: float, poll_seconds: float = 1.0
    ) -> None:
        """Serve streams that wait on ``client``.

        Args:
            client: asyncio Redis on the state store's database, with a connection for each stream and a
                socket timeout above ``keepalive_seconds`` (the gateway's ``EventStreams`` client fits).
            max_streams: streams at once in this process (``APTIX_EVENTS_MAX_STREAMS``).
            keepalive_seconds: idle time after which a comment line goes out, and the longest wait between
                two reads of the response (``APTIX_EVENTS_KEEPALIVE_SECONDS``).
            poll_seconds: how often the response is read while Redis (or the database) fails.
        """
        self._client = client
        self._max_streams = max_streams
        self._keepalive = keepalive_seconds
        self._poll = poll_seconds
        self.open = 0
        """Streams running now."""

    async def serve(self, load: Load, *, turn_id: str, starting_after: int | None) -> StreamingResponse:
        """Take one of this process's stream places and answer with the response's events after ``starting_after``.

        ``load`` runs once before answering, so what it raises (no such response: ``NotFound``) is the
        answer instead of a stream. The events go out as they come to exist, and the stream ends after
        the terminal one; a ``starting_after`` past the last event that exists yet waits for later ones.

        Args:
            load: reads and renders the response; called again whenever it may have changed.
            turn_id: the turn whose round the response is (its event log wakes the stream up).
            starting_after: the ``sequence_number`` of the last event the client has; None for all. Not
                negative (the route refuses that).

        Returns:
            The ``text/event-stream`` response.

        Raises:
            Unavailable: this process already serves ``max_streams`` response streams.
        """
        if self.open >= self._max_streams:
            raise Unavailable(
                f"this gateway process already serves {self._max_streams} response streams (APTIX_EVENTS_MAX_STREAMS)"
            )
        self.open += 1
        try:
            waker = _Waker(self._client, events_key(turn_id), keepalive=self._keepalive, poll=self._poll)
            await waker.start()  # before the first read: an end appended after that read wakes the stream
            first = await load()
        except BaseException:
            self.open -= 1
            raise
        sent = -1 if starting_after is None else starting_after
        frames = self._frames(first, load, waker, turn_id=turn_id, sent=sent)
        return EventStreamResponse(frames, headers=_HEADERS, on_end=self._give_back)

    async def _frames(
        self, response: dict[str, Any], load: Load, waker: _Waker, *, turn_id: str, sent: int
    ) -> AsyncIterator[bytes]:
        written = loaded = time.monotonic()
        failing = False
        while True:
            fresh = [event for event in stream_events(response) if event["sequence_number"] > sent]
            if fresh:
                yield b"".join(sse_frame(event) for event in fresh)
                sent, written = fresh[-1]["sequence_number"], time.monotonic()
            if response.get("status") in TERMINAL_STATUSES:
                return
            while True:
                woken = failing or await waker.wait()
                if failing:
                    await asyncio.sleep(self._poll)
                now = time.monotonic()
                if now - written >= self._keepalive:
                    yield KEEP_ALIVE
                    written = now
                if woken or now - loaded >= self._keepalive:
                    break
            try:
                response, loaded, failing = await load(), time.monotonic(), False
            except SQLAlchemyError as exc:  # the stream waits for the database as it waits for the model
                if not failing:
                    logger.warning("response stream of turn %s: reading the response failed: %s", turn_id, exc)
                failing = True

    def _give_back(self) -> None:
        self.open -= 1


class _Waker:
    """Waits until a turn's log says its round may have ended, or the keep-alive interval passed."""

    def __init__(self, client: aioredis.Redis, key: str, *, keepalive: float, poll: float) -> None:
        self.key = key
        self._client: aioredis.Redis | None = client
        self._block_ms = max(1, int(keepalive * 1000))
        self._poll = poll
        self._last = "0-0"

    async def start(self) -> None:
        """Note the log's last entry: only later ones wake the stream."""
        if self._client is None:
            return
        try:
            entries: Any = await self._client.xrevrange(self.key, count=1)
        except redis.RedisError as exc:
            self._fall_back(exc)
            return
        if entries:
            self._last = _text(entries[0][0])

    async def wait(self) -> bool:
        """Wait for the next entries of the log, up to the keep-alive interval.

        Returns:
            Whether the response should be read again now: an entry that ends a round came, or Redis
            failed and the stream polls. False after entries of other kinds, and after a wait that timed out
            (the caller reads again once the keep-alive interval passed since its last read).
        """
        if self._client is None:
            await asyncio.sleep(self._poll)
            return True
        try:
            reply: Any = await self._client.xread({self.key: self._last}, count=_BATCH, block=self._block_ms)
        except redis.RedisError as exc:
            self._fall_back(exc)
            return True
        entries = list(reply[0][1]) if reply else []
        if entries:
            self._last = _text(entries[-1][0])
        names = {_text(value) for _, fields in entries for name, value in fields.items() if _text(name) == "event"}
        return not names.isdisjoint(_ROUND_ENDS)

    def _fall_back(self, exc: redis.RedisError) -> None:
        logger.warning("response stream on %s: Redis failed (%s: %s); polling the response from now on", self.key,
                       type(exc).__name__, exc)  # fmt: skip
        self._client = None


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
