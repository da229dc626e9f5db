"""TextRelay: a streamed model call's text, appended to the turn's event log while the model writes it.

Each ``response.output_text.delta`` the client reads becomes an ``output_text.delta`` event with
data ``{"delta": "..."}``, so a client following the turn (``GET /v1/turns/{id}/events``) sees the
text as it is generated. At most one append goes out per ``APTIX_LLM_STREAM_FLUSH_MS``: a delta
arriving that long after the last append goes out at once (so the first one never waits), the deltas
arriving sooner are held and go out together with the next one that may go, or when their text part
ends (``response.output_text.done``), or when the call does; at 0 each delta is appended as it arrives.
An append costs the worker about 65 µs of CPU, relaying each delta about doubles the CPU of a
streamed call, and 20 ms batches cut the appends 3-4x at a model's usual pace
(``benchmarks/stream_relay.py``).

A call that fails after some of its text went out (an ``error`` or ``response.failed`` event, a cut
connection, a stalled stream) leaves that text in the log, and the call is retried or the turn fails.
So the relay then appends ``output_text.reset`` with data ``{"deltas": N}``: the last N
``output_text.delta`` events were the failed call's and are withdrawn. Nothing needs withdrawing
for an answer such as 429 or 500, which comes before any event. A client that
joins the deltas drops the last N it joined on a reset; then the deltas it keeps join to the text of
the calls that succeeded.

A worker that dies while it relays (SIGKILL, out of memory) withdraws nothing, and its step runs
again elsewhere, making the call again: so before a streaming turn's step runs again after such a lost
delivery, the driver calls :func:`withdraw_lost_text`, which appends one ``output_text.reset`` for the
deltas the lost runs left visible. The re-run's text then follows the reset, and the deltas still join
to the text of the calls that succeeded.

The log is not the record: when appending fails (Redis unreachable), the call goes on without
relaying, and once it has succeeded the relay withdraws what it appended and appends the call's
whole text again as one delta, if the log takes writes again by then.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import redis

from shared.turn_events import TurnEvent, TurnEventLog

__all__ = ["DELTA_EVENT", "RESET_EVENT", "TextRelay", "withdraw_lost_text"]

logger = logging.getLogger(__name__)

DELTA_EVENT = "output_text.delta"
"""A piece of the model's text; data ``{"delta": "..."}``."""
RESET_EVENT = "output_text.reset"
"""The last ``data.deltas`` text deltas were a failed model call's: drop them."""
_PAGE = 200
"""Events read per round trip when looking for a lost run's text."""


class TextRelay:
    """Relays one model call's text deltas to one turn's event log; call it with each delta."""

    def __init__(
        self,
        events: TurnEventLog,
        turn_id: str,
        *,
        flush_seconds: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Relay to ``events`` for ``turn_id``.

        Args:
            events: the turns' event logs.
            turn_id: the turn whose model call this is.
            flush_seconds: at most one append per this many seconds (the deltas arriving sooner
                are held and go out together); 0 appends each delta as it arrives.
            clock: a monotonic clock, in seconds.
        """
        self._events = events
        self._turn_id = turn_id
        self._flush_seconds = flush_seconds
        self._clock = clock
        self._held: list[str] = []
        self._last_append = float("-inf")
        self._text: list[str] = []
        self._broken = False
        self.appended = 0
        """How many ``output_text.delta`` events this call appended."""

    def __call__(self, delta: str) -> None:
        """Relay one text delta (the model call's text sink)."""
        self._text.append(delta)
        if self._broken:
            return
        self._held.append(delta)
        if self._clock() - self._last_append >= self._flush_seconds:
            self._flush()

    def flush(self) -> None:
        """Append the text held now (a text part ended)."""
        if not self._broken:
            self._flush()

    def finish(self) -> None:
        """The call succeeded: append the text still held (and, after a failed append, repair the log)."""
        self.flush()
        if self._broken and self._text:
            self._broken = False
            self._held = []
            try:
                self._withdraw()
                self._append("".join(self._text))
            except redis.RedisError as exc:
                logger.warning("turn %s: the event log still refuses the model's text (%s)", self._turn_id, exc)

    def withdraw(self) -> None:
        """The call failed: drop the text held, and withdraw the deltas appended (``output_text.reset``)."""
        self._held = []
        try:
            self._withdraw()
        except redis.RedisError as exc:
            logger.warning("turn %s: could not withdraw the failed call's text (%s)", self._turn_id, exc)

    def _flush(self) -> None:
        if not self._held:
            return
        text, self._held = "".join(self._held), []
        self._last_append = self._clock()
        try:
            self._append(text)
        except redis.RedisError as exc:
            logger.warning("turn %s: relaying the model's text stopped: %s", self._turn_id, exc)
            self._broken = True

    def _append(self, text: str) -> None:
        self._events.append(self._turn_id, DELTA_EVENT, {"delta": text})
        self.appended += 1

    def _withdraw(self) -> None:
        if self.appended:
            self._events.append(self._turn_id, RESET_EVENT, {"deltas": self.appended})
            self.appended = 0


def withdraw_lost_text(events: TurnEventLog, turn_id: str) -> int:
    """Withdraw the text deltas lost runs of the turn's current step left visible in its event log.

    Every text delta follows the turn's last saved event: a step's save appends its trace records
    after the text its model call relayed, so the text deltas (and resets) after the newest other
    event are those of the current step's runs that did not save, that is runs whose worker died.
    Those still visible (their resets applied) are withdrawn with one ``output_text.reset``.

    Reads the newest events of the log, a page of 200 per round trip, until one that is not text;
    appends at most one event.

    Args:
        events: the turns' event logs.
        turn_id: the turn whose step runs again after a lost delivery.

    Returns:
        How many deltas were withdrawn (0: nothing was appended, also when Redis did not answer: the
        log is not the record, and the step runs all the same).
    """
    try:
        return _withdraw_lost(events, turn_id)
    except redis.RedisError as exc:
        logger.warning("turn %s: could not withdraw the text of a lost run (%s)", turn_id, exc)
        return 0


def _withdraw_lost(events: TurnEventLog, turn_id: str) -> int:
    trailing: list[TurnEvent] = []
    before: str | None = None
    while True:
        page = events.latest(turn_id, before=before, count=_PAGE)
        text = _until_saved(page)
        trailing += text
        if len(text) < len(page) or len(page) < _PAGE:
            break
        before = page[-1].event_id
    visible = 0
    for event in reversed(trailing):  # oldest first
        if event.event == DELTA_EVENT:
            visible += 1
        else:
            visible = max(0, visible - int(event.data.get("deltas", 0)))
    if visible:
        events.append(turn_id, RESET_EVENT, {"deltas": visible})
        logger.info("turn %s: withdrew %d text delta(s) a lost run of its step relayed", turn_id, visible)
    return visible


def _until_saved(newest_first: list[TurnEvent]) -> list[TurnEvent]:
    """The text events (deltas, resets) at the head of ``newest_first``, up to the first other one."""
    found = []
    for event in newest_first:
        if event.event not in (DELTA_EVENT, RESET_EVENT):
            break
        found.append(event)
    return found
