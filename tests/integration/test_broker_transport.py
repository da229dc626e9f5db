"""The broker on a real Redis: shared.broker_transport's channel reuses one client, messages still flow,
the backlog counts every list, and shared.step_sender's messages are byte for byte what ``send_task`` sends
(with telemetry on: tests/integration/test_telemetry_spans.py)."""

from __future__ import annotations

import json
import uuid

import pytest
import redis
from celery.utils.saferepr import saferepr

from shared.broker import celery_config, create_producer, queue_depth, unacked_depth
from shared.broker_transport import Channel
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings
from shared.task_names import Queue, StepName
from tests.support.step_messages import ENVELOPES, messages, send_task, step_sender, without_ids

pytestmark = pytest.mark.integration


def test_a_channel_keeps_one_client_until_its_pool_is_replaced(redis_db_url: str, redis_client: redis.Redis) -> None:
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    with app.connection_for_write() as connection:
        channel = connection.default_channel
        assert type(channel) is Channel
        first = channel._create_client()
        assert channel._create_client() is first
        for hop in range(5):
            step_sender(app).send([TurnEnvelope(turn_id=f"t{hop}", step=StepName.REASONER, hop=hop)])
        channel._disconnect_pools()  # what kombu does after a fork or a lost connection
        assert channel._create_client() is not first
    assert queue_depth(redis_client, Queue.PIPELINE) == 5


def test_a_step_message_shows_its_envelope_as_celery_would(redis_db_url: str, redis_client: redis.Redis) -> None:
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    envelope = TurnEnvelope(turn_id=f"turn_{uuid.uuid4().hex}", step=StepName.LLM_CALL, hop=4, priority=3)
    step_sender(app).send([envelope])
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
    sender = step_sender(app)
    for hop, priority in enumerate((0, 3, 6, 9)):
        sender.send([TurnEnvelope(turn_id=f"p{hop}", step=StepName.REASONER, hop=hop, priority=priority)])
    sender.send([TurnEnvelope(turn_id=f"l{hop}", step=StepName.LLM_CALL, hop=hop) for hop in range(2)])
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


@pytest.mark.parametrize("countdown", [0.0, 2.5])
def test_a_step_message_is_byte_for_byte_the_one_send_task_sends(redis_db_url: str, countdown: float) -> None:
    # Given the gateway's producer-only app, tracing off
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    # When each envelope goes through send_task, then through the step sender, alone and all together
    for envelope in ENVELOPES:
        send_task(app, envelope, countdown)
        step_sender(app).send([envelope], countdown=countdown)
    step_sender(app).send(ENVELOPES, countdown=countdown)
    # Then the three messages of each envelope are the same bytes, ids and ETA aside
    for envelope in ENVELOPES:
        by_send_task, alone, batched = (without_ids(raw) for raw in messages(redis_db_url, envelope))
        assert alone == by_send_task and batched == by_send_task


def test_a_step_message_sent_from_a_task_is_the_one_send_task_sends_there(redis_db_url: str) -> None:
    # Given a task that sends a step both ways (a driver sending the next step). Not on a worker's
    # app: a second one in this process would lend its step tasks to later apps (Celery's shared tasks).
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    sender = step_sender(app)

    @app.task(name="test.send_both_ways", shared=False)
    def send_both_ways() -> None:
        for envelope in ENVELOPES:
            send_task(app, envelope, 0.0)
            sender.send([envelope])

    # When the task runs (as a worker runs it: its request is the current worker task)
    send_both_ways.apply(task_id="parent-task")
    # Then both carry the task as parent and root, and are otherwise the same bytes
    for envelope in ENVELOPES:
        by_send_task, ours = messages(redis_db_url, envelope)
        assert json.loads(ours)["headers"]["parent_id"] == "parent-task"
        assert without_ids(ours) == without_ids(by_send_task)


def test_no_app_sends_sent_events_or_has_a_result_backend_so_a_step_message_needs_neither() -> None:
    # The two things send_task does around the message itself that the step sender leaves out
    config = celery_config(Settings())  # every Aptix app's, the gateway's and the workers'
    assert config["task_send_sent_event"] is False
    assert config["result_backend"] is None


def test_a_channel_closed_again_after_its_connection_let_go_of_the_transport_raises_no_attribute_error(
    redis_db_url: str, redis_client: redis.Redis
) -> None:
    # Given a consumer's connection holding a message it has not acknowledged (a task in progress)
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    step_sender(app).send([TurnEnvelope(turn_id="held", step=StepName.REASONER, hop=1)])
    connection = app.connection_for_read()
    channel = connection.default_channel
    (queue,) = [key.decode() for key in redis_client.keys("pipeline*") if redis_client.type(key) == b"list"]
    assert channel.basic_get(queue, no_ack=False) is not None
    # When, as Celery 5.7's consumer does on a lost broker connection, the connection lets go of its
    # transport (collect() after its channel's close broke off) and is then closed, closing the channel again
    connection._do_close_transport()
    connection.close()  # before: AttributeError ('NoneType' object has no attribute 'hostname'), the worker ended
    # Then the message is still held for the visibility timeout to bring back, not lost
    assert unacked_depth(redis_client)[Queue.PIPELINE] == 1
