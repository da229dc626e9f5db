"""ResponseStreams on a real Redis: opening events at once, the rest when the response ends, resuming, keep-alives.

The response is whatever ``load`` returns (the tests flip it); the turn's event log only wakes the stream.
Each stream is run as the ASGI server would run it, and its body read as it comes.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import pytest
import redis.asyncio as aioredis
from sqlalchemy.exc import OperationalError
from starlette.responses import StreamingResponse

from api_gateway.openai.stream_events import sse_frame, stream_events
from api_gateway.openai.streams import KEEP_ALIVE, ResponseStreams
from api_gateway.services.errors import NotFound, Unavailable
from shared.models.turn import TurnStatus
from shared.state.keys import events_key
from tests.responses_fixtures import validate_stream_bodies
from tests.support.responses_conformance import stream_events as parse_stream
from tests.support.responses_renderings import CALLS, TEXT, TURN, completed, rendered

pytestmark = pytest.mark.integration

FINAL = completed(TEXT, CALLS)
EVENTS = stream_events(FINAL)


class Response:
    """The response ``load`` renders: running until a test finishes it."""

    def __init__(self, now: dict[str, Any]) -> None:
        self.now = now
        self.loads = 0
        self.failures = 0

    async def load(self) -> dict[str, Any]:
        self.loads += 1
        if self.failures:
            self.failures -= 1
            raise OperationalError("SELECT responses", {}, ConnectionError("the database restarts"))
        return self.now


class Reader:
    """Runs a streamed response as an ASGI server would, and collects its body as it comes."""

    def __init__(self, response: StreamingResponse) -> None:
        self.body = b""
        self.start: MutableMapping[str, Any] = {}
        self.ended = asyncio.Event()
        self._gone = asyncio.Event()
        self._more = asyncio.Event()
        self.task = asyncio.create_task(response({"type": "http"}, self._receive, self._send))

    async def until(self, done: Callable[[bytes], bool], *, seconds: float = 5.0) -> bytes:
        """Wait until the body so far satisfies ``done``."""
        deadline = time.monotonic() + seconds
        while not done(self.body):
            assert not self.task.done(), f"the stream ended with {self.body!r}"
            self._more.clear()
            await asyncio.wait_for(self._more.wait(), timeout=max(0.01, deadline - time.monotonic()))
        return self.body

    async def finish(self, *, seconds: float = 5.0) -> bytes:
        """Wait for the stream to end by itself."""
        await asyncio.wait_for(self.task, timeout=seconds)
        return self.body

    async def disconnect(self) -> None:
        """The client goes away."""
        self._gone.set()
        await asyncio.wait_for(self.task, timeout=5)

    async def _receive(self) -> dict[str, Any]:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: MutableMapping[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.start = message
        else:
            self.body += message.get("body", b"")
        self._more.set()


def events_in(body: bytes) -> list[dict[str, Any]]:
    return [data for _, data in parse_stream(body)]


def count(n: int) -> Callable[[bytes], bool]:
    return lambda body: len(events_in(body)) >= n


def run(scenario: Callable[[aioredis.Redis], Awaitable[None]], url: str) -> None:
    async def main() -> None:
        client = aioredis.Redis.from_url(url, socket_timeout=30)
        try:
            await scenario(client)
        finally:
            await client.aclose()

    asyncio.run(main())


def test_serve_sends_the_opening_events_then_the_rest_once_the_round_end_is_appended(redis_db_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        streams = ResponseStreams(client=client, max_streams=4, keepalive_seconds=5)
        response = Response(rendered(TurnStatus.RUNNING))
        # Given: a stream of a running response
        reader = Reader(await streams.serve(response.load, turn_id=TURN, starting_after=None))
        opening = await reader.until(count(2))
        assert opening == b"".join(sse_frame(event) for event in EVENTS[:2])
        await asyncio.sleep(0.2)
        assert not reader.task.done() and reader.body == opening
        # When: the worker commits the round's end, then appends its event
        response.now = FINAL
        started = time.monotonic()
        await client.xadd(events_key(TURN), {"event": "turn.requires_client_tools", "data": "{}", "round": "0"})
        body = await reader.finish()
        # Then: the rest follows at once (well before the 5 s timeout) and the stream ends
        assert time.monotonic() - started < 2
        assert events_in(body) == EVENTS
        assert reader.start["status"] == 200
        headers = dict(reader.start["headers"])
        assert headers[b"content-type"] == b"text/event-stream; charset=utf-8"
        assert headers[b"cache-control"] == b"no-store"
        assert streams.open == 0
        validate_stream_bodies([body])

    run(scenario, redis_db_url)


def test_serve_resumes_after_starting_after_with_exactly_the_events_after_it(redis_db_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        streams = ResponseStreams(client=client, max_streams=4, keepalive_seconds=5)
        finished = Response(FINAL)
        for after in (None, 0, 1, 2, 7, len(EVENTS) - 2, len(EVENTS) - 1, len(EVENTS) + 3):
            reader = Reader(await streams.serve(finished.load, turn_id=TURN, starting_after=after))
            body = await reader.finish()
            assert events_in(body) == EVENTS[(-1 if after is None else after) + 1 :], after
        assert streams.open == 0

    run(scenario, redis_db_url)


def test_serve_past_the_last_event_so_far_waits_for_later_ones(redis_db_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        streams = ResponseStreams(client=client, max_streams=4, keepalive_seconds=5)
        response = Response(rendered(TurnStatus.QUEUED))
        reader = Reader(await streams.serve(response.load, turn_id=TURN, starting_after=5))
        await asyncio.sleep(0.3)
        assert reader.body == b"" and not reader.task.done()
        response.now = FINAL
        await client.xadd(events_key(TURN), {"event": "turn.requires_client_tools", "data": "{}", "round": "0"})
        assert events_in(await reader.finish()) == EVENTS[6:]

    run(scenario, redis_db_url)


def test_serve_sends_keep_alives_and_reads_again_while_the_response_runs(redis_db_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        streams = ResponseStreams(client=client, max_streams=4, keepalive_seconds=0.1)
        response = Response(rendered(TurnStatus.RUNNING))
        reader = Reader(await streams.serve(response.load, turn_id=f"turn_{uuid.uuid4().hex}", starting_after=1))
        body = await reader.until(lambda body: body.count(KEEP_ALIVE) >= 3)
        assert body == KEEP_ALIVE * body.count(KEEP_ALIVE)  # nothing but keep-alives after the opening events
        assert response.loads >= 3  # each timeout reads the response again: an end whose event was lost is seen
        # A response that ends with no event in the log ends the stream at the next timeout
        response.now = FINAL
        assert events_in(await reader.finish()) == EVENTS[2:]

    run(scenario, redis_db_url)


def test_serve_does_not_read_the_response_for_each_text_delta(redis_db_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        streams = ResponseStreams(client=client, max_streams=4, keepalive_seconds=5)
        turn_id = f"turn_{uuid.uuid4().hex}"
        response = Response(rendered(TurnStatus.RUNNING))
        reader = Reader(await streams.serve(response.load, turn_id=turn_id, starting_after=None))
        await reader.until(count(2))
        for n in range(50):
            await client.xadd(events_key(turn_id), {"event": "output_text.delta", "data": f'{{"delta": "{n}"}}'})
        await asyncio.sleep(0.3)
        assert response.loads == 1
        response.now = FINAL
        await client.xadd(events_key(turn_id), {"event": "turn.completed", "data": "{}"})
        assert events_in(await reader.finish()) == EVENTS
        assert response.loads == 2

    run(scenario, redis_db_url)


def test_serve_polls_the_response_when_redis_does_not_answer() -> None:
    async def scenario() -> None:
        dead = aioredis.Redis.from_url("redis://127.0.0.1:1/0", socket_connect_timeout=0.5)
        streams = ResponseStreams(client=dead, max_streams=4, keepalive_seconds=5, poll_seconds=0.05)
        response = Response(rendered(TurnStatus.RUNNING))
        reader = Reader(await streams.serve(response.load, turn_id=TURN, starting_after=None))
        await reader.until(count(2))
        response.now = FINAL
        assert events_in(await reader.finish()) == EVENTS
        await dead.aclose()

    asyncio.run(scenario())


def test_serve_waits_out_a_database_error_while_the_response_runs(redis_db_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        streams = ResponseStreams(client=client, max_streams=4, keepalive_seconds=0.1, poll_seconds=0.05)
        response = Response(rendered(TurnStatus.RUNNING))
        reader = Reader(await streams.serve(response.load, turn_id=f"turn_{uuid.uuid4().hex}", starting_after=None))
        await reader.until(count(2))
        response.failures = 3
        response.now = FINAL
        assert events_in(await reader.finish()) == EVENTS
        assert response.failures == 0

    run(scenario, redis_db_url)


def test_serve_refuses_a_stream_past_max_streams_and_gives_places_back_on_disconnect(redis_db_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        streams = ResponseStreams(client=client, max_streams=1, keepalive_seconds=5)
        running = Response(rendered(TurnStatus.RUNNING))
        reader = Reader(await streams.serve(running.load, turn_id=TURN, starting_after=None))
        await reader.until(count(2))
        with pytest.raises(Unavailable):
            await streams.serve(running.load, turn_id=TURN, starting_after=None)
        await reader.disconnect()
        assert streams.open == 0
        assert events_in(await Reader(await streams.serve(Response(FINAL).load, turn_id=TURN, starting_after=None))
                         .finish()) == EVENTS  # fmt: skip

    run(scenario, redis_db_url)


def test_serve_gives_the_place_back_when_load_raises(redis_db_url: str) -> None:
    async def scenario(client: aioredis.Redis) -> None:
        streams = ResponseStreams(client=client, max_streams=1, keepalive_seconds=5)

        async def missing() -> dict[str, Any]:
            raise NotFound("not_found", "no such response")

        with pytest.raises(NotFound):
            await streams.serve(missing, turn_id=TURN, starting_after=None)
        assert streams.open == 0

    run(scenario, redis_db_url)
