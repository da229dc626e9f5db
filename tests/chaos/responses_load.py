"""The load of the OpenAI face under a fault: background responses created with the official ``openai`` SDK,
some of whose event streams are read a few events at a time, dropped and resumed.

Each key becomes one ``POST /openai/v1/responses`` with ``background: true``, the input
:func:`tests.chaos.load.turn_input` (so the turn rows, the tool log and the model journal are read
as for any chaos turn) and an ``Idempotency-Key`` of its own, so the SDK's retries (on 5xx and
connection errors) cannot create a second response. Every HTTP answer the SDK gets, retries
included, is counted in the :class:`~tests.chaos.load.Ledger`.

A :class:`StreamReader` follows one response's stream the way a client on a flaky connection
would: ``client.responses.retrieve(id, stream=True)``, a few events, the connection dropped, then
``starting_after=<the last sequence number it has>`` again, until the terminal event. It then
checks what a response's stream promises (``docs/openai.md``, Streaming): the joined sequence
numbers are 0..n with no gap and no repeat, the last event is terminal, the events are those of a
full replay, they keep the stream protocol (``tests.support.responses_conformance``), and the text
deltas join to the final response's ``output_text``.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx2
import openai
from openai.types.responses import ResponseStreamEvent

from tests.chaos.load import Ledger, turn_input
from tests.chaos.system import API_KEY, MODEL
from tests.support.responses_conformance import stream_problems

__all__ = ["TERMINAL_EVENTS", "ResponseLoad", "StreamCheck", "StreamReader", "joined_stream_problems"]

logger = logging.getLogger(__name__)

TERMINAL_EVENTS = frozenset({"response.completed", "response.failed", "response.incomplete"})
_CLIENTS = 16
"""Threads creating responses at once."""
_MAX_RETRIES = 5
"""The SDK's retries of one request (its default is 2)."""
_TIMEOUT = httpx2.Timeout(60.0, connect=5.0)
"""Above the gateway's keep-alive interval (15 s), so an idle stream never times out."""
_EVENTS_PER_CONNECTION = (1, 3)
_PAUSE = (0.0, 1.5)
"""Seconds a reader waits before it resumes: its resumes fall between the kills, not only right after."""
_MAX_PROBLEMS = 3
"""Protocol problems reported per stream (the first ones; later ones tend to follow from them)."""
_MAX_CONNECTIONS = 200
"""A reader that opened this many connections without reaching the terminal event gives up."""


@dataclass(frozen=True, slots=True)
class StreamCheck:
    """What a reader found about one response's stream."""

    key: str
    response_id: str
    connections: int
    errors: int
    """Connections that ended in an error rather than being dropped by the reader (it resumed after them)."""
    events: int
    problems: tuple[str, ...]
    """Empty when the stream kept every promise."""

    def describe(self) -> str:
        """One line for the report: the key, the response, how it was read and what broke."""
        read = f"{self.events} events over {self.connections} connections"
        return f"{self.key} {self.response_id} ({read}): {'; '.join(self.problems) or 'ok'}"


class ResponseLoad:
    """Creates background responses through ``/openai/v1`` and follows some of their streams."""

    def __init__(self, gateway_url: str, *, ledger: Ledger, seed: str) -> None:
        self._ledger = ledger
        self._seed = seed
        self._client = openai.OpenAI(
            base_url=f"{gateway_url}/openai/v1",
            api_key=API_KEY,
            max_retries=_MAX_RETRIES,
            timeout=_TIMEOUT,
            http_client=openai.DefaultHttpxClient(transport=_AnswerLog(ledger)),
        )
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.readers: list[StreamReader] = []

    def create(self, keys: Sequence[str], *, spread: float, watched: Collection[str]) -> None:
        """Create one background response per key, evenly over ``spread`` seconds; follow the ``watched`` ones' streams.

        A key is accepted when the SDK's create returned (after its retries), rejected when it raised.
        """
        began = time.monotonic()

        def create_one(index: int) -> None:
            time.sleep(max(0.0, began + spread * index / max(len(keys), 1) - time.monotonic()))
            self._create(keys[index], watch=keys[index] in watched)

        with ThreadPoolExecutor(max_workers=_CLIENTS, thread_name_prefix="chaos-openai") as pool:
            for _ in pool.map(create_one, range(len(keys))):
                pass

    def check_streams(self, *, timeout: float) -> list[StreamCheck]:
        """Wait up to ``timeout`` seconds for every reader, stop those still waiting, and return their checks."""
        deadline = time.monotonic() + timeout
        for reader in self.readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        self._stop.set()
        for reader in self.readers:
            reader.abandon()
        return [reader.check() for reader in self.readers]

    def close(self) -> None:
        """Stop the readers and close the SDK's connections."""
        self._stop.set()
        for reader in self.readers:
            reader.abandon()
        self._client.close()

    def _create(self, key: str, *, watch: bool) -> None:
        try:
            response = self._client.responses.create(
                model=MODEL, input=turn_input(key), background=True, extra_headers={"Idempotency-Key": key}
            )
        except (openai.APIStatusError, openai.APIConnectionError) as exc:
            logger.warning("response %s was not created: %s", key, exc)
            self._ledger.decide([key], accepted=False)
            return
        self._ledger.decide([key], accepted=True)
        if watch:
            reader = StreamReader(self._client, key=key, response_id=response.id, stop=self._stop,
                                  rng=random.Random(f"{self._seed}-{key}"))  # fmt: skip
            with self._lock:
                self.readers.append(reader)


class StreamReader:
    """Reads one response's stream in pieces on a thread of its own, each piece on a new connection."""

    def __init__(
        self, client: openai.OpenAI, *, key: str, response_id: str, stop: threading.Event, rng: random.Random
    ) -> None:
        self.key = key
        self.response_id = response_id
        self.events: list[ResponseStreamEvent] = []
        self.connections = 0
        self.errors: list[str] = []
        """Connections that ended in an error instead of being dropped by the reader (it resumes after them)."""
        self._client = client
        self._stop = stop
        self._rng = rng
        self._open: openai.Stream[ResponseStreamEvent] | None = None
        self._after_end: list[str] = []
        self._thread = threading.Thread(target=self._run, name=f"chaos-stream-{key}", daemon=True)
        self._thread.start()

    def join(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the reader to finish."""
        self._thread.join(timeout)

    def abandon(self) -> None:
        """Close the connection the reader is waiting on, if any (it then stops: the stop event is set)."""
        stream = self._open
        if stream is not None and self._thread.is_alive():
            stream.close()
        self._thread.join(5.0)

    def check(self) -> StreamCheck:
        """Whether the joined stream kept every promise (called once the reader finished or was abandoned)."""
        events = [event.to_dict(mode="json") for event in list(self.events)]
        problems = joined_stream_problems(events)
        if self._thread.is_alive() and not any(problem.startswith("no terminal event") for problem in problems):
            problems.append("no terminal event: the reader was still reading when it was stopped")
        problems += self._after_end
        return StreamCheck(
            key=self.key,
            response_id=self.response_id,
            connections=self.connections,
            errors=len(self.errors),
            events=len(events),
            problems=tuple(problems),
        )

    def _run(self) -> None:
        for _ in range(_MAX_CONNECTIONS):
            if self._stop.is_set():
                return
            self._read_some(self._rng.randint(*_EVENTS_PER_CONNECTION))
            if self.events and self.events[-1].type in TERMINAL_EVENTS:
                try:
                    self._compare_with_the_final_response()
                except openai.APIError as exc:
                    self._after_end.append(f"the full replay or the response could not be read: {exc}")
                return
            time.sleep(self._rng.uniform(*_PAUSE))

    def _read_some(self, count: int) -> None:
        """Open the stream after the last event read, take up to ``count`` events (or to the end), drop it."""
        after = self.events[-1].sequence_number if self.events else openai.omit
        taken = 0
        try:
            with self._client.responses.retrieve(self.response_id, stream=True, starting_after=after) as stream:
                self._open = stream
                self.connections += 1
                for event in stream:
                    self.events.append(event)
                    taken += 1
                    if taken >= count or event.type in TERMINAL_EVENTS:
                        break
        except (openai.APIError, httpx2.HTTPError) as exc:
            if not self._stop.is_set():
                self.errors.append(f"{type(exc).__name__} after {taken} events")
                logger.warning("stream of %s: %s after %d events", self.response_id, type(exc).__name__, taken)
        finally:
            self._open = None

    def _compare_with_the_final_response(self) -> None:
        """The joined stream against a full replay and the retrieved response."""
        joined = [event.to_dict(mode="json") for event in self.events]
        with self._client.responses.retrieve(self.response_id, stream=True) as stream:
            replay = [event.to_dict(mode="json") for event in stream]
        if joined != replay:
            at = next((i for i, (a, b) in enumerate(zip(joined, replay, strict=False)) if a != b), None)
            where = f"event {at} ({joined[at]['type']})" if at is not None else f"its length ({len(replay)} events)"
            self._after_end.append(f"differs from a full replay at {where}")
        text = "".join(event.delta for event in self.events if event.type == "response.output_text.delta")
        final = self._client.responses.retrieve(self.response_id)
        if text != final.output_text:
            self._after_end.append(f"the deltas join to {text!r}, the response's output_text is {final.output_text!r}")


class _AnswerLog(httpx2.HTTPTransport):
    """The SDK's transport, noting every answer (a retried one included) and every connection error in the ledger."""

    def __init__(self, ledger: Ledger) -> None:
        super().__init__(limits=httpx2.Limits(max_connections=200, max_keepalive_connections=50))
        self._ledger = ledger

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        try:
            response = super().handle_request(request)
        except httpx2.TransportError:
            self._ledger.answer(None, [], final=False)
            raise
        self._ledger.answer(response.status_code, [], final=False, retry_after=response.headers.get("Retry-After"))
        return response


def joined_stream_problems(events: list[dict[str, Any]]) -> list[str]:
    """How the events a reader joined from its connections break a response stream's promises.

    Args:
        events: every event read, in order, as JSON (``to_dict(mode="json")`` of the SDK's events).

    Returns:
        A gap or a repeat in the sequence numbers (they must be exactly 0..n); no terminal event at the
        end; else the first protocol problems (``responses_conformance.stream_problems``: the SDK's
        types, deltas that do not join to their ``.done`` texts, output items that are not the terminal
        response's). [] for a whole stream.
    """
    problems = _sequence_problems(events)
    if not events or events[-1].get("type") not in TERMINAL_EVENTS:
        last = events[-1].get("type") if events else "nothing"
        problems.append(f"no terminal event (the last one read: {last})")
    elif not problems:  # a broken sequence breaks the protocol check at every later event: said once is enough
        problems += stream_problems(b"".join(_frame(event) for event in events))[:_MAX_PROBLEMS]
    return problems


def _sequence_problems(events: list[dict[str, Any]]) -> list[str]:
    """A gap or a repeat in the joined sequence numbers (they must be exactly 0..n)."""
    numbers = [event.get("sequence_number") for event in events]
    for index, number in enumerate(numbers):
        if number != index:
            kind = "repeated" if number in numbers[:index] else "gap"
            near = numbers[max(0, index - 2) : index + 3]
            return [f"sequence numbers not 0..n: {kind} at position {index} of {len(numbers)} (… {near} …)"]
    return []


def _frame(event: dict[str, Any]) -> bytes:
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()
