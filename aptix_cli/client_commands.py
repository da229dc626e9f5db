"""The ``aptix`` client commands: turns, tool results, traces and sessions over HTTP (batches:
:mod:`aptix_cli.batch_commands`).

Each command talks to any gateway through :class:`aptix_cli.client.ApiClient`, chosen with
``--url`` (default ``$APTIX_URL``, else ``http://127.0.0.1:8000``) and ``--key`` (default
``$APTIX_KEY``); exit codes are :mod:`aptix_cli.command_support`'s. Every read command takes
``--json`` for the raw body. ``httpx`` is imported only when a client command runs, so the process
commands keep their deferred imports.

This module parses the arguments and calls the gateway; what a command prints comes from
:mod:`aptix_cli.rendering`.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aptix_cli.batch_commands import add_batch_commands
from aptix_cli.command_support import UsageError, connection_flags, fail, out, runner
from aptix_cli.event_commands import add_event_commands, stream_turn

if TYPE_CHECKING:
    from aptix_cli.client import ApiClient

__all__ = ["add_client_commands", "check_call_ids"]


def add_client_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``turn``, ``tool-results``, ``trace``, ``session``, ``batch`` and ``watch`` on ``aptix``'s
    subparsers."""
    common = connection_flags()
    raw = argparse.ArgumentParser(add_help=False)
    raw.add_argument("--json", action="store_true", help="print the raw JSON body")
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                         help="wait up to this long for the turn to finish (default: 60; 0: no wait)")  # fmt: skip

    turn = commands.add_parser("turn", parents=[common, waiting, raw], help="start a turn and print its answer")
    turn.add_argument("input", help="the user's message")
    turn.add_argument("--session", metavar="ID", help="continue this session (default: a new one)")
    turn.add_argument("--mode", metavar="M", help="the mode of a new session")
    turn.add_argument("--tools", metavar="FILE", type=Path, help="JSON file: a list of client function tools")
    turn.add_argument("--stream", action="store_true",
                      help="print the model's text as it is generated (the turn's events), then the turn")  # fmt: skip
    turn.set_defaults(run=runner(_turn))

    results = commands.add_parser("tool-results", parents=[common, waiting, raw], help="send client tool outputs")
    results.add_argument("turn_id", metavar="TURN_ID")
    results.add_argument("--result", action="append", required=True, metavar="CALL_ID=TEXT",
                         help="one tool output (repeatable)")  # fmt: skip
    results.add_argument(
        "--no-check",
        action="store_true",
        help="send the results without first checking their call ids against the turn's pending calls",
    )
    results.set_defaults(run=runner(_tool_results))

    trace = commands.add_parser("trace", parents=[common, raw], help="print a turn's composition trace")
    trace.add_argument("turn_id", metavar="TURN_ID")
    trace.add_argument("--wide", action="store_true", help="do not cut the details column to the terminal width")
    trace.set_defaults(run=runner(_trace))

    session = commands.add_parser("session", parents=[common, raw], help="print a session: mode, history, turns")
    session.add_argument("session_id", metavar="ID")
    session.set_defaults(run=runner(_session))

    add_batch_commands(commands, common)
    add_event_commands(commands, common)


def check_call_ids(turn: Mapping[str, Any], call_ids: Sequence[str]) -> str | None:
    """Why results for ``call_ids`` would fail a turn waiting for client tools, or None if they fit.

    The gateway takes any set of results and the reasoner fails the whole turn
    (``continuation_mismatch``) when they do not answer exactly its pending calls: a typo costs the
    turn. Checked only for a turn in ``requires_client_tools``; any other status is the gateway's
    to refuse (409).

    Args:
        turn: The ``Turn`` body.
        call_ids: The call ids about to be sent, in order.

    Returns:
        A message naming the unknown, repeated and missing ids and the pending ones, or None.
    """
    from shared.models.turn import TurnStatus

    if turn.get("status") != TurnStatus.REQUIRES_CLIENT_TOOLS:
        return None
    pending = [str(call.get("call_id")) for call in turn.get("pending_tool_calls") or []]
    unknown = [call_id for call_id in dict.fromkeys(call_ids) if call_id not in pending]
    repeated = [call_id for call_id in dict.fromkeys(call_ids) if call_ids.count(call_id) > 1]
    missing = [call_id for call_id in pending if call_id not in call_ids]
    problems = [
        f"{label}: {', '.join(ids)}"
        for label, ids in (("not pending", unknown), ("given twice", repeated), ("missing", missing))
        if ids
    ]
    if not problems:
        return None
    return (
        f"turn {turn.get('turn_id')} waits for exactly its pending calls ({', '.join(pending)}); "
        f"{'; '.join(problems)}. Sending these would fail the turn (continuation_mismatch); "
        "--no-check sends them anyway"
    )


# --- turns -----------------------------------------------------------------------------------


def _turn(api: ApiClient, args: argparse.Namespace) -> int:
    request: dict[str, Any] = {"input": args.input}
    if args.session:
        request["session_id"] = args.session
    if args.mode:
        request["mode"] = args.mode
    if args.tools:
        request["tools"] = _read_tools(args.tools)
    if args.stream:
        streamed = stream_turn(api, request, as_json=args.json)
        if streamed is None:
            return fail("the turn's event stream ended before its last event", code=1)
        return _show_turn(streamed, as_json=args.json)
    deadline = time.monotonic() + args.wait
    turn = api.create_turn(request, wait=args.wait)
    return _show_turn(_follow(api, turn, deadline), as_json=args.json)


def _tool_results(api: ApiClient, args: argparse.Namespace) -> int:
    results = []
    for item in args.result:
        call_id, sep, output = item.partition("=")
        if not sep or not call_id:
            raise UsageError(f"--result {item!r}: expected CALL_ID=TEXT")
        results.append({"call_id": call_id, "output": output})
    if not args.no_check:
        problem = check_call_ids(api.get_turn(args.turn_id), [result["call_id"] for result in results])
        if problem:
            raise UsageError(problem)
    deadline = time.monotonic() + args.wait
    turn = api.post_tool_results(args.turn_id, results, wait=args.wait)
    return _show_turn(_follow(api, turn, deadline), as_json=args.json)


def _follow(api: ApiClient, turn: dict[str, Any], deadline: float) -> dict[str, Any]:
    """Long-poll the turn until it leaves queued/running or the deadline passes."""
    from aptix_cli.batch_progress import IN_FLIGHT

    while turn.get("status") in IN_FLIGHT and (remaining := deadline - time.monotonic()) > 0.5:
        turn = api.get_turn(turn["turn_id"], wait=remaining)
    return turn


def _show_turn(turn: Mapping[str, Any], *, as_json: bool) -> int:
    """Print the turn; exit code 1 when it failed or was cancelled."""
    from aptix_cli.rendering import turn_json, turn_lines
    from shared.models.turn import TurnStatus

    if as_json:
        out(turn_json(turn))
    else:
        for line in turn_lines(turn):
            out(line)
    status = turn.get("status")
    return 1 if status in TurnStatus.terminal() and status != TurnStatus.COMPLETED else 0


def _read_tools(path: Path) -> list[Any]:
    try:
        tools = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"--tools {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise UsageError(f"--tools {path}: not valid JSON: {exc}") from exc
    if not isinstance(tools, list) or not all(isinstance(tool, dict) for tool in tools):
        raise UsageError(f"--tools {path}: expected a JSON list of function tools")
    return tools


# --- trace and session -----------------------------------------------------------------------


def _trace(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.rendering import TRACE_WIDTH, trace_table

    trace = api.get_trace(args.turn_id)
    if args.json:
        out(json.dumps(trace, indent=2))
        return 0
    for line in trace_table(trace, width=None if args.wide else TRACE_WIDTH):
        out(line)
    return 0


def _session(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.rendering import session_lines

    session = api.get_session(args.session_id)
    if args.json:
        out(json.dumps(session, indent=2))
        return 0
    for line in session_lines(session):
        out(line)
    return 0
