"""The OpenAI face's files and batches on the in-process gateway (SQLite, fakeredis, a settable clock):
chunked storage and its limits, a batch's statuses, its expiry and the files rendered from its turns."""

from __future__ import annotations

import base64
import io
import json
from datetime import timedelta
from typing import Any

import pytest
from openai.types import Batch, FileObject
from sqlalchemy import select

from api_gateway.openai.batch_validation import MAX_ATTEMPTS
from api_gateway.openai.batch_view import batch_status
from api_gateway.openai.file_service import CHUNK_BYTES
from api_gateway.services.errors import InvalidRequest, NotFound
from shared.db import session_factory
from shared.db.openai_batches import OpenAIBatchRecord
from shared.db.tables import OpenAIFileChunkRow, OpenAIFileRow, WebhookDeliveryRow
from shared.db.turns import TurnOutcome
from shared.models.turn import PendingToolCall, TurnStatus, Usage
from tests.unit.fakes import CLIENT_TOOL_TIMEOUT_SECONDS, FIXED_NOW, ORG, USER, Gateway

_SECRET = "whsec_" + base64.b64encode(b"0123456789abcdef0123").decode()


def _line(custom_id: str, text: str = "hello", **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses", "body": {"input": text, **body}}


def _upload(gateway: Gateway, data: bytes, *, org: str = ORG) -> dict[str, Any]:
    service = gateway.wired.file_service
    created = service.upload(io.BytesIO(data), filename="in.jsonl", purpose="batch", expires_after=None, org_id=org)
    FileObject.model_validate(created)
    return created


def _jsonl(*lines: dict[str, Any]) -> bytes:
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def _create(gateway: Gateway, file_id: str, **fields: Any) -> dict[str, Any]:
    """Create a batch (it answers ``validating``), run its validation, and read it."""
    batch = _created(gateway, file_id, **fields)
    Batch.model_validate(batch)
    assert batch["status"] == "validating" and batch["request_counts"]["total"] == 0
    assert gateway.wired.openai_batch_jobs.drain() == 1
    return _get(gateway, batch["id"])


def _created(gateway: Gateway, file_id: str, **fields: Any) -> dict[str, Any]:
    """What the create answers (the batch ``validating``)."""
    body = {"input_file_id": file_id, "endpoint": "/v1/responses", "completion_window": "24h", **fields}
    return gateway.wired.openai_batch_service.create(body, org_id=ORG, user_id=USER, idempotency_key=None)


def _get(gateway: Gateway, batch_id: str) -> dict[str, Any]:
    """The batch as a read finds it, after the jobs that read started (writing its files) ran."""
    service = gateway.wired.openai_batch_service
    service.get(batch_id, org_id=ORG)
    gateway.wired.openai_batch_jobs.drain()
    batch = service.get(batch_id, org_id=ORG)
    Batch.model_validate(batch)
    return batch


def _content(gateway: Gateway, file_id: str) -> list[dict[str, Any]]:
    record = gateway.wired.file_service.get(file_id, org_id=ORG)
    assert record.batch_id is not None
    return [json.loads(line) for line in b"".join(gateway.wired.file_service.content(record)).splitlines()]


def _pause(gateway: Gateway, turn_id: str) -> None:
    """Leave the turn paused for client call ``call_1``, as the pipeline would."""
    outcome = TurnOutcome(
        status=TurnStatus.REQUIRES_CLIENT_TOOLS, mode="general", output_text=None,
        pending_tool_calls=[PendingToolCall(call_id="call_1", name="lookup", arguments="{}")], mode_changes=[],
        error=None, usage=Usage(), trace=[],
    )  # fmt: skip
    gateway.turns.commit(turn_id, outcome, transcript=[], snapshot={}, now=gateway.clock())


def test_an_upload_is_stored_in_chunks_and_read_back_whole() -> None:
    gateway = Gateway()
    data = _jsonl(*(_line(f"r{index}", "x" * 1000) for index in range(2600)))
    assert len(data) > 2 * CHUNK_BYTES

    created = _upload(gateway, data)

    assert created["bytes"] == len(data)
    record = gateway.wired.file_service.get(created["id"], org_id=ORG)
    assert record.lines == 2600
    assert b"".join(gateway.wired.file_service.content(record)) == data
    with session_factory(gateway.wired.engine)() as orm:
        sizes = [len(chunk) for chunk in orm.scalars(select(OpenAIFileChunkRow.data))]
    assert len(sizes) == 3 and max(sizes) == CHUNK_BYTES


@pytest.mark.parametrize(
    ("settings", "code"),
    [({"openai_max_file_bytes": 100}, "file_too_large"), ({"openai_max_file_lines": 2}, "too_many_lines")],
)
def test_a_file_over_a_limit_is_refused_and_nothing_of_it_is_kept(settings: dict[str, int], code: str) -> None:
    gateway = Gateway(**settings)

    with pytest.raises(InvalidRequest) as refused:
        _upload(gateway, _jsonl(_line("a"), _line("b"), _line("c")))

    assert refused.value.code == code
    with session_factory(gateway.wired.engine)() as orm:
        assert orm.scalars(select(OpenAIFileRow)).all() == []
        assert orm.scalars(select(OpenAIFileChunkRow)).all() == []


def test_a_last_line_without_a_line_break_counts_and_blank_lines_do_not() -> None:
    gateway = Gateway(openai_max_file_lines=2)
    created = _upload(gateway, b"\n  \n" + json.dumps(_line("a")).encode() + b"\n\n" + json.dumps(_line("b")).encode())
    assert gateway.wired.file_service.get(created["id"], org_id=ORG).lines == 2


def test_another_organisations_file_and_an_expired_one_are_not_found() -> None:
    gateway = Gateway()
    created = _upload(gateway, _jsonl(_line("a")))

    with pytest.raises(NotFound):
        gateway.wired.file_service.get(created["id"], org_id="org_other")
    gateway.clock.now = FIXED_NOW + timedelta(days=31)
    with pytest.raises(NotFound):
        gateway.wired.file_service.get(created["id"], org_id=ORG)
    assert gateway.wired.file_service.delete_expired() == 1


def test_a_valid_file_becomes_one_aptix_batch_of_queued_turns_of_the_openai_face() -> None:
    gateway = Gateway()
    source = _upload(gateway, _jsonl(_line("a", "one"), _line("b", "two", instructions="Short.")))

    batch = _create(gateway, source["id"], metadata={"k": "v"})

    assert batch["status"] == "in_progress" and batch["request_counts"] == {"total": 2, "completed": 0, "failed": 0}
    aptix = gateway.batches.progress(batch["id"], org_id=ORG)
    assert aptix.total == 2 and aptix.counts[TurnStatus.QUEUED] == 2
    turns = list(gateway.batches.turns(batch["id"]))
    extras = [turn.request["extras"] for turn in turns]
    assert [e["custom_id"] for e in extras] == ["a", "b"] and all(e["face"] == "openai" for e in extras)
    assert extras[1]["instructions"] == "Short." and extras[1]["echo"]["instructions"] == "Short."
    assert gateway.held() == 2 and gateway.broker.sent == []  # waiting for fair admission, as any batch turn


def test_a_batch_past_its_window_expires_its_unfinished_requests_batch_expired() -> None:
    # Given a batch of two requests, one of which completed, with webhooks on
    gateway = Gateway(webhook_secrets=f"{ORG}:{_SECRET}", webhook_default_urls=f"{ORG}:https://hooks.example.com/in")
    batch = _create(gateway, _upload(gateway, _jsonl(_line("done"), _line("late")))["id"])
    done, _late = list(gateway.batches.turns(batch["id"]))
    gateway.service.cancel(done.turn_id, org_id=ORG)  # stands in for any end; it is not the batch's doing
    assert _get(gateway, batch["id"])["status"] == "in_progress"

    # When the clock passes expires_at and the batch is read
    gateway.clock.now = FIXED_NOW + timedelta(days=1, seconds=1)
    expired = _get(gateway, batch["id"])

    # Then it expired, its late request is batch_expired in the error file, and batch.expired was recorded once
    assert expired["status"] == "expired" and expired["expired_at"] == expired["expires_at"]
    Batch.model_validate(expired)
    lines = {line["custom_id"]: line for line in _content(gateway, expired["error_file_id"])}
    assert lines["late"]["error"]["code"] == "batch_expired" and set(lines) == {"done", "late"}
    assert lines["done"]["error"]["code"] == "cancelled"  # on its own, before the batch expired
    assert expired["output_file_id"] is None
    with session_factory(gateway.wired.engine)() as orm:
        events = orm.scalars(select(WebhookDeliveryRow).where(WebhookDeliveryRow.batch_id == batch["id"])).all()
    assert [event.event_type for event in events] == ["batch.expired"]
    assert json.loads(events[0].body)["data"] == {"id": batch["id"]}


def test_an_ended_batchs_files_are_written_once_and_hold_what_they_held_at_its_end() -> None:
    # Given a batch of two requests: one the client cancels, one paused for a client tool
    gateway = Gateway()
    batch = _create(gateway, _upload(gateway, _jsonl(_line("gone"), _line("paused")))["id"])
    gone, paused = list(gateway.batches.turns(batch["id"]))
    gateway.service.cancel(gone.turn_id, org_id=ORG)
    _pause(gateway, paused.turn_id)

    # When the batch is read ended, its files written, and the paused request later times out
    ended = _get(gateway, batch["id"])
    assert ended["status"] == "completed" and ended["request_counts"] == {"total": 2, "completed": 1, "failed": 1}
    gateway.clock.now = FIXED_NOW + timedelta(seconds=CLIENT_TOOL_TIMEOUT_SECONDS + 1)
    assert gateway.service.expire_overdue() == 1

    # Then each file still holds what it held at the end, its bytes those of its content, and the counts agree
    after = _get(gateway, batch["id"])
    assert after["request_counts"] == ended["request_counts"] and after["completed_at"] == ended["completed_at"]
    for file_id, custom_id in ((after["output_file_id"], "paused"), (after["error_file_id"], "gone")):
        record = gateway.wired.file_service.get(file_id, org_id=ORG)
        content = b"".join(gateway.wired.file_service.content(record))
        assert record.bytes == len(content) and record.lines == 1 and record.purpose == "batch_output"
        assert json.loads(content)["custom_id"] == custom_id
    assert _content(gateway, after["output_file_id"])[0]["response"]["body"]["output"][-1]["type"] == "function_call"
    assert _content(gateway, after["error_file_id"])[0]["error"]["code"] == "cancelled"


def test_a_batch_cancelled_while_validating_records_no_request_and_ends_cancelled() -> None:
    gateway = Gateway(webhook_secrets=f"{ORG}:{_SECRET}", webhook_default_urls=f"{ORG}:https://hooks.example.com/in")
    service = gateway.wired.openai_batch_service
    created = _created(gateway, _upload(gateway, _jsonl(_line("a")))["id"])

    cancelling = service.cancel(created["id"], org_id=ORG)
    assert cancelling["status"] == "cancelling" and cancelling["cancelling_at"] is not None
    gateway.wired.openai_batch_jobs.drain()

    cancelled = _get(gateway, created["id"])
    assert cancelled["status"] == "cancelled" and cancelled["cancelled_at"] is not None
    assert cancelled["output_file_id"] is None and cancelled["error_file_id"] is None
    assert list(gateway.batches.turns(created["id"])) == []
    with session_factory(gateway.wired.engine)() as orm:
        events = orm.scalars(select(WebhookDeliveryRow).where(WebhookDeliveryRow.batch_id == created["id"])).all()
    assert [event.event_type for event in events] == ["batch.cancelled"]


def test_a_validation_whose_gateway_stopped_is_taken_up_again_once_its_lease_ran_out() -> None:
    # Given a batch whose validation a gateway claimed, then stopped (its lease held, nothing recorded)
    gateway = Gateway(openai_batch_job_lease_seconds=30)
    created = _created(gateway, _upload(gateway, _jsonl(_line("a"), _line("b")))["id"])
    repository = gateway.wired.openai_batch_service._batches
    assert repository.claim(created["id"], token="dead", now=FIXED_NOW, until=FIXED_NOW + timedelta(seconds=30))

    # When another gateway polls, before and after the lease ran out
    assert gateway.wired.openai_batch_jobs.drain() == 0
    gateway.clock.now = FIXED_NOW + timedelta(seconds=31)
    assert gateway.wired.openai_batch_jobs.drain() == 1

    # Then the batch was validated once and runs
    batch = _get(gateway, created["id"])
    assert batch["status"] == "in_progress" and batch["request_counts"]["total"] == 2
    assert gateway.batches.progress(created["id"], org_id=ORG).total == 2


def test_a_validation_interrupted_again_and_again_fails_the_batch_validation_interrupted() -> None:
    gateway = Gateway()
    created = _created(gateway, _upload(gateway, _jsonl(_line("a")))["id"])
    repository = gateway.wired.openai_batch_service._batches
    for attempt in range(MAX_ATTEMPTS):  # each holder stops with its lease held
        now = FIXED_NOW + timedelta(minutes=attempt)
        assert repository.claim(created["id"], token=f"dead{attempt}", now=now, until=now + timedelta(seconds=1))
    gateway.clock.now = FIXED_NOW + timedelta(hours=1)

    assert gateway.wired.openai_batch_jobs.drain() == 1

    failed = _get(gateway, created["id"])
    assert failed["status"] == "failed" and failed["errors"]["data"][0]["code"] == "validation_interrupted"
    assert list(gateway.batches.turns(created["id"])) == []


@pytest.mark.parametrize(
    ("moving", "expired", "cancelling", "finished", "status"),
    [
        (True, False, False, False, "in_progress"),
        (True, False, True, False, "cancelling"),
        (True, True, False, False, "finalizing"),
        (False, False, False, False, "finalizing"),
        (False, False, False, True, "completed"),
        (False, False, True, True, "cancelled"),
        (False, True, True, True, "expired"),
    ],
)
def test_the_status_of_a_running_batch_follows_its_turns_then_its_files(
    moving: bool, expired: bool, cancelling: bool, finished: bool, status: str
) -> None:
    record = OpenAIBatchRecord(
        batch_id="batch_x", org_id=ORG, user_id=USER, input_file_id="file-x", endpoint="/v1/responses",
        completion_window="24h", client_metadata=None, output_expires_seconds=None, webhook_url=None,
        idempotency_key=None, request_hash="h", created_at=FIXED_NOW, expires_at=FIXED_NOW,
        in_progress_at=FIXED_NOW, expired_at=FIXED_NOW if expired else None,
        finished_at=FIXED_NOW if finished else None,
    )  # fmt: skip
    counts = dict.fromkeys(TurnStatus, 0)
    counts[TurnStatus.RUNNING if moving else TurnStatus.REQUIRES_CLIENT_TOOLS] = 1

    assert batch_status(record, counts, cancelling=cancelling) == status
