"""StepSender on a fake broker and the in-memory state store: now, after a countdown, or parked until due.

The Celery messages themselves are checked against ``send_task`` on a real Redis in
tests/integration/test_broker_transport.py.
"""

from __future__ import annotations

import pytest
from kombu.exceptions import OperationalError

from shared.models.envelope import TurnEnvelope
from shared.state import MemoryStateStore
from shared.step_sender import StepSender, beside_state
from shared.task_names import StepName
from tests.unit.fakes import FakeBroker

NOW = 1_700_000_000.0


def _envelope(index: int) -> TurnEnvelope:
    return TurnEnvelope(turn_id=f"turn_{index:032x}", step=StepName.LLM_CALL, hop=6, iteration=1, attempt=index)


def _sender(broker: FakeBroker, store: MemoryStateStore) -> StepSender:
    return StepSender(broker, timers=store, park_after=30, clock=lambda: NOW)


def test_steps_sent_together_go_to_the_broker_in_one_publish() -> None:
    broker, store = FakeBroker(), MemoryStateStore()
    _sender(broker, store).send([_envelope(1), _envelope(2)])
    assert broker.published == [(_envelope(1), 0.0), (_envelope(2), 0.0)]


def test_a_countdown_up_to_park_after_is_the_brokers_to_keep() -> None:
    broker, store = FakeBroker(), MemoryStateStore()
    _sender(broker, store).send([_envelope(1)], countdown=30)
    assert broker.published == [(_envelope(1), 30)] and store.pop_due(now=NOW + 3600) == []


def test_a_longer_countdown_is_parked_and_sent_when_due() -> None:
    # Given a step sent with a countdown past park_after
    broker, store = FakeBroker(), MemoryStateStore()
    sender = _sender(broker, store)
    sender.send([_envelope(1), _envelope(2)], countdown=45)
    # Then nothing reaches the broker before it is due, and both go out together once due
    assert broker.published == []
    assert sender.release_due(now=NOW + 44) == 0
    assert sender.release_due(now=NOW + 45) == 2
    assert broker.published == [(_envelope(1), 0.0), (_envelope(2), 0.0)]
    assert sender.release_due(now=NOW + 46) == 0


def test_due_steps_the_broker_refuses_are_parked_again_due_at_once() -> None:
    # Given two parked steps that are due, and a broker that refuses
    broker, store = FakeBroker(), MemoryStateStore()
    sender = _sender(broker, store)
    sender.send([_envelope(1), _envelope(2)], countdown=45)
    broker.refuse = OperationalError("connection refused")
    # When they are released, the refusal reaches the caller
    with pytest.raises(OperationalError):
        sender.release_due(now=NOW + 50)
    # Then neither is lost: the next round sends both
    broker.refuse = None
    assert sender.release_due(now=NOW + 51) == 2
    assert sorted(envelope.attempt for envelope in broker.sent) == [1, 2]


def test_a_parked_item_that_is_not_an_envelope_is_dropped() -> None:
    broker, store = FakeBroker(), MemoryStateStore()
    store.park("not json", due=NOW)
    assert _sender(broker, store).release_due(now=NOW) == 0 and broker.published == []


@pytest.mark.parametrize(
    ("state_url", "broker_url", "db"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0", None),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379", None),
        ("redis://127.0.0.1:6379/8", "redis://127.0.0.1:6379/9", 9),
        ("redis://:pw@10.0.0.5:6380/1", "redis://:pw@10.0.0.5:6380/2", 2),
        ("unix:///run/redis.sock?db=1", "unix:///run/redis.sock?db=3", 3),
    ],
)
def test_a_broker_beside_the_state_store(state_url: str, broker_url: str, db: int | None) -> None:
    beside = beside_state(state_url, broker_url)
    assert beside is not None and beside.db == db


@pytest.mark.parametrize(
    ("state_url", "broker_url"),
    [
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6380/0"),  # another server
        ("redis://10.0.0.5:6379/0", "redis://10.0.0.6:6379/0"),
        ("redis://:a@10.0.0.5:6379/0", "redis://:b@10.0.0.5:6379/1"),  # other credentials
        ("redis://10.0.0.5:6379/0", "rediss://10.0.0.5:6379/0"),  # TLS on one side only
        ("sentinel://s1:26379/main", "sentinel://s1:26379/main"),  # a failover can move either
        ("redis+cluster://n1:7000", "redis://n1:7000/0"),
        ("redis://10.0.0.5:6379/0", "amqp://guest@10.0.0.5//"),
    ],
)
def test_a_broker_not_beside_the_state_store(state_url: str, broker_url: str) -> None:
    assert beside_state(state_url, broker_url) is None
