"""Batches as OpenAI Batch API users know them: idempotency keys, cancel, and the organisation's list."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from sqlalchemy import Engine, func, select

from shared.db.tables import BatchRow, TurnRow
from tests.conftest import API_KEYS, KEY_B
from tests.integration.conftest import System
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def _marker() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def _post(system: System, body: dict[str, Any], *, key: str | None = None, **params: str) -> httpx.Response:
    headers = system.headers(key) if key else system.headers()
    return system.http.post("/v1/batches", json=body, headers=headers, params=params)


def _batch(system: System, batch_id: str) -> dict[str, Any]:
    response = system.http.get(f"/v1/batches/{batch_id}", headers=system.headers())
    assert response.status_code == 200, response.text
    batch: dict[str, Any] = response.json()
    return batch


def _cancel(system: System, batch_id: str, *, running: str | None = None, key: str | None = None) -> httpx.Response:
    headers = system.headers(key) if key else system.headers()
    body = {"running": running} if running else None
    return system.http.post(f"/v1/batches/{batch_id}/cancel", json=body, headers=headers)


def _ended(system: System, batch_id: str, *, seconds: float = 120) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        batch = _batch(system, batch_id)
        return batch if batch["status"] in ("completed", "cancelled") else None

    return wait_for(done, what=f"batch {batch_id} to end", seconds=seconds, interval=0.3)


def _results(system: System, batch_id: str) -> list[dict[str, Any]]:
    response = system.http.get(f"/v1/batches/{batch_id}/results", headers=system.headers())
    assert response.status_code == 200, response.text
    return [json.loads(line) for line in response.text.splitlines()]


def _turn_rows(engine: Engine, batch_id: str) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(select(func.count()).select_from(TurnRow).where(TurnRow.batch_id == batch_id)) or 0)


# --- idempotency -----------------------------------------------------------------------------------


def test_same_key_and_body_answer_the_same_batch_without_new_turns(system: System, engine: Engine) -> None:
    # Given a batch created with an idempotency key
    marker, key = _marker(), _marker()
    body = {"requests": [{"input": f"a {marker}"}, {"input": f"b {marker}"}], "idempotency_key": key}
    first = _post(system, body)
    assert first.status_code == 202, first.text
    # When the same POST is retried, with the key in the body or as the query parameter
    again = _post(system, body)
    by_query = _post(system, {"requests": body["requests"]}, idempotency_key=key)
    # Then both answer the same batch, and the batch still has its two turns only
    assert again.status_code == by_query.status_code == 202
    assert again.json()["batch_id"] == by_query.json()["batch_id"] == first.json()["batch_id"]
    assert _turn_rows(engine, first.json()["batch_id"]) == 2
    _ended(system, first.json()["batch_id"])
    assert len(system.llm_requests(marker)) == 2


def test_same_key_with_another_body_is_409(system: System) -> None:
    key = _marker()
    assert _post(system, {"requests": [{"input": "one"}], "idempotency_key": key}).status_code == 202
    response = _post(system, {"requests": [{"input": "another"}], "idempotency_key": key})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "idempotency_key_reused"


def test_concurrent_identical_posts_make_one_batch(system: System, engine: Engine) -> None:
    # Given eight clients about to send the same POST with one key
    key, marker = _marker(), _marker()
    body = {"requests": [{"input": f"c{i} {marker}"} for i in range(20)], "idempotency_key": key}
    start = threading.Barrier(8)
    answers: list[httpx.Response] = []

    def post() -> None:
        with httpx.Client(base_url=system.gateway_url, timeout=60) as client:
            start.wait()
            answers.append(client.post("/v1/batches", json=body, headers=system.headers()))

    threads = [threading.Thread(target=post) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    # Then every one gets the same batch, and only one batch with 20 turns exists
    assert [answer.status_code for answer in answers] == [202] * 8, [answer.text for answer in answers]
    assert len({answer.json()["batch_id"] for answer in answers}) == 1
    with engine.connect() as conn:
        batches = conn.scalar(select(func.count()).select_from(BatchRow).where(BatchRow.idempotency_key == key))
    assert batches == 1
    assert _turn_rows(engine, answers[0].json()["batch_id"]) == 20
    _ended(system, answers[0].json()["batch_id"])


def test_a_request_whose_key_names_an_earlier_turn_reuses_it(system: System, engine: Engine) -> None:
    # Given a turn started with its own idempotency key
    marker, key = _marker(), _marker()
    earlier = system.run_turn({"input": f"earlier {marker}", "idempotency_key": key})
    # When a batch carries the same request with that key, and a new one
    requests = [{"input": f"earlier {marker}", "idempotency_key": key}, {"input": f"new {marker}"}]
    response = _post(system, {"requests": requests})
    assert response.status_code == 202, response.text
    batch = response.json()
    # Then the earlier turn stands for the first request: one new turn only, both in counts and results
    assert (batch["total"], batch["reused"]) == (2, 1)
    assert _turn_rows(engine, batch["batch_id"]) == 1
    done = _ended(system, batch["batch_id"])
    assert done["counts"]["completed"] == 2
    results = _results(system, batch["batch_id"])
    assert results[0]["turn_id"] == earlier["turn_id"]
    assert results[1]["output_text"] == f"Echo: new {marker}"
    assert len(system.llm_requests(f"earlier {marker}")) == 1


def test_a_request_whose_key_names_a_different_turn_is_409_naming_it(system: System, engine: Engine) -> None:
    key = _marker()
    system.run_turn({"input": "the first request", "idempotency_key": key})
    requests = [{"input": "fine"}, {"input": "not the first request", "idempotency_key": key}]
    response = _post(system, {"requests": requests})
    assert response.status_code == 409
    error = response.json()["error"]
    assert error["code"] == "idempotency_key_reused" and "requests[1]" in error["message"]


def test_two_requests_sharing_a_key_are_422(system: System) -> None:
    key = _marker()
    requests = [{"input": "a", "idempotency_key": key}, {"input": "b", "idempotency_key": key}]
    response = _post(system, {"requests": requests})
    assert response.status_code == 422
    assert "same idempotency_key" in response.json()["error"]["message"]


# --- cancel ----------------------------------------------------------------------------------------


def _running_batch(system: System, marker: str, *, size: int = 16) -> dict[str, Any]:
    """A batch of slow turns, once some of them run (the worker takes four at a time) and most wait."""
    requests = [{"input": f"[[sleep:4000]] slow {i} {marker}"} for i in range(size)]
    batch: dict[str, Any] = _post(system, {"requests": requests}).json()
    wait_for(lambda: _batch(system, batch["batch_id"])["counts"]["running"] >= 1, what="a turn to start", seconds=60)
    return batch


def test_cancel_finish_cancels_queued_turns_and_lets_running_ones_complete(system: System) -> None:
    # Given a batch with turns running and turns queued
    marker = _marker()
    batch = _running_batch(system, marker)
    # When it is cancelled (running turns may finish)
    response = _cancel(system, batch["batch_id"])
    # Then it is cancelling while its running turns go on, and nothing is queued any more
    assert response.status_code == 200, response.text
    cancelling = response.json()
    assert cancelling["status"] == "cancelling" and cancelling["cancel_requested_at"] is not None
    assert cancelling["counts"]["queued"] == 0 and cancelling["counts"]["running"] >= 1
    # And cancelling again is fine meanwhile
    assert _cancel(system, batch["batch_id"]).json()["status"] in ("cancelling", "cancelled")
    # Then it ends cancelled: the running turns completed, the others were cancelled before reaching the model
    done = _ended(system, batch["batch_id"])
    assert done["status"] == "cancelled"
    completed, cancelled = done["counts"]["completed"], done["counts"]["cancelled"]
    assert completed >= 1 and cancelled >= 1 and completed + cancelled == 16
    assert len(system.llm_requests(marker)) == completed
    turns = _results(system, batch["batch_id"])
    assert {turn["error"]["code"] for turn in turns if turn["status"] == "cancelled"} == {"cancelled"}
    # And a batch none of whose turns is unfinished cannot be cancelled again
    again = _cancel(system, batch["batch_id"])
    assert again.status_code == 409 and again.json()["error"]["code"] == "batch_finished"


def test_cancel_cancel_also_cancels_running_turns(system: System) -> None:
    marker = _marker()
    batch = _running_batch(system, marker)
    response = _cancel(system, batch["batch_id"], running="cancel")
    assert response.status_code == 200, response.text
    assert response.json()["counts"]["queued"] == response.json()["counts"]["running"] == 0
    done = _ended(system, batch["batch_id"])
    assert done["status"] == "cancelled" and done["counts"]["cancelled"] == 16
    # The running turns' events end with turn.cancelled, as a single turn's cancel gives them
    first = _results(system, batch["batch_id"])[0]
    events = system.http.get(f"/v1/turns/{first['turn_id']}/events", headers=system.headers())
    assert "event: turn.cancelled" in events.text


def test_cancel_of_a_completed_batch_is_409_and_of_another_orgs_is_404(system: System) -> None:
    batch = _post(system, {"requests": [{"input": "quick"}]}).json()
    done = _ended(system, batch["batch_id"])
    assert done["status"] == "completed"
    finished = _cancel(system, batch["batch_id"])
    assert finished.status_code == 409 and finished.json()["error"]["code"] == "batch_finished"
    other = _cancel(system, batch["batch_id"], key=KEY_B)
    assert other.status_code == 404 and other.json()["error"]["code"] == "not_found"
    invalid = _cancel(system, batch["batch_id"], running="stop")
    assert invalid.status_code == 422


# --- list ------------------------------------------------------------------------------------------


@pytest.fixture
def org_c(system: System, extra_gateway: Callable[[dict[str, str]], str]) -> Iterator[tuple[httpx.Client, str]]:
    """A gateway that also knows a fresh organisation, and that organisation's key."""
    key = f"key-{uuid.uuid4().hex[:8]}"
    url = extra_gateway({"APTIX_API_KEYS": f"{API_KEYS},{key}:org-{key}:user-c"})
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client, key


def test_list_pages_an_orgs_batches_newest_first(system: System, org_c: tuple[httpx.Client, str]) -> None:
    # Given five batches of a fresh organisation, and one of another organisation
    client, key = org_c
    auth = {"Authorization": f"Bearer {key}"}
    created = [
        client.post("/v1/batches", json={"requests": [{"input": f"list {i}"}]}, headers=auth).json()["batch_id"]
        for i in range(5)
    ]
    mine = _post(system, {"requests": [{"input": "org a"}]}).json()["batch_id"]
    # When it lists them two at a time
    pages = []
    after = None
    while True:
        params: dict[str, Any] = {"limit": 2, **({"after": after} if after else {})}
        page = client.get("/v1/batches", params=params, headers=auth)
        assert page.status_code == 200, page.text
        pages.append(page.json())
        if not page.json()["has_more"]:
            break
        after = page.json()["last_id"]
    # Then it sees exactly its five, newest first, in pages of 2, 2 and 1, in the OpenAI list shape
    assert [len(page["data"]) for page in pages] == [2, 2, 1]
    listed = [batch["batch_id"] for page in pages for batch in page["data"]]
    assert listed == created[::-1] and mine not in listed
    assert pages[0]["object"] == "list" and pages[0]["first_id"] == created[-1] and pages[0]["last_id"] == created[-2]
    assert {"status", "counts", "total"} <= set(pages[0]["data"][0])
    # And the other organisation's list does not show them
    listed_a = system.http.get("/v1/batches", params={"limit": 100}, headers=system.headers()).json()["data"]
    assert mine in [batch["batch_id"] for batch in listed_a] and not set(created) & {b["batch_id"] for b in listed_a}


@pytest.mark.parametrize("params", [{"limit": 0}, {"limit": 101}, {"limit": "x"}, {"after": "batch_nope"}])
def test_list_with_bad_parameters_is_422(system: System, params: dict[str, Any]) -> None:
    response = system.http.get("/v1/batches", params=params, headers=system.headers())
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"


def test_list_after_another_orgs_batch_is_422(system: System) -> None:
    theirs = _post(system, {"requests": [{"input": "org b"}]}, key=KEY_B).json()["batch_id"]
    response = system.http.get("/v1/batches", params={"after": theirs}, headers=system.headers())
    assert response.status_code == 422
