"""The ``aptix`` client commands: turns, tool results, traces, sessions and batches over HTTP.

Each command talks to any gateway through :class:`aptix_cli.client.ApiClient`, chosen with
``--url`` (default ``$APTIX_URL``, else ``http://127.0.0.1:8000``) and ``--key`` (default
``$APTIX_KEY``). Exit codes: 0 success; 1 an HTTP error (``error <status> <code>: <message>`` on
stderr), an unreachable gateway, or a turn that failed or was cancelled; 2 a usage error (no key, a
bad ``--tools`` or batch file). ``httpx`` is imported only when a client command runs, so the
process commands keep their deferred imports.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aptix_cli.client import ApiClient

__all__ = ["add_client_commands", "trace_table"]

DEFAULT_URL = "http://127.0.0.1:8000"
_IN_FLIGHT = ("queued", "running")
_TRACE_WIDTH = 120

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
    while turn.get("status") in _IN_FLIGHT and (remaining := deadline - time.monotonic()) > 0.5:
        turn = api.get_turn(turn["turn_id"], wait=remaining)
    return turn


def _show_turn(turn: Mapping[str, Any], *, as_json: bool) -> int:
    status = turn.get("status", "?")
    if as_json:
        _out(json.dumps(turn, indent=2))
    else:
        if turn.get("output_text"):
            _out(str(turn["output_text"]))
            _out("")
        mode = f"  mode: {turn['mode']}" if turn.get("mode") else ""
        _out(f"status: {status}{mode}")
        _out(f"turn: {turn.get('turn_id')}  session: {turn.get('session_id')}")
        error = turn.get("error")
        if isinstance(error, dict):
            _out(f"error: {error.get('code')}: {error.get('message')}")
        pending = turn.get("pending_tool_calls") or []
        if pending:
            _out("pending tool calls:")
            for call in pending:
                _out(f"  {call['call_id']}  {call['name']}  {call['arguments']}")
            flags = " ".join(f"--result {shlex.quote(call['call_id'] + '=OUTPUT')}" for call in pending)
            _out(f"send the outputs with: aptix tool-results {shlex.quote(str(turn['turn_id']))} {flags}")
        elif status in _IN_FLIGHT:
            _out(f"the turn is still {status}; it goes on at the gateway")
    return 1 if status in ("failed", "cancelled") else 0


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
    for line in trace_table(api.get_trace(args.turn_id)):
        _out(line)
    return 0


def trace_table(trace: Mapping[str, Any]) -> list[str]:
    """The lines of a readable table of a ``GET /v1/turns/{id}/trace`` body (also used by the demo)."""
    header = ("seq", "kind", "step", "worker", "r", "i", "ms", "details")
    rows = [header] + [_trace_row(step) for step in trace.get("steps", [])]
    widths = [max(len(row[col]) for row in rows) for col in range(len(header) - 1)]
    right = {0, 4, 5, 6}
    lines = []
    for row in rows:
        cells = [cell.rjust(w) if col in right else cell.ljust(w) for col, (cell, w) in enumerate(zip(row, widths))]
        line = "  ".join(cells)
        room = max(_TRACE_WIDTH - len(line) - 2, 10)
        lines.append(f"{line}  {_clip(row[-1], room)}".rstrip())
    lines.append(f"{len(rows) - 1} steps, turn {trace.get('turn_id', '?')}")
    return lines


def _trace_row(step: Mapping[str, Any]) -> tuple[str, ...]:
    data = dict(step.get("data") or {})
    round_, iteration = data.pop("round", ""), data.pop("iteration", "")
    duration = step.get("duration_ms")
    details = " ".join(f"{key}={_compact(value)}" for key, value in data.items())
    return (
        str(step.get("seq", "")), str(step.get("kind", "")), str(step.get("step", "")),
        _clip(str(step.get("worker", "")), 24), str(round_), str(iteration),
        "" if duration is None else f"{float(duration):.1f}", details,
    )  # fmt: skip


def _session(api: ApiClient, args: argparse.Namespace) -> int:
    session = api.get_session(args.session_id)
    _out(f"session {session.get('session_id')}  mode: {session.get('mode')}")
    _out(f"created {session.get('created_at')}  updated {session.get('updated_at')}")
    history = session.get("mode_history") or []
    _out(f"mode history ({len(history)}):")
    for change in history:
        reason = f"  {change['reason']}" if change.get("reason") else ""
        _out(f"  {change.get('from')} -> {change.get('to')}  at {change.get('at')}{reason}")
    turns = session.get("turns") or []
    _out(f"turns ({len(turns)}):")
    width = max((len(str(turn.get("status"))) for turn in turns), default=0)
    for turn in turns:
        _out(f"  {turn.get('turn_id')}  {str(turn.get('status')).ljust(width)}  {turn.get('created_at')}")
    return 0


# --- batches ---------------------------------------------------------------------------------


def _batch_submit(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.client import ClientError
    from aptix_cli.progress import STATUS_ORDER, ProgressBar

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
        while _in_flight(batch):
            bar.update(_done(batch), batch.get("counts", {}))
            time.sleep(max(args.poll, 0.05))
            batch = api.get_batch(batch_id)
    except KeyboardInterrupt:
        bar.interrupt()
        sys.stderr.write(f"interrupted; batch {batch_id} goes on at the gateway\n")
        return 130
    except ClientError:
        bar.interrupt()
        raise
    counts: dict[str, int] = batch.get("counts", {})
    bar.finish(_done(batch), counts)
    elapsed = bar.elapsed
    if args.out or counts.get("failed") or counts.get("cancelled"):
        turns = api.batch_results(batch_id)
        if args.out:
            args.out.write_text("".join(json.dumps(turn) + "\n" for turn in turns))
            _out(f"wrote {len(turns)} turns to {args.out}")
        for turn in turns:
            if turn.get("status") in ("failed", "cancelled"):
                error = turn.get("error") or {}
                _out(f"{turn.get('status')} {turn.get('turn_id')}: {error.get('code')}: {error.get('message')}")
    shown = [s for s in STATUS_ORDER if s in ("completed", "failed", "cancelled") or counts.get(s)]
    summary = " ".join(f"{status} {counts.get(status, 0)}" for status in shown)
    rate = _done(batch) / elapsed if elapsed > 0 else 0.0
    _out(f"batch {batch_id} finished: {summary}  in {elapsed:.1f}s  {rate:.1f} turns/s")
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


def _in_flight(batch: Mapping[str, Any]) -> bool:
    counts = batch.get("counts", {})
    return any(counts.get(status, 0) for status in _IN_FLIGHT)


def _done(batch: Mapping[str, Any]) -> int:
    counts = batch.get("counts", {})
    return int(batch.get("total", 0)) - sum(int(counts.get(status, 0)) for status in _IN_FLIGHT)


# --- output ----------------------------------------------------------------------------------


def _out(line: str) -> None:
    sys.stdout.write(line + "\n")


def _fail(message: str, *, code: int) -> int:
    sys.stderr.write(f"error: {message}\n")
    return code


def _compact(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _clip(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 3] + "..."
