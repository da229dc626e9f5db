"""Worker pools of API.md: an LLM-queue worker on gevent keeps many LLM calls in flight."""

from __future__ import annotations

import signal
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

import pytest

from tests.integration.conftest import System
from tests.support.processes import alive, children_of
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def bare_system(database_url: str, scripted_llm: object, modes_file: object) -> Iterator[tuple[LocalStack, System]]:
    """A gateway on its own broker and state databases, with no worker yet (each test starts its own)."""
    from scripted_llm import ScriptedServer
    from tests.integration.conftest import own_system

    assert isinstance(scripted_llm, ScriptedServer) and isinstance(modes_file, Path)
    with own_system(database_url=database_url, llm=scripted_llm, modes_file=modes_file) as (stack, system):
        yield stack, system


def test_gevent_llm_worker_runs_llm_calls_concurrently(bare_system: tuple[LocalStack, System]) -> None:
    """An LLM-queue worker on the gevent pool (API.md: --pool gevent) overlaps slow LLM calls."""
    stack, system = bare_system
    stack.start_worker("steps", queues="pipeline,tools", pool="threads", concurrency=4)
    stack.start_worker("llm", queues="llm", pool="gevent", concurrency=50)
    # Given 20 turns whose LLM calls each take 1.5 s
    ids = [system.post_turn({"input": f"[[sleep:1500]] g{i}"}).json()["turn_id"] for i in range(20)]
    turns = [system.wait_turn(turn_id) for turn_id in ids]
    # Then all complete, every LLM call ran on the gevent worker, and many were in flight at once
    assert {turn["status"] for turn in turns} == {"completed"}
    calls = [s for t in ids for s in system.trace(t) if s["kind"] == "llm_call"]
    assert {s["worker"].split("@")[0] for s in calls} == {"llm"}
    intervals = [(_end(s) - s["duration_ms"] / 1000, _end(s)) for s in calls]
    most_at_once = max(sum(start <= t < end for start, end in intervals) for t, _ in intervals)
    assert most_at_once >= 5, f"at most {most_at_once} LLM calls were in flight together"


def _end(step: dict[str, object]) -> float:
    return datetime.fromisoformat(str(step["at"])).timestamp()


def test_aptix_worker_with_no_flags_runs_each_queue_group_on_its_own_pool(
    bare_system: tuple[LocalStack, System],
) -> None:
    """`aptix worker` alone: pipeline and tools on threads in one process, llm on gevent in another."""
    stack, system = bare_system
    group = stack.start_worker("nf", pool=None)
    log = group.log()
    assert "pipeline,tools on threads x2" in log and "llm on gevent x2000" in log
    # A turn with a server tool crosses both, the model call on the gevent process
    turn = system.run_turn({"input": f"[[call:get_current_time {{}}]] {uuid.uuid4().hex}"})
    assert turn["status"] == "completed", turn
    workers = {(s["step"], s["worker"].split("@")[0].split(".")[0].rstrip("0123456789"))
               for s in system.trace(turn["turn_id"]) if s.get("worker")}  # fmt: skip
    assert ("llm_call", "llm") in workers and ("execute_server_tools", "pipeline") in workers
    assert ("reasoner", "pipeline") in workers
    children = children_of(group.pid)
    assert len(children) == 2
    # When the supervisor is killed outright, its workers do not outlive it
    group.kill(signal.SIGKILL)
    wait_for(
        lambda: not any(alive(pid) for pid in children),
        what="the worker processes to exit with their aptix worker",
        seconds=30,
        interval=0.2,
    )
