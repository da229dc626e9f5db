"""The server-tool turn the durable peers run, and the run protocol ``aptix bench --peers`` drives them by.

The peers (``peer_dbos.py``, ``peer_langgraph.py``) run in virtualenvs of their own, so this module
uses only the standard library and httpx. A turn is Aptix's ``server-tool`` scenario: the model is
asked (the bench passes the scenario's directive) to call ``get_current_time``; the peer runs the
tool and calls the model again with its output, and the model answers text.

The protocol, over the peer's stdin and stdout (``aptix_cli.bench.peers`` is the other side):

1. the peer prepares (its system database, its pools), runs ``--warm-up`` turns, not measured,
   and prints ``ready``;
2. it waits for a line on stdin, runs ``--turns`` turns with at most ``--concurrency`` at a time,
   and prints ``result {"turns": N, "completed": N, "seconds": S}``: the bench samples the CPU
   around this;
3. it waits for stdin to close, then shuts down.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import httpx

__all__ = [
    "POOL_SIZE",
    "TOOL",
    "answer_text",
    "arguments",
    "function_call",
    "get_current_time",
    "limits",
    "post",
    "post_async",
    "report_result",
    "request",
    "tool_output",
    "user",
    "user_text",
    "wait_for_end",
    "wait_for_go",
]

TOOL: dict[str, Any] = {
    "type": "function",
    "name": "get_current_time",
    "description": "The current UTC time in ISO 8601.",
    "parameters": {"type": "object", "properties": {}, "additionalProperties": False},
}
"""The one server tool, as Aptix offers it to the model."""
POOL_SIZE = 16
"""PostgreSQL connections each peer pools (both the same, so their figures compare)."""
_MODEL = "scripted-model"


def arguments(description: str, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The peers' common command line."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model-url", required=True, help="the scripted model's base URL, e.g. http://127.0.0.1:8900")
    parser.add_argument("--database-url", required=True, help="the peer's PostgreSQL database (postgresql://...)")
    parser.add_argument("--turns", type=int, required=True)
    parser.add_argument("--warm-up", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--directive", required=True, help="what the user text asks the scripted model for")
    return parser.parse_args(argv)


def user_text(index: int, directive: str) -> str:
    """The user text of the ``index``-th turn (as the server-tool scenario's)."""
    return f"bench turn {index} {directive}"


def user(text: str) -> dict[str, Any]:
    """The user message that starts a turn."""
    return {"type": "message", "role": "user", "content": text}


def request(items: list[dict[str, Any]]) -> dict[str, Any]:
    """A model call on the turn's input items so far, offering the tool."""
    return {"model": _MODEL, "input": items, "tools": [TOOL]}


def tool_output(call: dict[str, Any], output: str) -> dict[str, Any]:
    """The input item that gives the model a tool's output."""
    return {"type": "function_call_output", "call_id": call["call_id"], "output": output}


def function_call(response: dict[str, Any]) -> dict[str, Any]:
    """The function call a response asks for (as an input item for the next call).

    Raises:
        ValueError: the response asks for none.
    """
    for item in response.get("output", []):
        if item.get("type") == "function_call":
            return {key: item[key] for key in ("type", "call_id", "name", "arguments")}
    raise ValueError(f"no function call in response {response.get('id')!r}")


def answer_text(response: dict[str, Any]) -> str:
    """The text of a response's message.

    Raises:
        ValueError: the response has no text.
    """
    for item in response.get("output", []):
        if item.get("type") == "message":
            return "".join(part.get("text", "") for part in item.get("content", []))
    raise ValueError(f"no text in response {response.get('id')!r}")


def get_current_time() -> str:
    """The server tool: the current UTC time in ISO 8601 (as Aptix's built-in)."""
    return datetime.now(UTC).isoformat()


def post(client: httpx.Client, request: dict[str, Any]) -> dict[str, Any]:
    """One model call (``POST /v1/responses``) on a sync client."""
    response = client.post("/v1/responses", json=request)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


async def post_async(client: httpx.AsyncClient, request: dict[str, Any]) -> dict[str, Any]:
    """One model call (``POST /v1/responses``) on an async client."""
    response = await client.post("/v1/responses", json=request)
    response.raise_for_status()
    body: dict[str, Any] = response.json()
    return body


def limits(concurrency: int) -> httpx.Limits:
    """Keep-alive connections for every turn in flight."""
    return httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)


def wait_for_go() -> None:
    """Say ``ready`` and wait for the bench's line on stdin."""
    _say("ready")
    sys.stdin.readline()


def report_result(*, turns: int, completed: int, started: float) -> None:
    """Print the measured run's figures (``started`` from ``time.perf_counter()``)."""
    seconds = time.perf_counter() - started
    _say("result " + json.dumps({"turns": turns, "completed": completed, "seconds": seconds}))


def wait_for_end() -> None:
    """Wait until the bench closes stdin (it samples the CPU first)."""
    while sys.stdin.readline():
        pass


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
