"""Batches: many turns through the same pipeline, progress counts, JSON Lines results, priorities."""

from __future__ import annotations

import json
import re
import time
import uuid
from typing import Any

import pytest

from tests.conftest import KEY_B
from tests.integration.conftest import OPEN_FILE, System
from tests.integration.events import TaskEventRecorder
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def _submit(system: System, requests: list[dict[str, Any]], *, key: str | None = None) -> Any:
    headers = system.headers(key) if key else system.headers()
    return system.http.post("/v1/batches", json={"requests": requests}, headers=headers)


def _batch(system: System, batch_id: str) -> dict[str, Any]:
    batch: dict[str, Any] = system.http.get(f"/v1/batches/{batch_id}", headers=system.headers()).json()
    return batch


def _counts(system: System, batch_id: str) -> dict[str, int]:
    counts: dict[str, int] = _batch(system, batch_id)["counts"]
    return counts


def _wait_batch(system: System, batch_id: str, *, seconds: float = 180) -> dict[str, Any]:
    def finished() -> dict[str, Any] | None:
        batch = _batch(system, batch_id)
        return batch if batch["counts"]["queued"] + batch["counts"]["running"] == 0 else None

    return wait_for(finished, what=f"batch {batch_id} to finish", seconds=seconds, interval=0.5)


def test_batch_of_200_turns_completes_with_right_counts_and_results(system: System) -> None:
    # Given 200 requests
    marker = uuid.uuid4().hex[:8]
    requests = [{"input": f"item {i} {marker}"} for i in range(200)]
    # When they are submitted as one batch
    response = _submit(system, requests)
    assert response.status_code == 202, response.text
    batch = response.json()
    assert batch["total"] == 200 and sum(batch["counts"].values()) == 200
    # Then every turn completes, the counts say so, and the results come back in request order
    done = _wait_batch(system, batch["batch_id"])
    assert done["counts"] == {
        "queued": 0, "running": 0, "requires_client_tools": 0, "completed": 200, "failed": 0, "cancelled": 0
    }  # fmt: skip
    results = system.http.get(f"/v1/batches/{batch['batch_id']}/results", headers=system.headers())
    assert results.status_code == 200
    assert results.headers["content-type"] == "application/jsonl"  # as docs/api.md and /openapi.json say
    lines = [json.loads(line) for line in results.text.splitlines()]
    assert [turn["output_text"] for turn in lines] == [f"Echo: item {i} {marker}" for i in range(200)]
    assert {turn["batch_id"] for turn in lines} == {batch["batch_id"]}
    assert len({turn["session_id"] for turn in lines}) == 200


def test_batch_counts_failed_and_paused_turns_by_status(system: System) -> None:
    requests = [
        {"input": "fine"},
        {"input": "[[call:format_disk {}]]"},
        {"input": '[[call:open_file {"path": "a"}]]', "tools": [OPEN_FILE]},
    ]
    batch = _submit(system, requests).json()
    done = _wait_batch(system, batch["batch_id"])
    assert (done["counts"]["completed"], done["counts"]["failed"], done["counts"]["requires_client_tools"]) == (1, 1, 1)


def test_interactive_turn_does_not_wait_for_a_large_batch(system: System, task_events: TaskEventRecorder) -> None:
    # Given a large batch whose turns each take a while at the model, already being worked on
    requests = [{"input": f"[[sleep:40]] bulk {i}"} for i in range(400)]
    batch = _submit(system, requests).json()
    wait_for(
        lambda: _counts(system, batch["batch_id"])["queued"] < len(requests), what="the batch's first turns to start"
    )
    # When an interactive turn arrives
    submitted = time.time()
    turn = system.run_turn({"input": f"interactive {uuid.uuid4().hex[:8]}"})
    progress = system.http.get(f"/v1/batches/{batch['batch_id']}", headers=system.headers()).json()["counts"]
    # Then it completes while most of the batch is unfinished, and its first step jumped the queue:
    # hardly any batch turn started between its submission and its own start
    assert turn["status"] == "completed"
    assert progress["queued"] + progress["running"] > 200, progress
    started = _starts(task_events)
    interactive_start = started[turn["turn_id"]]
    overtaken_by = [t for tid, t in started.items() if tid != turn["turn_id"] and submitted <= t < interactive_start]
    assert len(overtaken_by) < 20, f"{len(overtaken_by)} batch turns started before the interactive one"
    _wait_batch(system, batch["batch_id"], seconds=300)


def _starts(task_events: TaskEventRecorder) -> dict[str, float]:
    """turn_id -> when its entry task started (worker clock)."""
    received = {
        e["uuid"]: str(e.get("args", ""))
        for e in task_events.events()
        if e["type"] == "task-received" and e.get("name") == "aptix.step.entry"
    }
    starts: dict[str, float] = {}
    for event in task_events.events():
        if event["type"] == "task-started" and event["uuid"] in received:
            found = re.search(r"turn_[0-9a-f]{32}", received[event["uuid"]])
            if found:
                starts.setdefault(found.group(0), float(event["timestamp"]))
    return starts


@pytest.mark.parametrize(
    ("requests", "message"),
    [
        ([{"input": "a"}, {"input": "b", "mode": "no-such-mode"}], "unknown mode"),
        ([{"input": "a", "tools": [{"type": "function", "name": "get_current_time"}]}], "server tool"),
        ([{"input": "a", "idempotency_key": "k"}, {"input": "b", "idempotency_key": "k"}], "same idempotency_key"),
        ([], "at least 1"),
        ([{"input": ""}], "at least 1 character"),
    ],
)
def test_invalid_batch_is_422_and_records_nothing(system: System, requests: list[Any], message: str) -> None:
    before = system.http.get("/v1/modes", headers=system.headers())
    assert before.status_code == 200
    response = _submit(system, requests)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and message in error["message"]


def test_batch_repeating_a_session_is_422(system: System) -> None:
    first = system.run_turn({"input": "seed"})
    requests = [{"session_id": first["session_id"], "input": "a"}, {"session_id": first["session_id"], "input": "b"}]
    response = _submit(system, requests)
    assert response.status_code == 422
    assert "same session" in response.json()["error"]["message"]


def test_batch_over_the_maximum_is_422(system: System) -> None:
    response = _submit(system, [{"input": "x"}] * 1001)
    assert response.status_code == 422
    assert "APTIX_MAX_BATCH_REQUESTS" in response.json()["error"]["message"]


def test_another_orgs_batch_is_404(system: System) -> None:
    batch = _submit(system, [{"input": "mine"}]).json()
    for path in (f"/v1/batches/{batch['batch_id']}", f"/v1/batches/{batch['batch_id']}/results"):
        response = system.http.get(path, headers=system.headers(KEY_B))
        assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"
    assert system.http.get("/v1/batches/batch_nope", headers=system.headers()).status_code == 404
    _wait_batch(system, batch["batch_id"])
