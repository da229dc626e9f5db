"""The Files and Batch APIs of the OpenAI face, driven by the official ``openai`` SDK against a real gateway
and worker: upload, create, poll, download the output and join it back by ``custom_id``."""

from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import openai
import pytest
from openai.types import Batch, FileObject
from openai.types.responses import Response
from sqlalchemy import Engine, select

from shared.db.tables import OpenAIBatchRow
from tests.conftest import KEY_A, KEY_B
from tests.integration.conftest import OPEN_FILE, System
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

_ENDED = ("completed", "failed", "expired", "cancelled")


@pytest.fixture
def client(system: System) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=system.gateway_url + "/openai/v1", api_key=KEY_A, max_retries=0) as sdk:
        yield sdk


@pytest.fixture
def other_client(system: System) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=system.gateway_url + "/openai/v1", api_key=KEY_B, max_retries=0) as sdk:
        yield sdk


def _line(custom_id: str, text: str, **body: Any) -> dict[str, Any]:
    return {"custom_id": custom_id, "method": "POST", "url": "/v1/responses",
            "body": {"model": "scripted-model", "input": text, **body}}  # fmt: skip


def _jsonl(lines: list[Any]) -> bytes:
    return b"".join((line if isinstance(line, bytes) else json.dumps(line).encode()) + b"\n" for line in lines)


def _upload(client: openai.OpenAI, lines: list[Any], **kwargs: Any) -> FileObject:
    created = client.files.create(file=("requests.jsonl", io.BytesIO(_jsonl(lines))), purpose="batch", **kwargs)
    return FileObject.model_validate(created.model_dump(mode="json"))


def _create(client: openai.OpenAI, file_id: str, **kwargs: Any) -> Batch:
    batch = client.batches.create(input_file_id=file_id, endpoint="/v1/responses", completion_window="24h", **kwargs)
    return _strict(batch)


def _strict(batch: Batch) -> Batch:
    """The raw body validates as the SDK's Batch (the SDK's own parse is lenient)."""
    return Batch.model_validate(batch.model_dump(mode="json"))


def _ended(client: openai.OpenAI, batch_id: str, *, seconds: float = 90) -> Batch:
    return _reaches(client, batch_id, _ENDED, seconds=seconds)


def _reaches(client: openai.OpenAI, batch_id: str, statuses: tuple[str, ...], *, seconds: float = 90) -> Batch:
    def done() -> Batch | None:
        found = client.batches.retrieve(batch_id)
        return found if found.status in statuses else None

    return _strict(wait_for(done, what=f"batch {batch_id} to be {'/'.join(statuses)}", seconds=seconds))


def _lines(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    FileObject.model_validate(client.files.retrieve(file_id).model_dump(mode="json"))
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def _tag() -> str:
    return uuid.uuid4().hex[:10]


def test_a_batch_runs_to_completed_and_its_output_joins_back_by_custom_id(
    client: openai.OpenAI, system: System
) -> None:
    # Given a file of plain requests, one that pauses for a function tool and one the model refuses
    tag = _tag()
    tool = {"type": "function", "name": "open_file", "parameters": OPEN_FILE["parameters"], "strict": False}
    lines = [_line(f"plain-{index}", f"batch {tag} {index}", instructions="Be brief.") for index in range(8)]
    lines.append(_line("paused", f'batch {tag} [[call:open_file {{"path": "b.txt"}}]]', tools=[tool]))
    lines.append(_line("refused", f"batch {tag} [[fail:400]]"))
    source = _upload(client, lines)
    assert source.purpose == "batch" and source.bytes == len(_jsonl(lines))

    # When a batch is created on it and polled until it ends
    created = _create(client, source.id, metadata={"run": tag})
    assert created.status == "validating" and created.metadata == {"run": tag}
    assert created.expires_at is not None and created.expires_at - created.created_at == 86_400
    batch = _ended(client, created.id)

    # Then it completed and every request is answered exactly once, in the output or the error file
    assert batch.status == "completed"
    assert batch.request_counts is not None and batch.request_counts.total == 10
    assert (batch.request_counts.completed, batch.request_counts.failed) == (9, 1)
    assert batch.in_progress_at is not None and batch.completed_at is not None and batch.finalizing_at is not None
    assert batch.usage is not None and batch.usage.total_tokens > 0
    output, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    answered = [line["custom_id"] for line in output + errors]
    assert sorted(answered) == sorted(line["custom_id"] for line in lines)
    by_id = {line["custom_id"]: line for line in output}
    for index in range(8):
        line = by_id[f"plain-{index}"]
        assert line["error"] is None and line["response"]["status_code"] == 200
        response = Response.model_validate(line["response"]["body"])
        assert response.status == "completed" and response.output_text == f"Echo: batch {tag} {index}"
        assert response.instructions == "Be brief."
    paused = Response.model_validate(by_id["paused"]["response"]["body"])
    assert paused.status == "completed" and paused.output[-1].type == "function_call"
    (refused,) = errors
    assert refused["custom_id"] == "refused" and refused["response"]["status_code"] >= 400
    assert set(refused["response"]["body"]["error"]) == {"message", "type", "param", "code"}
    # And the output file is a file of its own, and the model saw each request once
    out = client.files.retrieve(str(batch.output_file_id))
    assert out.purpose == "batch_output" and out.bytes == len(client.files.content(out.id).content)
    assert len(system.llm_requests(f"batch {tag} 3")) == 1


def test_a_file_is_listed_read_back_and_deleted(client: openai.OpenAI) -> None:
    # Given two uploads, one with an expiry of its own
    first = _upload(client, [_line("a", "files one")])
    second = _upload(client, [_line("b", "files two")], expires_after={"anchor": "created_at", "seconds": 3600})
    assert second.expires_at == second.created_at + 3600
    assert first.expires_at == first.created_at + 30 * 86_400

    # When the files are listed a page of one at a time, newest first
    page = client.files.list(purpose="batch", limit=1)
    assert [item.id for item in page.data] == [second.id] and page.has_more
    following = client.files.list(purpose="batch", limit=1, after=second.id)
    assert [item.id for item in following.data] == [first.id]

    # Then each reads back as uploaded, and a deleted one is gone
    assert client.files.retrieve(first.id).id == first.id
    assert client.files.content(first.id).content == _jsonl([_line("a", "files one")])
    deleted = client.files.delete(first.id)
    assert deleted.deleted is True and deleted.id == first.id
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        client.files.content(first.id)


def test_a_file_of_another_purpose_is_refused_naming_it(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.files.create(file=("a.jsonl", io.BytesIO(b"{}\n")), purpose="fine-tune")
    assert refused.value.param == "purpose"


def test_an_invalid_file_fails_the_batch_naming_each_bad_line_and_runs_nothing(
    client: openai.OpenAI, system: System
) -> None:
    # Given a file with one valid line and one of each kind of bad line
    tag = _tag()
    lines: list[Any] = [
        _line("ok", f"invalid {tag} valid line"),
        b'{"custom_id": "broken", ',
        _line("ok", f"invalid {tag} again"),
        {**_line("url", "x"), "url": "/v1/chat/completions"},
        {**_line("method", "x"), "method": "GET"},
        _line("body", "x", frobnicate=True),
        {"method": "POST", "url": "/v1/responses", "body": {"input": "x"}},
        b"",
        _line("model", "x", model="no-such-model"),
    ]
    source = _upload(client, lines)

    # When a batch is created on it
    batch = _ended(client, _create(client, source.id).id)

    # Then it failed with each bad line named (1-based, blank lines counted), and nothing ran
    assert batch.status == "failed" and batch.failed_at is not None and batch.errors is not None
    found = [(error.line, error.code, error.param) for error in batch.errors.data or []]
    assert found == [
        (2, "invalid_json_line", None),
        (3, "duplicate_custom_id", "custom_id"),
        (4, "invalid_url", "url"),
        (5, "invalid_method", "method"),
        (6, "unknown_parameter", "body.frobnicate"),
        (7, "missing_custom_id", "custom_id"),
        (9, "model_not_found", "body.model"),
    ]
    assert batch.output_file_id is None and batch.error_file_id is None
    assert system.llm_requests(f"invalid {tag}") == []
    assert client.batches.retrieve(batch.id).status == "failed"


def test_an_endpoint_other_than_responses_is_a_400_naming_it(client: openai.OpenAI) -> None:
    source = _upload(client, [_line("a", "endpoint")])
    with pytest.raises(openai.BadRequestError) as refused:
        client.batches.create(input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h")
    assert refused.value.param == "endpoint" and "/v1/chat/completions" in refused.value.message


def test_a_cancelled_batch_ends_cancelled_with_every_request_in_one_file(client: openai.OpenAI) -> None:
    # Given a batch of slow requests, more than the worker runs at once
    tag = _tag()
    lines = [_line(f"slow-{index}", f"cancel {tag} {index} [[sleep:700]]") for index in range(16)]
    created = _reaches(client, _create(client, _upload(client, lines).id).id, ("in_progress",))

    # When it is cancelled while it runs
    cancelling = _strict(client.batches.cancel(created.id))
    assert cancelling.status in ("cancelling", "cancelled") and cancelling.cancelling_at is not None

    # Then it ends cancelled: the requests not started are in the error file, each request in one file once
    batch = _ended(client, created.id)
    assert batch.status == "cancelled" and batch.cancelled_at is not None
    output, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(line["custom_id"] for line in lines)
    assert errors and all(line["error"]["code"] == "batch_cancelled" for line in errors)
    assert batch.request_counts is not None and batch.request_counts.failed == len(errors)


def test_a_batch_past_its_window_expires_and_its_unfinished_requests_are_batch_expired(
    system: System, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    # Given a gateway whose completion window lasts 2 seconds, and a batch that needs longer
    url = extra_gateway({"APTIX_OPENAI_BATCH_WINDOW_SECONDS": "2"})
    tag = _tag()
    lines = [_line(f"slow-{index}", f"expire {tag} {index} [[sleep:800]]") for index in range(16)]
    with openai.OpenAI(base_url=url + "/openai/v1", api_key=KEY_A, max_retries=0) as client:
        created = _create(client, _upload(client, lines).id)
        assert created.expires_at == created.created_at + 2

        # When its window runs out
        batch = _ended(client, created.id, seconds=60)

        # Then it expired, and each unfinished request is in the error file as batch_expired
        assert batch.status == "expired" and batch.expired_at is not None
        output, errors = _lines(client, batch.output_file_id), _lines(client, batch.error_file_id)
    assert sorted(line["custom_id"] for line in output + errors) == sorted(line["custom_id"] for line in lines)
    assert errors and all(line["error"]["code"] == "batch_expired" for line in errors)


def test_another_organisations_file_and_batch_are_404s(client: openai.OpenAI, other_client: openai.OpenAI) -> None:
    source = _upload(client, [_line("a", "theirs")])
    batch = _create(client, source.id)
    for attempt in (
        lambda: other_client.files.retrieve(source.id),
        lambda: other_client.files.content(source.id),
        lambda: other_client.files.delete(source.id),
        lambda: other_client.batches.retrieve(batch.id),
        lambda: other_client.batches.cancel(batch.id),
        lambda: other_client.batches.create(input_file_id=source.id, endpoint="/v1/responses", completion_window="24h"),
    ):
        with pytest.raises(openai.NotFoundError):
            attempt()
    assert source.id not in [item.id for item in other_client.files.list()]
    assert client.files.retrieve(source.id).id == source.id


def test_batches_are_listed_newest_first_in_pages(client: openai.OpenAI) -> None:
    source = _upload(client, [_line("a", "listing")])
    ids = [_create(client, source.id).id for _ in range(3)]
    time.sleep(0.01)

    first = client.batches.list(limit=2)
    assert [batch.id for batch in first.data] == ids[::-1][:2] and first.has_more
    second = client.batches.list(limit=2, after=first.data[-1].id)
    assert second.data[0].id == ids[0]
    for batch in first.data + second.data:
        _strict(batch)


def test_a_retried_create_with_the_same_idempotency_key_answers_the_same_batch(client: openai.OpenAI) -> None:
    source = _upload(client, [_line("a", "idempotent create")])
    key = f"key-{_tag()}"
    first = _create(client, source.id, extra_headers={"Idempotency-Key": key})
    again = _create(client, source.id, extra_headers={"Idempotency-Key": key})
    assert again.id == first.id
    with pytest.raises(openai.ConflictError):
        _create(client, source.id, metadata={"other": "body"}, extra_headers={"Idempotency-Key": key})


def test_a_validation_whose_gateway_is_killed_is_taken_up_by_another_gateway_promptly(
    system: System, client: openai.OpenAI, engine: Engine, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    # Given a gateway whose batch jobs hold a 2-second lease, validating a long file whose last line is bad
    url = extra_gateway({"APTIX_OPENAI_BATCH_JOB_LEASE_SECONDS": "2"})
    (doomed,) = [process for process in system.stack.processes if process.name == f"gateway-{url.rsplit(':', 1)[1]}"]
    tag = _tag()
    lines: list[Any] = [_line(f"r{index}", f"killed {tag} {index}") for index in range(6000)]
    lines.append({**_line("last", "x"), "method": "GET"})
    with openai.OpenAI(base_url=url + "/openai/v1", api_key=KEY_A, max_retries=0) as doomed_client:
        created = _create(doomed_client, _upload(doomed_client, lines).id)
    assert created.status == "validating"

    # When that gateway is killed while it validates (it holds the job, nothing recorded yet)
    def claimed() -> bool:
        with engine.connect() as db:
            row = db.execute(
                select(OpenAIBatchRow.job_token, OpenAIBatchRow.failed_at).where(OpenAIBatchRow.batch_id == created.id)
            ).one()
        assert row.failed_at is None, "the validation ended before the gateway could be killed"
        return row.job_token is not None

    wait_for(claimed, what="the gateway to take up the validation", seconds=30)
    doomed.kill()
    killed_at = time.monotonic()

    # Then another gateway takes the validation up once the lease ran out and ends it: failed naming line 6001
    batch = _ended(client, created.id, seconds=60)
    assert time.monotonic() - killed_at < 45
    assert batch.status == "failed" and batch.errors is not None
    assert [(error.line, error.code) for error in batch.errors.data or []] == [(6001, "invalid_method")]
    with engine.connect() as db:
        attempts = db.scalar(select(OpenAIBatchRow.job_attempts).where(OpenAIBatchRow.batch_id == created.id))
    assert attempts == 2
    assert system.llm_requests(f"killed {tag}") == []
