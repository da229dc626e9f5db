"""What the ``aptix`` client commands print: a turn, a trace table, a session and a batch summary.

Pure functions from the gateway's JSON bodies (API.md) to lines of text; the commands in
:mod:`aptix_cli.client_commands` call the gateway and write these lines. The demo shows a trace
with :func:`trace_table` too.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping
from typing import Any

from aptix_cli.batch_progress import IN_FLIGHT
from aptix_cli.progress import STATUS_ORDER

__all__ = [
    "TRACE_WIDTH",
    "batch_counts_line",
    "batch_summary",
    "event_line",
    "failed_turn_line",
    "session_lines",
    "trace_table",
    "turn_json",
    "turn_lines",
]

TRACE_WIDTH = 120
"""Characters a trace table's line may take unless ``aptix trace --wide``."""


def turn_json(turn: Mapping[str, Any]) -> str:
    """The raw Turn body, indented (``--json``)."""
    return json.dumps(turn, indent=2)


def turn_lines(turn: Mapping[str, Any]) -> list[str]:
    """A turn for a person: its answer, status, ids, error, and how to answer pending tool calls.

    Args:
        turn: A ``Turn`` body (``POST /v1/turns``, ``GET /v1/turns/{id}``, ``.../tool-results``).

    Returns:
        The lines to print; a turn still queued or running says it goes on at the gateway.
    """
    status = turn.get("status", "?")
    lines = []
    if turn.get("output_text"):
        lines += [str(turn["output_text"]), ""]
    mode = f"  mode: {turn['mode']}" if turn.get("mode") else ""
    lines.append(f"status: {status}{mode}")
    lines.append(f"turn: {turn.get('turn_id')}  session: {turn.get('session_id')}")
    error = turn.get("error")
    if isinstance(error, dict):
        lines.append(f"error: {error.get('code')}: {error.get('message')}")
    pending = turn.get("pending_tool_calls") or []
    if pending:
        lines.append("pending tool calls:")
        lines += [f"  {call['call_id']}  {call['name']}  {call['arguments']}" for call in pending]
        flags = " ".join(f"--result {shlex.quote(call['call_id'] + '=OUTPUT')}" for call in pending)
        lines.append(f"send the outputs with: aptix tool-results {shlex.quote(str(turn['turn_id']))} {flags}")
    elif status in IN_FLIGHT:
        lines.append(f"the turn is still {status}; it goes on at the gateway")
    return lines


def trace_table(trace: Mapping[str, Any], *, width: int | None = TRACE_WIDTH) -> list[str]:
    """The lines of a readable table of a ``GET /v1/turns/{id}/trace`` body (also used by the demo).

    Args:
        trace: The trace body.
        width: The longest line; the details column is cut to fit. None: nothing is cut.

    Returns:
        A header, a row per trace record and a last line with the count and the turn id.
    """
    header = ("seq", "kind", "step", "worker", "r", "i", "ms", "details")
    rows = [header] + [_trace_row(step) for step in trace.get("steps", [])]
    widths = [max(len(row[col]) for row in rows) for col in range(len(header) - 1)]
    right = {0, 4, 5, 6}
    lines = []
    for row in rows:
        # widths has no entry for the last column (the details), so zip stops before it.
        sized = enumerate(zip(row, widths, strict=False))
        cells = [cell.rjust(w) if col in right else cell.ljust(w) for col, (cell, w) in sized]
        line = "  ".join(cells)
        details = row[-1] if width is None else _clip(row[-1], max(width - len(line) - 2, 10))
        lines.append(f"{line}  {details}".rstrip())
    lines.append(f"{len(rows) - 1} steps, turn {trace.get('turn_id', '?')}")
    return lines


def event_line(event_id: str | None, event: str, data: Any, *, width: int | None = TRACE_WIDTH) -> str:
    """One turn event (``aptix watch``) on one line: its id, its name and what it says.

    A trace record shows its seq, kind, step, worker, time and details (as ``aptix trace`` does); a
    text delta its text, quoted; a ``turn.*`` event the turn's status, error, pending calls or answer.

    Args:
        event_id: The event's id.
        event: Its name.
        data: Its data.
        width: The longest line (None: nothing is cut).
    """
    if event == "trace" and isinstance(data, Mapping):
        seq, kind, step, worker, _round, _iteration, ms, details = _trace_row(data)
        timing = f" {ms}ms" if ms else ""
        text = f"#{seq} {kind} {step}@{worker}{timing} {details}".rstrip()
    elif event.startswith("output_text.") and isinstance(data, Mapping):
        text = json.dumps(data.get("delta", ""), ensure_ascii=False)
    elif event.startswith("turn.") and isinstance(data, Mapping):
        text = f"status={data.get('status')}"
        if isinstance(data.get("error"), Mapping):
            text += f" error={data['error'].get('code')}: {data['error'].get('message')}"
        pending = data.get("pending_tool_calls") or []
        if pending:
            text += " pending=" + ",".join(f"{call.get('call_id')}:{call.get('name')}" for call in pending)
        if data.get("output_text"):
            text += f" output_text={json.dumps(data['output_text'], ensure_ascii=False)}"
    else:
        text = _compact(data)
    line = f"{event_id or '-'}  {event}  {text}"
    return line if width is None else _clip(line, width)


def session_lines(session: Mapping[str, Any]) -> list[str]:
    """A ``GET /v1/sessions/{id}`` body: mode, timestamps, mode history and turns."""
    lines = [
        f"session {session.get('session_id')}  mode: {session.get('mode')}",
        f"created {session.get('created_at')}  updated {session.get('updated_at')}",
    ]
    history = session.get("mode_history") or []
    lines.append(f"mode history ({len(history)}):")
    for change in history:
        reason = f"  {change['reason']}" if change.get("reason") else ""
        lines.append(f"  {change.get('from')} -> {change.get('to')}  at {change.get('at')}{reason}")
    turns = session.get("turns") or []
    lines.append(f"turns ({len(turns)}):")
    width = max((len(str(turn.get("status"))) for turn in turns), default=0)
    lines += [
        f"  {turn.get('turn_id')}  {str(turn.get('status')).ljust(width)}  {turn.get('created_at')}" for turn in turns
    ]
    return lines


def failed_turn_line(turn: Mapping[str, Any]) -> str:
    """``<status> <turn_id>: <code>: <message>`` for a batch's failed or cancelled turn."""
    error = turn.get("error") or {}
    return f"{turn.get('status')} {turn.get('turn_id')}: {error.get('code')}: {error.get('message')}"


def batch_counts_line(counts: Mapping[str, int]) -> str:
    """A batch's turns by status, every status in order: ``queued 0 running 2 ... cancelled 0``."""
    return " ".join(f"{status} {counts.get(status, 0)}" for status in STATUS_ORDER)


def batch_summary(batch_id: str, counts: Mapping[str, int], *, done: int, elapsed: float) -> str:
    """The last line of ``aptix batch submit --wait``.

    Args:
        batch_id: The batch.
        counts: Its turns by status; the terminal statuses are always shown, others when non-zero.
        done: Turns out of flight.
        elapsed: Seconds since the submission.

    Returns:
        E.g. ``batch b1 finished: completed 9 failed 1 cancelled 0  in 2.0s  5.0 turns/s``.
    """
    shown = [s for s in STATUS_ORDER if s.is_terminal or counts.get(s)]
    summary = " ".join(f"{status} {counts.get(status, 0)}" for status in shown)
    rate = done / elapsed if elapsed > 0 else 0.0
    return f"batch {batch_id} finished: {summary}  in {elapsed:.1f}s  {rate:.1f} turns/s"


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


def _compact(value: object) -> str:
    return value if isinstance(value, str) else json.dumps(value, separators=(",", ":"))


def _clip(text: str, room: int) -> str:
    return text if len(text) <= room else text[: room - 3] + "..."
