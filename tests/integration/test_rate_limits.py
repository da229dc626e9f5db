"""Shared model rate limits across real worker processes: four ``aptix worker`` processes at
``APTIX_LLM_RPM=300`` against the scripted model, whose journal stamps each request's arrival.

The limiter's burst is :data:`workers.llm.limiter.BURST_SECONDS` (50 ms): calls are spaced 200 ms
apart at 300 a minute, so a one-second window holds at most 5 of them plus one that starts or ends
it; 6 is the most the test allows.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scripted_llm import ScriptedServer
from tests.integration.conftest import System, own_system
from tests.support.prometheus import scrape, total
from tests.support.waiting import wait_for
from workers.llm.limiter import limiter_keys

pytestmark = pytest.mark.integration

WORKERS = ("rl1", "rl2", "rl3", "rl4")
MODEL = "scripted-model"
"""``APTIX_LLM_MODEL`` of every test system (tests/integration/conftest.py)."""


@pytest.fixture(scope="module")
def limited_system(database_url: str, scripted_llm: ScriptedServer, modes_file: Path) -> Iterator[System]:
    """Four worker processes at 300 requests a minute, and a gateway, on a broker and state store of their own."""
    limit = {"APTIX_LLM_RPM": "300"}
    with own_system(database_url=database_url, llm=scripted_llm, modes_file=modes_file, env=limit) as (stack, system):
        for name in WORKERS:
            stack.start_worker(name)
        yield system


def _start(system: System, texts: list[str]) -> list[str]:
    turn_ids = []
    for text in texts:
        response = system.post_turn({"input": text})
        assert response.status_code == 202, response.text
        turn_ids.append(response.json()["turn_id"])
    return turn_ids


def _finish(system: System, turn_ids: list[str]) -> list[dict[str, Any]]:
    return [system.wait_turn(turn_id, seconds=90) for turn_id in turn_ids]


def _arrivals(system: System, marker: str) -> list[float]:
    return sorted(entry["at"] for entry in system.llm.requests(marker))


def _most_in_one_second(times: list[float]) -> int:
    """The most requests any window [t, t + 1 s) holds."""
    return max(sum(1 for other in times if start <= other < start + 1.0) for start in times)


def _model_workers(system: System, turn_ids: list[str]) -> set[str]:
    """The workers that made the model calls of these turns."""
    return {step["worker"] for turn_id in turn_ids for step in system.trace(turn_id) if step["kind"] == "llm_call"}


def test_four_workers_at_300_rpm_send_at_most_6_requests_in_any_second_and_every_turn_completes(
    limited_system: System,
) -> None:
    # Given four worker processes sharing a limit of 300 requests a minute (5 a second)
    marker = f"paced-{uuid.uuid4().hex[:8]}"

    # When 30 turns arrive at once
    turn_ids = _start(limited_system, [f"{marker} turn {index}" for index in range(30)])
    turns = _finish(limited_system, turn_ids)

    # Then every turn completes, their model calls were made by several workers, and the model never
    # saw more than 6 of them in one second
    assert [turn["status"] for turn in turns] == ["completed"] * 30, [t for t in turns if t["status"] != "completed"]
    assert len(_model_workers(limited_system, turn_ids)) >= 2
    arrivals = _arrivals(limited_system, marker)
    assert len(arrivals) == 30
    assert _most_in_one_second(arrivals) <= 6, arrivals


def test_a_429_with_retry_after_2_stops_every_workers_calls_to_the_model_for_2_seconds(
    limited_system: System,
) -> None:
    # Given a turn whose first model call is answered 429 with Retry-After: 2
    marker = f"paused-{uuid.uuid4().hex[:8]}"
    before = {name: scrape(url) for name, url in limited_system.stack.metrics_urls.items() if name in WORKERS}
    (first,) = _start(limited_system, [f"{marker} first [[fail:429:1]] [[retryafter:2]]"])
    rejected = wait_for(lambda: _arrivals(limited_system, marker), what="the request answered 429")[0]
    _, pause_key = limiter_keys(limited_system.llm.base_url, MODEL)
    pause_end = float(wait_for(lambda: limited_system.redis.get(pause_key), what="the model's pause in Redis"))

    # When twelve more turns arrive during the pause
    others = _start(limited_system, [f"{marker} other {index}" for index in range(12)])
    turns = _finish(limited_system, [first, *others])

    # Then the pause lasts the 2 s the server asked for, no request reached the model during it, and
    # every turn completes afterwards
    assert pause_end >= rejected + 2.0
    arrivals = _arrivals(limited_system, marker)
    assert len(arrivals) == 14  # the 429, its retry, the twelve others
    assert [at for at in arrivals[1:] if at < rejected + 2.0] == []
    assert [turn["status"] for turn in turns] == ["completed"] * 13

    # And the calls were held back by the pause on several workers, not only the one that got the 429
    paused = {
        name: total(scrape(url), "aptix_model_rate_limited_total", {"model": MODEL, "reason": "paused"})
        - total(before[name], "aptix_model_rate_limited_total", {"model": MODEL, "reason": "paused"})
        for name, url in limited_system.stack.metrics_urls.items()
        if name in WORKERS
    }
    assert sum(1 for held in paused.values() if held > 0) >= 2, paused
