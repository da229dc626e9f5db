"""A paused turn survives its worker dying (SIGKILL) and Redis losing its state."""

from __future__ import annotations

import json
import signal
import uuid

import pytest
import redis

from shared.state.keys import claim_key
from tests.integration.conftest import OPEN_FILE, System
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


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


def test_step_of_a_killed_worker_runs_again_on_the_other_worker(two_worker_system: System) -> None:
    system = two_worker_system
    client = redis.Redis.from_url(system.env["APTIX_REDIS_URL"])
    workers = [p for p in system.stack.processes if p.name.startswith("w") and p.alive()]
    if len(workers) < 2:
        workers.append(system.stack.start_worker(f"wc{uuid.uuid4().hex[:4]}"))
    # Given a turn whose LLM call is slow, and the worker that holds that step's lease
    marker = f"m{uuid.uuid4().hex[:8]}"
    turn_id = system.post_turn({"input": f"[[sleep:4000]] slow {marker}"}).json()["turn_id"]

    def lease_owner() -> str | None:
        # the entry's task makes the model call (the default APTIX_TASK_BOUNDARIES=call): its lease is the entry's
        leases = [client.get(key) for key in client.keys(claim_key(turn_id, "*request_handler*"))]
        return leases[0].decode() if leases and leases[0] else None

    wait_for(lambda: system.llm_requests(marker), what="the LLM step to start", seconds=5)
    holder = wait_for(lease_owner, what="the lease of the step making the call", seconds=5).split("@")[0]
    victim = next(p for p in workers if p.name == holder)
    # When that worker dies in the middle of the step
    victim.kill(signal.SIGKILL)
    # Then the message comes back, the lease has lapsed, and another worker runs the step to the end
    done = system.wait_turn(turn_id, seconds=90)
    assert done["status"] == "completed", done
    assert done["output_text"] == f"Echo: [[sleep:4000]] slow {marker}"
    calls = [s for s in system.trace(turn_id) if s["kind"] == "llm_call"]
    assert len(calls) == 1 and not calls[0]["worker"].startswith(holder + "@")
