"""The load of a chaos fault: turns submitted to the gateway, and waiting on the database for them.

Every turn calls the ``count_run`` server tool once and then answers, so it makes two model
calls; a client-tool turn (:func:`client_tool_turns`) instead calls ``client_echo``, a tool the
client declares, pauses until the harness posts its result, and then answers. The turn's key is in
its input; the report finds it again in the database row, the tool log and the model journal.
:class:`Ledger` keeps what the gateway answered (the only thing the report takes from the harness
side: which keys were accepted).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from collections import Counter
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import psycopg

from shared.models.turn import TurnStatus
from tests.chaos.system import API_KEY

__all__ = [
    "CLIENT_TOOL",
    "SETTLED_STATUSES",
    "Ledger",
    "client_tool_input",
    "client_tool_turns",
    "key_of",
    "post_turns",
    "status_counts",
    "submit_batches",
    "turn_input",
    "wait_fraction",
    "wait_settled",
]

logger = logging.getLogger(__name__)

SETTLED_STATUSES = TurnStatus.terminal() | {TurnStatus.REQUIRES_CLIENT_TOOLS}
"""Statuses a turn may end the wait in: terminal, or paused for client tools (which the chaos load
never posts, so such a turn stays put). Anything else (queued, running) is unfinished."""

_KEY = re.compile(r"\] chaos (\S+)\s*$")
_HEADERS = {"Authorization": f"Bearer {API_KEY}"}
CLIENT_TOOL = {
    "type": "function",
    "name": "client_echo",
    "description": "Run on the client: answers 'ran <key>'.",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
}
"""The tool a client-tool turn declares and calls; the harness answers each call with ``ran <key>``."""
_TERMINAL = {status.value for status in TurnStatus.terminal()}


def turn_input(key: str) -> str:
    """The input of turn ``key``: call ``count_run`` with the key, then answer."""
    return f"[[call:count_run {json.dumps({'key': key})}]] chaos {key}"


def client_tool_input(key: str) -> str:
    """The input of client-tool turn ``key``: call ``client_echo`` with the key, then answer."""
    return f"[[call:{CLIENT_TOOL['name']} {json.dumps({'key': key})}]] chaos {key}"


def key_of(text: str) -> str | None:
    """The turn key in an input made by :func:`turn_input` (None for any other text)."""
    match = _KEY.search(text)
    return match.group(1) if match else None


class Ledger:
    """What the gateway answered the harness: accepted and rejected keys, and every non-2xx answer."""

    def __init__(self) -> None:
        self.accepted: set[str] = set()
        self.rejected: set[str] = set()
        self.errors: Counter[str] = Counter()
        """Non-2xx answers by status ("500", "503", ...) and transport errors ("connection")."""
        self.unavailable_without_retry_after = 0
        """503 answers (among those whose headers were seen) without a ``Retry-After`` header."""
        self.slowest_answer_seconds = 0.0
        """The longest any timed request took to be answered (or to fail)."""
        self.slowest_error_seconds = 0.0
        """The longest a non-2xx answer (or a transport error) took, among those timed: a 503 must come at once."""
        self._answered = 0
        self._changed = threading.Condition()

    def answer(
        self,
        status: int | None,
        keys: Iterable[str],
        *,
        final: bool,
        retry_after: str | bool | None = True,
        seconds: float | None = None,
    ) -> None:
        """Record one answer (None: no HTTP answer); ``final`` answers accept (2xx) or reject the keys.

        ``retry_after``: the answer's ``Retry-After`` header (None: it had none; True: not looked at).
        ``seconds``: how long the request took (None: not timed).
        """
        with self._changed:
            if seconds is not None:
                self.slowest_answer_seconds = max(self.slowest_answer_seconds, seconds)
            if seconds is not None and (status is None or status >= 300):
                self.slowest_error_seconds = max(self.slowest_error_seconds, seconds)
            if status == 503 and retry_after is None:
                self.unavailable_without_retry_after += 1
            if status is not None:
                self._answered += 1
            if status is None or status >= 300:
                self.errors["connection" if status is None else str(status)] += 1
            if final:
                (self.accepted if status is not None and status < 300 else self.rejected).update(keys)
            self._changed.notify_all()

    def decide(self, keys: Iterable[str], *, accepted: bool) -> None:
        """Accept or reject ``keys`` whose HTTP answers were recorded already (with ``final=False``)."""
        with self._changed:
            (self.accepted if accepted else self.rejected).update(keys)
            self._changed.notify_all()

    def wait_answered(self, count: int, *, timeout: float) -> int:
        """Block until ``count`` HTTP answers arrived (or ``timeout``); returns how many did."""
        with self._changed:
            self._changed.wait_for(lambda: self._answered >= count, timeout=timeout)
            return self._answered


def submit_batches(gateway_url: str, keys: Sequence[str], *, ledger: Ledger, batches: int, spread: float = 0.0) -> None:
    """POST ``keys`` as ``batches`` batches, evenly over ``spread`` seconds (a batch is not retried)."""
    size = -(-len(keys) // max(batches, 1))
    chunks = [keys[start : start + size] for start in range(0, len(keys), size)]
    began = time.monotonic()
    with httpx.Client(base_url=gateway_url, headers=_HEADERS, timeout=120.0) as client:
        for index, chunk in enumerate(chunks):
            time.sleep(max(0.0, began + spread * index / max(len(chunks), 1) - time.monotonic()))
            body = {"requests": [{"input": turn_input(key)} for key in chunk]}
            try:
                status: int | None = client.post("/v1/batches", json=body).status_code
            except httpx.TransportError:
                status = None
            ledger.answer(status, chunk, final=True)
            logger.info("batch of %d turns: %s", len(chunk), status)


def post_turns(gateway_url: str, keys: Sequence[str], *, ledger: Ledger, clients: int, give_up: float) -> None:
    """POST each key as one turn with its own idempotency key from ``clients`` threads at once.

    Each client retries the same body on a transport error or a 5xx until it gets a 2xx (accepted),
    a 4xx (rejected) or ``give_up`` seconds pass (rejected).
    """
    deadline = time.monotonic() + give_up
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    with (
        httpx.Client(base_url=gateway_url, headers=_HEADERS, timeout=30.0, limits=limits) as client,
        ThreadPoolExecutor(max_workers=clients, thread_name_prefix="chaos-client") as pool,
    ):
        for _ in pool.map(lambda key: _post_until_answered(client, key, ledger, deadline), keys):
            pass


def client_tool_turns(
    gateway_url: str, keys: Sequence[str], *, ledger: Ledger, clients: int, spread: float, give_up: float
) -> None:
    """Run each key as a client-tool turn, evenly over ``spread`` seconds, from ``clients`` threads.

    A client POSTs the turn (its own idempotency key, retried as :func:`post_turns` does), long-polls
    it until it pauses for ``client_echo``, posts the result ``ran <key>`` (retried on transport
    errors and 5xx; a 409 is looked at again), and goes on until the turn ends or ``give_up`` seconds
    after its POST. A turn it gave up on stays as it was: the report counts it.
    """
    limits = httpx.Limits(max_connections=clients + 8, max_keepalive_connections=clients + 8)
    began = time.monotonic()

    def run_one(index: int) -> None:
        time.sleep(max(0.0, began + spread * index / max(len(keys), 1) - time.monotonic()))
        key = keys[index]
        deadline = time.monotonic() + give_up
        body = {"input": client_tool_input(key), "idempotency_key": key, "tools": [CLIENT_TOOL]}
        handle = _post_until_answered(client, key, ledger, deadline, body=body)
        if handle is not None:
            _answer_client_tools(client, key, str(handle["turn_id"]), deadline)

    with (
        httpx.Client(base_url=gateway_url, headers=_HEADERS, timeout=30.0, limits=limits) as client,
        ThreadPoolExecutor(max_workers=clients, thread_name_prefix="chaos-client-tool") as pool,
    ):
        for _ in pool.map(run_one, range(len(keys))):
            pass


def _answer_client_tools(client: httpx.Client, key: str, turn_id: str, deadline: float) -> None:
    """Answer turn ``turn_id``'s ``client_echo`` calls until it ends (or ``deadline``)."""
    while time.monotonic() < deadline:
        try:
            response = client.get(f"/v1/turns/{turn_id}", params={"wait": 20})
        except httpx.TransportError:
            time.sleep(0.5)
            continue
        if response.status_code != 200:
            time.sleep(0.5)
            continue
        turn = response.json()
        if turn["status"] in _TERMINAL:
            return
        if turn["status"] != TurnStatus.REQUIRES_CLIENT_TOOLS.value:
            continue
        results = [{"call_id": call["call_id"], "output": f"ran {key}"} for call in turn["pending_tool_calls"]]
        try:
            answer = client.post(f"/v1/turns/{turn_id}/tool-results", json={"tool_results": results})
        except httpx.TransportError:
            continue
        if answer.status_code >= 500:
            time.sleep(0.5)
    logger.warning("client-tool turn %s (%s) did not end before its client gave up", key, turn_id)


def status_counts(database_url: str) -> Counter[str] | None:
    """Turn rows by status; None when the database does not answer right now."""
    try:
        with psycopg.connect(database_url, connect_timeout=5) as conn:
            rows = conn.execute("SELECT status, count(*) FROM turns GROUP BY status").fetchall()
    except psycopg.OperationalError:
        return None
    return Counter({str(status): int(count) for status, count in rows})


def wait_fraction(database_url: str, total: int, fraction: float, *, timeout: float) -> float:
    """Wait until ``fraction`` of ``total`` turns are settled (or ``timeout``); returns the fraction reached."""
    deadline = time.monotonic() + timeout
    reached = 0.0
    while time.monotonic() < deadline:
        counts = status_counts(database_url)
        if counts is not None:
            reached = sum(counts[status] for status in SETTLED_STATUSES) / max(total, 1)
            if reached >= fraction:
                break
        time.sleep(0.25)
    return reached


def wait_settled(database_url: str, *, deadline: float) -> bool:
    """Poll every second until no turn row is unfinished, or the monotonic ``deadline``; True if settled."""
    while True:
        counts = status_counts(database_url)
        if counts is not None and all(status in SETTLED_STATUSES for status in +counts):
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(1.0)


def _post_until_answered(
    client: httpx.Client, key: str, ledger: Ledger, deadline: float, *, body: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """POST turn ``key`` (``body``, else the server-tool turn) until it is answered; its 2xx JSON, else None."""
    body = body or {"input": turn_input(key), "idempotency_key": key}
    delay = 0.1
    while True:
        sent = time.monotonic()
        try:
            response: httpx.Response | None = client.post("/v1/turns", json=body)
        except httpx.TransportError:
            response = None
        status = None if response is None else response.status_code
        final = (status is not None and status < 500) or time.monotonic() >= deadline
        retry_after = None if response is None else response.headers.get("Retry-After")
        ledger.answer(status, [key], final=final, retry_after=retry_after, seconds=time.monotonic() - sent)
        if final:
            return response.json() if response is not None and status is not None and status < 300 else None
        time.sleep(delay)
        delay = min(delay * 2, 1.0)
