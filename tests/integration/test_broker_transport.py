"""shared.broker_transport on a real Redis: a channel reuses one client, and messages still flow."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from celery.utils.saferepr import saferepr

from shared.broker import create_producer, publish_steps, queue_depth, send_step, unacked_depth
from shared.broker_transport import Channel
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings
from shared.task_names import Queue, StepName

pytestmark = pytest.mark.integration


def test_a_channel_keeps_one_client_until_its_pool_is_replaced(redis_db_url: str, redis_client: redis.Redis) -> None:
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        assert type(channel) is Channel
        first = channel._create_client()
        assert channel._create_client() is first
        for hop in range(5):
            send_step(app, TurnEnvelope(turn_id=f"t{hop}", step=StepName.REASONER, hop=hop))
        channel._disconnect_pools()  # what kombu does after a fork or a lost connection
        assert channel._create_client() is not first
    assert queue_depth(redis_client, Queue.PIPELINE) == 5


def test_a_step_message_shows_its_envelope_as_celery_would(redis_db_url: str, redis_client: redis.Redis) -> None:
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    envelope = TurnEnvelope(turn_id=f"turn_{uuid.uuid4().hex}", step=StepName.LLM_CALL, hop=4, priority=3)
    send_step(app, envelope)
    keys = [key for key in redis_client.keys("llm*") if redis_client.type(key) == b"list"]
    (raw,) = [item for key in keys for item in redis_client.lrange(key, 0, -1)]
    headers = json.loads(raw)["headers"]
    args = [envelope.model_dump(mode="json")]
    assert headers["argsrepr"] == saferepr(args, 1024)  # what Flower shows, as Celery itself would write it
    assert headers["kwargsrepr"] == saferepr({}, 1024)


def test_the_backlog_counts_every_priority_list_and_the_messages_workers_hold(
    redis_db_url: str, redis_client: redis.Redis
) -> None:
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    # Given messages at every priority on pipeline, and two on llm
    for hop, priority in enumerate((0, 3, 6, 9)):
        send_step(app, TurnEnvelope(turn_id=f"p{hop}", step=StepName.REASONER, hop=hop, priority=priority))
    for hop in range(2):
        send_step(app, TurnEnvelope(turn_id=f"l{hop}", step=StepName.LLM_CALL, hop=hop))
    assert len([k for k in redis_client.keys("pipeline*") if redis_client.type(k) == b"list"]) == 4
    # When a consumer takes one pipeline message and does not acknowledge it (a task in progress)
    with app.connection_for_read() as connection:
        held = connection.SimpleQueue(Queue.PIPELINE.value).get(timeout=5)
        # Then the waiting count covers every priority list, and the held message is unacked
        assert queue_depth(redis_client, Queue.PIPELINE) == 3
        assert queue_depth(redis_client, Queue.LLM) == 2
        assert unacked_depth(redis_client) == {queue: int(queue is Queue.PIPELINE) for queue in Queue}
        held.ack()
    assert unacked_depth(redis_client)[Queue.PIPELINE] == 0


def test_publish_steps_sends_the_message_send_step_sends_in_one_pipeline(
    redis_db_url: str, redis_client: redis.Redis
) -> None:
    # Given a producer on a real Redis broker
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    envelope = TurnEnvelope(turn_id="turn_" + "a" * 32, step=StepName.REQUEST_HANDLER, priority=9)
    # When one envelope goes through send_step and the same through publish_steps in a producer batch
    send_step(app, envelope)
    with app.producer_or_acquire() as producer, producer.batch(max_size=10):
        publish_steps(app, [envelope, envelope.model_copy(update={"turn_id": "turn_" + "b" * 32})], producer=producer)
    # Then all three wait in the same priority list, and the two ways make the same message but for its ids
    keys = [key for key in redis_client.keys("*") if b"pipeline" in key]
    assert len(keys) == 1 and redis_client.llen(keys[0]) == 3
    sent, direct, _other = (json.loads(raw) for raw in reversed(redis_client.lrange(keys[0], 0, -1)))
    for message in (sent, direct):
        message["headers"].pop("id"), message["headers"].pop("root_id")
        message["properties"].pop("correlation_id"), message["properties"].pop("delivery_tag")
    assert direct == sent
