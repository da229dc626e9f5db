"""BatchService's idempotency, reused turns, cancel, list and JSON Lines staging, as ``connect_gateway`` wires
it on SQLite and fakeredis (tests.unit.fakes.Gateway): a batch's turns wait for admission, as in production.

The HTTP side, with real PostgreSQL, Redis and workers: tests/integration/test_batch_controls.py and
test_batch_uploads.py.
"""

from __future__ import annotations

import json
from datetime import timedelta

import pytest

from api_gateway.services import Conflict, InvalidRequest
from api_gateway.services.batch_upload import record_upload
from shared.models.batch import BatchRequest, BatchStatus, BatchTurnRequest
from shared.models.turn import TurnRequest, TurnStatus
from shared.state import MemoryStateStore
from tests.unit.fakes import ORG, USER, Gateway


def _body(*inputs: str, key: str | None = None) -> BatchRequest:
    return BatchRequest(requests=[BatchTurnRequest(input=text) for text in inputs], idempotency_key=key)


def _lines(*requests: dict[str, object] | str) -> list[bytes]:
    return [(item if isinstance(item, str) else json.dumps(item)).encode() + b"\n" for item in requests]


def test_same_key_and_body_replay_the_batch_and_queue_nothing_more(gateway: Gateway) -> None:
    first = gateway.batches.record(_body("a", "b", key="k1"), org_id=ORG, user_id=USER)
    held = gateway.held()

    again = gateway.batches.record(_body("a", "b", key="k1"), org_id=ORG, user_id=USER)

    assert again.batch_id == first.batch_id
    assert gateway.held() == held == 2 and gateway.broker.sent == []


def test_same_key_with_another_body_is_a_conflict(gateway: Gateway) -> None:
    gateway.batches.record(_body("a", key="k1"), org_id=ORG, user_id=USER)

    with pytest.raises(Conflict) as refused:
        gateway.batches.record(_body("b", key="k1"), org_id=ORG, user_id=USER)

    assert refused.value.code == "idempotency_key_reused"


def test_a_json_body_and_the_same_requests_uploaded_share_one_key(gateway: Gateway) -> None:
    first = gateway.batches.record(_body("a", "b", key="k1"), org_id=ORG, user_id=USER)

    uploaded = record_upload(
        gateway.batches, _lines({"input": "a"}, "", {"input": "b"}), org_id=ORG, user_id=USER, webhook_url=None,
        idempotency_key="k1", max_requests=10,
    )  # fmt: skip

    assert uploaded.batch_id == first.batch_id


def test_a_request_key_of_an_earlier_turn_reuses_it(gateway: Gateway) -> None:
    earlier = gateway.service.record(TurnRequest(input="x", idempotency_key="t1"), org_id=ORG, user_id=USER)
    body = BatchRequest(requests=[BatchTurnRequest(input="y"), BatchTurnRequest(input="x", idempotency_key="t1")])

    batch = gateway.batches.record(body, org_id=ORG, user_id=USER)

    assert (batch.total, batch.reused, batch.counts[TurnStatus.QUEUED]) == (2, 1, 2)
    assert [turn.turn_id for turn in gateway.batches.turns(batch.batch_id)][1] == earlier.turn_id
    assert len(gateway.broker.sent) == 1 and gateway.held() == 1  # the earlier turn was sent; the new one waits


def test_a_request_key_of_a_different_turn_is_a_conflict_naming_the_request(gateway: Gateway) -> None:
    gateway.service.record(TurnRequest(input="x", idempotency_key="t1"), org_id=ORG, user_id=USER)
    body = BatchRequest(requests=[BatchTurnRequest(input="y"), BatchTurnRequest(input="z", idempotency_key="t1")])

    with pytest.raises(Conflict) as refused:
        gateway.batches.record(body, org_id=ORG, user_id=USER)

    assert refused.value.code == "idempotency_key_reused" and "requests[1]" in refused.value.message


def test_cancel_finish_cancels_queued_turns_at_once_and_leaves_running_ones(gateway: Gateway) -> None:
    # Given a batch of three turns, one of them running
    batch = gateway.batches.record(_body("a", "b", "c"), org_id=ORG, user_id=USER)
    turns = [turn.turn_id for turn in gateway.batches.turns(batch.batch_id)]
    assert gateway.turns.mark_running(turns[0], now=gateway.clock(), deadline_at=gateway.service.deadline())
    # When the batch is cancelled, running turns left to finish
    cancelling = gateway.batches.cancel(batch.batch_id, org_id=ORG)
    # Then the two queued ones are cancelled, flagged, told about, and counted; the running one runs on
    assert cancelling.status is BatchStatus.CANCELLING and cancelling.cancel_requested_at is not None
    assert (cancelling.counts[TurnStatus.CANCELLED], cancelling.counts[TurnStatus.RUNNING]) == (2, 1)
    assert [gateway.cancel_flags.is_cancelled(turn_id) for turn_id in turns] == [False, True, True]
    assert [event.event for event in gateway.events(turns[1])] == ["turn.cancelled"]
    assert gateway.finished("cancelled", "cancelled") == 2
    # And once the running turn is cancelled too, the batch is cancelled and cannot be cancelled again
    gateway.service.cancel(turns[0], org_id=ORG)
    assert gateway.batches.progress(batch.batch_id, org_id=ORG).status is BatchStatus.CANCELLED
    with pytest.raises(Conflict) as finished:
        gateway.batches.cancel(batch.batch_id, org_id=ORG)
    assert finished.value.code == "batch_finished"


def test_cancel_cancel_also_cancels_running_turns(gateway: Gateway) -> None:
    batch = gateway.batches.record(_body("a", "b"), org_id=ORG, user_id=USER)
    first = next(iter(gateway.batches.turns(batch.batch_id))).turn_id
    gateway.turns.mark_running(first, now=gateway.clock(), deadline_at=gateway.service.deadline())

    cancelled = gateway.batches.cancel(batch.batch_id, org_id=ORG, running="cancel")

    assert cancelled.status is BatchStatus.CANCELLED and cancelled.counts[TurnStatus.CANCELLED] == 2


def test_page_lists_newest_first_with_a_cursor_and_refuses_an_unknown_one(gateway: Gateway) -> None:
    created = []
    for index in range(3):
        created.append(gateway.batches.record(_body(str(index)), org_id=ORG, user_id=USER).batch_id)
        gateway.clock.now += timedelta(seconds=1)

    first = gateway.batches.page(org_id=ORG, limit=2, after=None)
    rest = gateway.batches.page(org_id=ORG, limit=2, after=first.last_id)

    assert [b.batch_id for b in first.data] == created[:0:-1] and first.has_more
    assert [b.batch_id for b in rest.data] == created[:1] and not rest.has_more
    assert gateway.batches.page(org_id="someone else", limit=2, after=None).data == []
    with pytest.raises(InvalidRequest):
        gateway.batches.page(org_id="someone else", limit=2, after=created[0])


@pytest.mark.parametrize(
    ("line", "loc"),
    [
        ("{oops", ["line", 3]),
        ('{"input": "  "}', ["line", 3, "input"]),
        ('{"input": "a", "mode": "nope"}', ["line", 3, "mode"]),
    ],
)
def test_an_upload_names_its_bad_line_and_records_nothing(gateway: Gateway, line: str, loc: list[object]) -> None:
    with pytest.raises(InvalidRequest) as refused:
        record_upload(
            gateway.batches, _lines({"input": "a"}, "", line), org_id=ORG, user_id=USER, webhook_url=None,
            idempotency_key=None, max_requests=10,
        )  # fmt: skip

    assert refused.value.message.startswith("line 3: ")
    assert refused.value.details[0]["loc"][: len(loc)] == loc
    assert gateway.held() == 0 and gateway.broker.sent == []
    assert gateway.batches.page(org_id=ORG, limit=5, after=None).data == []


def test_memory_store_cancel_many_flags_turns_and_drops_their_markers() -> None:
    store = MemoryStateStore()
    store.mark_alive(["t1", "t2", "t3"], until=100.0)

    store.cancel_many(["t1", "t2"], ttl_seconds=60)

    assert [store.is_cancelled(turn_id) for turn_id in ("t1", "t2", "t3")] == [True, True, False]
    assert store.alive_until(["t1", "t2", "t3"]) == {"t3": 100.0}
