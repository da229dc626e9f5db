"""The ``aptix`` client commands: turns, tool results, traces, sessions and batches over HTTP.

Each command talks to any gateway through :class:`aptix_cli.client.ApiClient`, chosen with
``--url`` (default ``$APTIX_URL``, else ``http://127.0.0.1:8000``) and ``--key`` (default
``$APTIX_KEY``). Exit codes: 0 success; 1 an HTTP error (``error <status> <code>: <message>`` on
stderr), an unreachable gateway, or a turn that failed or was cancelled; 2 a usage error (no key, a
bad ``--tools`` or batch file). ``httpx`` is imported only when a client command runs, so the
process commands keep their deferred imports.

This module parses the arguments and calls the gateway; what a command prints comes from
:mod:`aptix_cli.rendering`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aptix_cli.client import ApiClient

__all__ = ["add_client_commands"]

DEFAULT_URL = "http://127.0.0.1:8000"

Command = Callable[["ApiClient", argparse.Namespace], int]


class UsageError(Exception):
    """Bad input from the user: printed as ``error: <message>``, exit code 2."""


def add_client_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``turn``, ``tool-results``, ``trace``, ``session`` and ``batch`` on ``aptix``'s subparsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("APTIX_URL") or DEFAULT_URL,
                        help="the gateway (default: $APTIX_URL, else %(default)s)")  # fmt: skip
    common.add_argument("--key", default=os.environ.get("APTIX_KEY"), help="API key (default: $APTIX_KEY)")
    waiting = argparse.ArgumentParser(add_help=False)
    waiting.add_argument("--wait", type=float, default=60.0, metavar="SECONDS",
                         help="wait up to this long for the turn to finish (default: 60; 0: no wait)")  # fmt: skip
    waiting.add_argument("--json", action="store_true", help="print the raw Turn JSON")

    turn = commands.add_parser("turn", parents=[common, waiting], help="start a turn and print its answer")
    turn.add_argument("input", help="the user's message")
    turn.add_argument("--session", metavar="ID", help="continue this session (default: a new one)")
    turn.add_argument("--mode", metavar="M", help="the mode of a new session")
    turn.add_argument("--tools", metavar="FILE", type=Path, help="JSON file: a list of client function tools")
    turn.set_defaults(run=_runner(_turn))

    results = commands.add_parser("tool-results", parents=[common, waiting], help="send client tool outputs")
    results.add_argument("turn_id", metavar="TURN_ID")
    results.add_argument("--result", action="append", required=True, metavar="CALL_ID=TEXT",
                         help="one tool output (repeatable)")  # fmt: skip
    results.set_defaults(run=_runner(_tool_results))

    trace = commands.add_parser("trace", parents=[common], help="print a turn's composition trace")
    trace.add_argument("turn_id", metavar="TURN_ID")
    trace.set_defaults(run=_runner(_trace))

    session = commands.add_parser("session", parents=[common], help="print a session: mode, history, turns")
    session.add_argument("session_id", metavar="ID")
    session.set_defaults(run=_runner(_session))

    batch = commands.add_parser("batch", help="many turns at once")
    batch_commands = batch.add_subparsers(dest="batch_command", required=True)
    submit = batch_commands.add_parser("submit", parents=[common], help="submit a JSON Lines file of TurnRequests")
    submit.add_argument("file", metavar="FILE.jsonl", type=Path)
    submit.add_argument("--wait", action="store_true", help="follow progress until every turn has finished")
    submit.add_argument("--out", metavar="FILE", type=Path, help="with --wait: write the resulting Turns here")
    submit.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="seconds between polls")
    submit.set_defaults(run=_runner(_batch_submit))


def _runner(command: Command) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: build the client, turn errors into messages and exit codes."""

    def run(args: argparse.Namespace) -> int:
        from aptix_cli.client import ApiClient, GatewayError, GatewayUnreachable

        if not args.key:
            return _fail("no API key: pass --key KEY or set APTIX_KEY", code=2)
        try:
            with ApiClient(args.url, key=args.key) as api:
                return command(api, args)
        except UsageError as exc:
            return _fail(str(exc), code=2)
        except GatewayError as exc:
            sys.stderr.write(f"error {exc.status} {exc.code}: {exc.message}\n")
            return 1
        except GatewayUnreachable as exc:
            return _fail(str(exc), code=1)

    return run


# --- turns -----------------------------------------------------------------------------------


def _turn(api: ApiClient, args: argparse.Namespace) -> int:
    request: dict[str, Any] = {"input": args.input}
    if args.session:
        request["session_id"] = args.session
    if args.mode:
        request["mode"] = args.mode
    if args.tools:
        request["tools"] = _read_tools(args.tools)
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
        _out(turn_json(turn))
    else:
        for line in turn_lines(turn):
            _out(line)
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
    from aptix_cli.rendering import trace_table

    for line in trace_table(api.get_trace(args.turn_id)):
        _out(line)
    return 0


def _session(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.rendering import session_lines

    for line in session_lines(api.get_session(args.session_id)):
        _out(line)
    return 0


# --- batches ---------------------------------------------------------------------------------


def _batch_submit(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.batch_progress import follow_batch, out_of_flight
    from aptix_cli.client import ClientError
    from aptix_cli.progress import ProgressBar
    from aptix_cli.rendering import batch_summary, failed_turn_line
    from shared.models.turn import TurnStatus

    if args.out and not args.wait:
        raise UsageError("--out needs --wait (the results are written once every turn has finished)")
    requests = _read_batch(args.file)
    bar = ProgressBar(sys.stderr, total=len(requests))  # its clock starts before the submission
    batch = api.create_batch(requests)
    batch_id = batch["batch_id"]
    _out(f"batch {batch_id}: {batch.get('total', len(requests))} turns")
    if not args.wait:
        return 0
    try:
        batch = follow_batch(api, batch, interval=max(args.poll, 0.05), bar=bar)
    except KeyboardInterrupt:
        bar.interrupt()
        sys.stderr.write(f"interrupted; batch {batch_id} goes on at the gateway\n")
        return 130
    except ClientError:
        bar.interrupt()
        raise
    counts: dict[str, int] = batch.get("counts", {})
    bar.finish(out_of_flight(batch), counts)
    elapsed = bar.elapsed
    if args.out or counts.get("failed") or counts.get("cancelled"):
        turns = api.batch_results(batch_id)
        if args.out:
            args.out.write_text("".join(json.dumps(turn) + "\n" for turn in turns))
            _out(f"wrote {len(turns)} turns to {args.out}")
        for turn in turns:
            if turn.get("status") in (TurnStatus.FAILED, TurnStatus.CANCELLED):
                _out(failed_turn_line(turn))
    _out(batch_summary(batch_id, counts, done=out_of_flight(batch), elapsed=elapsed))
    return 0


def _read_batch(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    requests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path} line {number}: not valid JSON: {exc.msg}") from exc
        if not isinstance(request, dict):
            raise UsageError(f"{path} line {number}: expected a JSON object (a TurnRequest)")
        requests.append(request)
    if not requests:
        raise UsageError(f"{path}: no requests in the file")
    return requests


# --- output ----------------------------------------------------------------------------------


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _fail(message: str, *, code: int) -> int:
    sys.stderr.write(f"error: {message}\n")
    return code
