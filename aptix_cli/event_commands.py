"""The ``aptix`` commands that follow turns live: ``aptix watch TURN_ID`` and ``aptix turn --stream``.

Both read the gateway's turn events (``text/event-stream``) through
:meth:`aptix_cli.client.ApiClient.turn_events` / ``stream_turn``, which resume a cut stream with
``Last-Event-ID``. ``watch`` prints one line per event (``--json``: the event as a JSON object per
line); ``turn --stream`` prints the model's text as it arrives, then the usual summary of the turn.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from aptix_cli.command_support import out, runner

if TYPE_CHECKING:
    from aptix_cli.client import ApiClient
    from aptix_cli.sse import ServerEvent

__all__ = ["add_event_commands", "stream_turn"]

_DELTA = "output_text.delta"


def add_event_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``watch`` on ``aptix``'s subparsers (``common``: the connection flags)."""
    watch = commands.add_parser(
        "watch", parents=[common], help="follow a turn's events live, one line per event, until it ends or pauses"
    )
    watch.add_argument("turn_id", metavar="TURN_ID")
    watch.add_argument("--after", metavar="EVENT_ID", help="start after this event (default: from the first)")
    watch.add_argument("--json", action="store_true", help="print each event as a JSON object per line")
    watch.add_argument("--wide", action="store_true", help="do not cut lines to 120 characters")
    watch.set_defaults(run=runner(_watch))


def stream_turn(api: ApiClient, request: Mapping[str, Any], *, as_json: bool) -> dict[str, Any] | None:
    """Start a streamed turn, print its text as it arrives (unless ``as_json``), and return the turn as its
    last event shows it (None if the stream ended without one)."""
    streamed: list[str] = []
    turn = _last_turn(api.stream_turn(request), on_delta=None if as_json else streamed.append)
    if streamed:
        sys.stdout.write("\n")
        if turn is not None and turn.get("output_text") == "".join(streamed):
            turn = {**turn, "output_text": None}  # already printed: the summary does not repeat it
    return turn


def _watch(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.rendering import TRACE_WIDTH, event_line

    ended: str | None = None
    for event in api.turn_events(args.turn_id, after=args.after):
        if args.json:
            out(json.dumps({"id": event.event_id, "event": event.event, "data": event.data}, ensure_ascii=False))
        else:
            out(event_line(event.event_id, event.event, event.data, width=None if args.wide else TRACE_WIDTH))
        sys.stdout.flush()
        if event.event.startswith("turn."):
            ended = event.event
    return 1 if ended in ("turn.failed", "turn.cancelled") else 0


def _last_turn(events: Iterable[ServerEvent], *, on_delta: Callable[[str], None] | None) -> dict[str, Any] | None:
    turn: dict[str, Any] | None = None
    for event in events:
        if event.event == _DELTA and on_delta is not None and isinstance(event.data, Mapping):
            delta = str(event.data.get("delta", ""))
            on_delta(delta)
            sys.stdout.write(delta)
            sys.stdout.flush()
        elif event.event.startswith("turn.") and isinstance(event.data, dict):
            turn = event.data
    return turn
