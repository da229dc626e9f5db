"""``aptix demo`` (what ``make demo`` runs): a tour of the system on the embedded stack.

No external service: the dev stack runs in this process (SQLite in a temporary folder, the
embedded Redis, worker threads, the gateway, the scripted model). Every step goes through the real
HTTP API: a new session, a server tool, a mode change, a client-tool pause and re-entry, and a
batch of 500 turns with a progress bar; then a summary and one turn's trace. Exits 0 only when
every step did what it should.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from typing import Any

from aptix_cli.batch_progress import IN_FLIGHT, follow_batch, out_of_flight
from aptix_cli.bench.stats import percentile, turn_latencies
from aptix_cli.client import ApiClient
from aptix_cli.dev import DevStack
from aptix_cli.progress import ProgressBar
from aptix_cli.rendering import trace_table

__all__ = ["run_demo"]

BATCH_SIZE = 500
_OPEN_FILE = {
    "type": "function",
    "name": "open_file",
    "description": "Read a file on the user's machine.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}


class DemoFailed(Exception):
    """A step of the tour did not do what it should."""


def run_demo(*, batch_size: int = BATCH_SIZE) -> int:
    """Run the tour; 0 when every step worked."""
    from shared.logging import configure_logging

    configure_logging("ERROR")
    with tempfile.TemporaryDirectory(prefix="aptix-demo-") as folder:
        stack = DevStack(port=0, sqlite_path=os.path.join(folder, "demo.sqlite"), worker_threads=8)
        info = stack.start()
        try:
            _say(f"Aptix demo: embedded stack on {info.url} (embedded: {', '.join(info.embedded) or 'none'})")
            with ApiClient(info.url, key=info.api_key, timeout=60) as api:
                _tour(api, batch_size)
        except DemoFailed as exc:
            _say(f"\nDEMO FAILED: {exc}")
            return 1
        finally:
            stack.stop()
    _say("\nThe demo finished: every step worked.")
    return 0


def _tour(api: ApiClient, batch_size: int) -> None:
    _section("1. A new session (mode general)")
    first = _turn(api, {"input": "Hello! What can you do?"}, expect="completed")
    session_id = first["session_id"]

    _section("2. A server tool: the model calls get_current_time, the worker runs it")
    _turn(api, {"session_id": session_id, "input": "[[call:get_current_time {}]] What time is it?"}, expect="completed")

    _section("3. A mode change: agent_change_mode applies to the next LLM call of the same turn")
    change = json.dumps({"targetMode": "ddr-authoring", "reason": "the user wants a design record"})
    changed = _turn(
        api,
        {"session_id": session_id, "input": f"[[call:agent_change_mode {change}]] Let's write a DDR."},
        expect="completed",
    )
    if changed["mode"] != "ddr-authoring":
        raise DemoFailed(f"the mode did not change: {changed['mode']}")
    history = api.get_session(session_id)["mode_history"]
    _say(f"   session mode history: {[(h['from'], h['to']) for h in history]}")

    _section("4. A client tool: the turn pauses, the client posts the result, the same turn resumes")
    paused = _turn(
        api,
        {
            "session_id": session_id,
            "input": '[[call:open_file {"path": "notes.txt"}]] Summarise notes.txt',
            "tools": [_OPEN_FILE],
        },
        expect="requires_client_tools",
    )
    call = paused["pending_tool_calls"][0]
    _say(f"   pending: {call['name']}({call['arguments']})  call_id={call['call_id']}")
    resumed = api.post_tool_results(paused["turn_id"], [{"call_id": call["call_id"], "output": "Buy milk."}], wait=30)
    _show(resumed, expect="completed")

    _section(f"5. A batch of {batch_size} turns")
    summary = _batch(api, batch_size)
    _say(summary)

    _section("6. The CompositionTrace of the mode-change turn")
    for line in trace_table(api.get_trace(changed["turn_id"])):
        _say("   " + line)


def _turn(api: ApiClient, request: dict[str, Any], *, expect: str) -> dict[str, Any]:
    _say(f" > {request['input']}")
    turn = api.create_turn(request, wait=30)
    if turn["status"] in IN_FLIGHT:
        turn = api.get_turn(turn["turn_id"], wait=30)
    return _show(turn, expect=expect)


def _show(turn: dict[str, Any], *, expect: str) -> dict[str, Any]:
    text = turn.get("output_text") or ""
    _say(f" < [{turn['status']}, mode {turn['mode']}] {text[:150]}")
    if turn["status"] != expect:
        raise DemoFailed(f"turn {turn['turn_id']} is {turn['status']}, expected {expect}: {turn.get('error')}")
    return turn


def _batch(api: ApiClient, size: int) -> str:
    requests = [{"input": f"Batch question {index}: what is {index} squared?"} for index in range(size)]
    bar = ProgressBar(sys.stdout, total=size, interval=2.0)  # the clock starts before the submission
    batch = follow_batch(api, api.create_batch(requests), interval=0.2, bar=bar)
    counts = batch["counts"]
    bar.finish(out_of_flight(batch), counts)
    elapsed = bar.elapsed
    latencies = turn_latencies(api.batch_results(batch["batch_id"]))
    if counts["completed"] != size:
        raise DemoFailed(f"the batch did not complete every turn: {counts}")
    p50, p95 = percentile(latencies, 0.5), percentile(latencies, 0.95)
    statuses = ", ".join(f"{status} {count}" for status, count in counts.items() if count)
    return (
        f"   {size} turns in {elapsed:.1f}s = {size / elapsed:.1f} turns/s; "
        f"latency p50 {p50 * 1000:.0f} ms, p95 {p95 * 1000:.0f} ms (queued to committed); {statuses}"
    )


def _section(title: str) -> None:
    _say(f"\n{title}")


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
