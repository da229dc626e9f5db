"""A paused turn survives its worker dying (SIGKILL) and Redis losing its state."""

from __future__ import annotations

import json
import signal
import uuid

import pytest
import redis

from tests.integration.conftest import System

pytestmark = pytest.mark.integration

OPEN_FILE = {"type": "function", "name": "open_file", "parameters": {"type": "object", "properties": {}}}


def _pause(system: System) -> dict[str, object]:
    directive = "[[call:open_file " + json.dumps({"path": "x"}) + "]]"
    turn = system.run_turn({"input": f"{directive} m{uuid.uuid4().hex[:8]}", "tools": [OPEN_FILE]})
    assert turn["status"] == "requires_client_tools", turn
    return turn


def test_paused_turn_resumes_on_the_other_worker_after_its_worker_is_killed(two_worker_system: System) -> None:
    system = two_worker_system
    # Given a paused turn, and the worker that committed the pause
    turn = _pause(system)
    trace = system.trace(str(turn["turn_id"]))
    pausing_host = trace[-1]["worker"]
    victim = next(p for p in system.stack.processes if p.name.startswith("w") and pausing_host.startswith(p.name + "@"))
    survivor = next(p for p in system.stack.processes if p.name.startswith("w") and p is not victim)
    # When that worker is killed and the client posts the results
    victim.kill(signal.SIGKILL)
    call_id = turn["pending_tool_calls"][0]["call_id"]  # type: ignore[index]
    done = system.resume(str(turn["turn_id"]), [{"call_id": call_id, "output": "X"}])
    # Then the same turn completes, every resumed step on the surviving worker
    assert done["status"] == "completed", done
    steps = system.trace(str(turn["turn_id"]))
    resumed = [s for s in steps if s["data"].get("round") == 1]
    assert resumed and {s["worker"].split("@")[0] for s in resumed} == {survivor.name}


def test_paused_turn_resumes_after_the_redis_state_is_flushed(two_worker_system: System) -> None:
    system = two_worker_system
    turn = _pause(system)
    redis.Redis.from_url(system.env["APTIX_REDIS_URL"]).flushdb()
    call_id = turn["pending_tool_calls"][0]["call_id"]  # type: ignore[index]
    done = system.resume(str(turn["turn_id"]), [{"call_id": call_id, "output": "after flush"}])
    assert done["status"] == "completed", done
    assert done["output_text"] == "Tool results: open_file=after flush"
