"""Worker pools of API.md: an LLM-queue worker on gevent keeps many LLM calls in flight."""

from __future__ import annotations

import uuid

import pytest
import redis

pytestmark = pytest.mark.integration


def test_gevent_llm_worker_runs_llm_calls_concurrently(
    database_url: str, scripted_llm: object, modes_file: object
) -> None:
    """An LLM-queue worker on the gevent pool (API.md: --pool gevent) overlaps slow LLM calls."""
    from pathlib import Path

    from scripted_llm import ScriptedServer
    from tests.conftest import claim_redis_databases
    from tests.integration.conftest import redis_urls_base, start_system

    assert isinstance(scripted_llm, ScriptedServer) and isinstance(modes_file, Path)
    base = redis_urls_base()
    state_db, broker_db = claim_redis_databases(2, uuid.uuid4().hex)
    urls = (f"{base}/{state_db}", f"{base}/{broker_db}")
    stack, system = start_system(
        database_url=database_url, redis_urls=urls, llm=scripted_llm, modes_file=modes_file, workers=[]
    )
    try:
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
    finally:
        stack.stop_all()
        for url in urls:
            redis.Redis.from_url(url).flushdb()


def _end(step: dict[str, object]) -> float:
    from datetime import datetime

    return datetime.fromisoformat(str(step["at"])).timestamp()
