"""Operator tools the test catalog registers by import path (as an operator's would be)."""

from __future__ import annotations

import os
import signal
import time

from shared.state.redis_store import connect


def record_call(key: str) -> str:
    """Count one execution under ``key`` in Redis, so tests can see how often a tool ran."""
    client = connect(os.environ["APTIX_REDIS_URL"], max_connections=2)  # a single Redis or a cluster
    count = client.incr(f"aptix:test:calls:{key}")
    return f"recorded {key} #{count}"


def explode(reason: str = "kaboom") -> str:
    """Always raise."""
    raise RuntimeError(reason)


def sleepy(seconds: float = 5.0) -> str:
    """Overrun the tool's timeout."""
    time.sleep(seconds)
    return "woke up"


def whoami(context: dict[str, str]) -> dict[str, str]:
    """Return the tool context the worker passed."""
    return context


def count_run(key: str) -> str:
    """Append ``key`` as one line to the file ``APTIX_CHAOS_TOOL_LOG`` names (the chaos suite counts runs).

    One ``write`` of a short line to a file opened for appending is atomic on Linux, so concurrent
    workers never interleave their lines.
    """
    with open(os.environ["APTIX_CHAOS_TOOL_LOG"], "a", encoding="utf-8") as log:
        log.write(key + "\n")
    return f"ran {key}"


def hold(key: str) -> str:
    """Block until the test releases ``key`` (pushes to ``aptix:test:release:<key>``), 120 s at most:
    a handler that hangs, for the worker health tests."""
    client = connect(os.environ["APTIX_REDIS_URL"], max_connections=2)  # a single Redis or a cluster
    client.blpop([f"aptix:test:release:{key}"], timeout=120)
    return f"released {key}"


def die(key: str) -> str:
    """Count this run under ``key`` in Redis (as :func:`record_call` does), then SIGKILL the process running
    the handler: a poison step, which kills whichever worker runs it. Catalog it ``idempotent: true``, so
    that every delivery runs it (a call that is not idempotent is never run twice)."""
    record_call(key)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


def poison(key: str) -> str:
    """:func:`count_run`, then SIGKILL the process running the handler: the chaos suite's poison step
    (catalogued ``idempotent: true``, so every delivery runs it)."""
    count_run(key)
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"
