"""A step message pushed by the state store's save (``StepSender.push``, ``BrokerPush``) on a real Redis: the same
bytes ``send_task`` sends, on the same list, sent if and only if the state was written, in the broker's own
database of the server; and never taken where it cannot be (publish signals connected, another broker)."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime

import pytest
import redis
from celery import Celery, signals

from api_gateway.metrics import GatewayMetrics
from api_gateway.services.turn_sender import TurnSender
from aptix_cli.embedded_redis import EmbeddedRedis
from aptix_cli.launcher import free_port
from shared.broker import create_producer, unacked_depth
from shared.broker_transport import acknowledged_by_save
from shared.errors import StateConflict
from shared.models.envelope import TurnEnvelope, first_step
from shared.settings import Settings
from shared.state import MemoryStateStore, RedisStateStore, TurnState
from shared.state.admission import AdmissionQueue
from shared.step_sender import CeleryBroker, StepSender, save_pushes, scripts_reach
from shared.task_names import Queue, StepName
from tests.conftest import redis_databases
from tests.support.redis_round_trips import CountingRedis
from tests.support.step_messages import ENVELOPES, envelope_of, messages, send_task, without_ids
from tests.unit.fakes import FakeLlm, answer, catalog_with_counted_tool, make_context, record_turn
from workers.context import lease_renewer
from workers.driver import run_step
from workers.llm.types import FunctionCall, LlmResponse
from workers.metrics import MessageTally
from workers.runtime import build_step_sender

pytestmark = pytest.mark.integration


def _state(turn_id: str) -> TurnState:
    return TurnState(turn_id=turn_id, session_id="s", org_id="o", user_id="u", new_session=True, user_input="hi")


def _sender(app: Celery, state_url: str, broker_url: str) -> StepSender:
    """A worker's step sender for a state store at ``state_url`` and a broker at ``broker_url``."""
    settings = Settings(redis_url=state_url, broker_url=broker_url)
    broker = CeleryBroker(app, retry=False)
    return build_step_sender(broker, MemoryStateStore(), settings, pushes=save_pushes(broker, settings))


@pytest.fixture
def two_databases(services: None) -> Iterator[tuple[str, str]]:
    """(state URL, broker URL): two empty databases of the local Redis server."""
    with redis_databases(2) as (state_url, broker_url):
        yield state_url, broker_url


@pytest.mark.parametrize("countdown", [0.0, 2.5])
def test_a_pushed_step_message_is_byte_for_byte_the_one_send_task_sends(
    two_databases: tuple[str, str], countdown: float
) -> None:
    # Given a broker in another database of the state store's server
    state_url, broker_url = two_databases
    app = create_producer(Settings(broker_url=broker_url, redis_url=state_url))
    sender, store = _sender(app, state_url, broker_url), RedisStateStore.from_url(state_url)
    for envelope in ENVELOPES:
        # When each envelope goes through send_task, then is pushed by a save of its turn's state
        send_task(app, envelope, countdown)
        push = sender.push(envelope, countdown)
        assert push is not None and push.db == int(broker_url.rsplit("/", 1)[1])
        store.save(_state(envelope.turn_id), ttl_seconds=60, push=push)
    # Then both lie on the same list, the same bytes ids and ETA aside; and nothing went to the state's database
    for envelope in ENVELOPES:
        by_send_task, pushed = (without_ids(raw) for raw in messages(broker_url, envelope))
        assert pushed == by_send_task
    state_lists = [key for key in store.client.keys("*") if store.client.type(key) == b"list"]
    assert state_lists == []


def test_a_save_that_is_refused_pushes_nothing(two_databases: tuple[str, str]) -> None:
    # Given a turn whose state another worker saved since this one loaded it
    state_url, broker_url = two_databases
    app = create_producer(Settings(broker_url=broker_url, redis_url=state_url))
    sender, store = _sender(app, state_url, broker_url), RedisStateStore.from_url(state_url)
    envelope = TurnEnvelope(turn_id="turn_refused", step=StepName.REASONER, hop=3)
    store.save(_state(envelope.turn_id), ttl_seconds=60)
    stale = _state(envelope.turn_id)  # version 0: the stored one is 1
    # When its save carries the next step's message
    with pytest.raises(StateConflict):
        store.save(stale, ttl_seconds=60, push=sender.push(envelope))
    # Then the message was not sent either; the same save from the stored version sends it once
    assert messages(broker_url, envelope) == []
    current = _state(envelope.turn_id)
    current.version = 1
    store.save(current, ttl_seconds=60, push=sender.push(envelope))
    (raw,) = messages(broker_url, envelope)
    assert json.loads(raw)["headers"]["task"] == "aptix.step.reasoner"


def test_a_push_of_no_message_only_acknowledges_and_only_when_its_save_is_written(
    two_databases: tuple[str, str],
) -> None:
    # Given a step message a worker holds unacknowledged, the last of its turn's chain
    state_url, broker_url = two_databases
    app = create_producer(Settings(broker_url=broker_url, redis_url=state_url))
    sender, store = _sender(app, state_url, broker_url), RedisStateStore.from_url(state_url)
    broker = redis.Redis.from_url(broker_url)
    envelope = TurnEnvelope(turn_id="turn_ends", step=StepName.PERSIST, hop=5)
    send_task(app, envelope, 0.0)
    (raw,) = messages(broker_url, envelope)
    tag = _take(broker, raw)
    assert sender.push(None) is None  # nothing to acknowledge: no push
    ack = sender.push(None, 0.0, tag)
    assert ack is not None and ack.key is None and ack.ack == tag
    store.save(_state(envelope.turn_id), ttl_seconds=60)
    # When a save refused (another worker saved since) carries its acknowledgement, it stays held
    with pytest.raises(StateConflict):
        store.save(_state(envelope.turn_id), ttl_seconds=60, push=ack)
    assert broker.hexists("unacked", tag) and broker.zscore("unacked_index", tag) is not None
    # Then the save from the stored version acknowledges it, and sends nothing
    current = _state(envelope.turn_id)
    current.version = 1
    lists = sorted(key for key in broker.keys("*") if broker.type(key) == b"list")
    store.save(current, ttl_seconds=60, push=ack)
    assert not broker.hexists("unacked", tag) and broker.zscore("unacked_index", tag) is None
    assert sorted(key for key in broker.keys("*") if broker.type(key) == b"list") == lists
    assert all(broker.llen(key) == 0 for key in lists)


def test_a_broker_in_the_state_stores_own_database_is_pushed_to_without_a_database_switch(
    redis_db_url: str, redis_client: redis.Redis
) -> None:
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    envelope = TurnEnvelope(turn_id="turn_same_db", step=StepName.COMPOSE, hop=4, priority=3)
    push = _sender(app, redis_db_url, redis_db_url).push(envelope)
    assert push is not None and push.db is None
    RedisStateStore(redis_client).save(_state(envelope.turn_id), ttl_seconds=60, push=push)
    assert len(messages(redis_db_url, envelope)) == 1


def test_no_message_is_taken_with_publish_signals_connected_or_for_a_parked_wait(
    two_databases: tuple[str, str],
) -> None:
    state_url, broker_url = two_databases
    app = create_producer(Settings(broker_url=broker_url, redis_url=state_url))
    sender = _sender(app, state_url, broker_url)
    envelope = TurnEnvelope(turn_id="turn_signalled", step=StepName.REASONER, hop=1)
    assert sender.push(envelope, sender.park_after + 1) is None  # parked in the state store's timers instead

    def on_publish(**_kwargs: object) -> None:  # what telemetry's instrumentation connects
        pass

    signals.before_task_publish.connect(on_publish, weak=False)
    try:
        assert sender.push(envelope) is None  # the task sends it: the signal sees it go
    finally:
        signals.before_task_publish.disconnect(on_publish)
    assert messages(broker_url, envelope) == []  # taking a message never sends it


@pytest.mark.parametrize(
    ("boundaries", "messages_sent"),
    [
        ("layer", [StepName.REASONER, StepName.COMPOSE, StepName.LLM_CALL, StepName.REASONER, StepName.PERSIST]),
        # the default: the entry's task makes the first model call, and a server tool's answer is a second
        ("call", [StepName.EXECUTE_SERVER_TOOLS, StepName.LLM_CALL]),
    ],
)
def test_the_driver_s_save_sends_each_next_step_of_a_turn_and_the_task_sends_none(
    two_databases: tuple[str, str], boundaries: str, messages_sent: list[StepName]
) -> None:
    # Given a worker whose state store and broker share a Redis server (two databases), as by default
    state_url, broker_url = two_databases
    app = create_producer(Settings(broker_url=broker_url, redis_url=state_url))
    store = RedisStateStore.from_url(state_url)
    answers = [answer("hi")] if boundaries == "layer" else [_tool_call(), answer("hi")]
    ctx = make_context(FakeLlm(*answers), catalog=catalog_with_counted_tool(), task_boundaries=boundaries)
    ctx = replace(
        ctx, states=store, cancel_flags=store, in_flight=store, timers=store,
        leases=lease_renewer(store, ctx.settings), push=_sender(app, state_url, broker_url).push,
    )  # fmt: skip
    first = record_turn(ctx)
    broker = redis.Redis.from_url(broker_url)
    # When each message the driver hands on is taken from the broker and run, as a worker does
    ran, dispatch = [], run_step(ctx, first)
    while dispatch is not None:
        # Then every next step was sent by the save that recorded it, and it is on its queue
        assert dispatch.sent
        (raw,) = messages(broker_url, dispatch.envelope)
        assert envelope_of(raw) == dispatch.envelope
        tag = _take(broker, raw)
        ran.append(dispatch.envelope.step)
        tally = MessageTally()
        dispatch = run_step(ctx, dispatch.envelope, delivery_tag=tag, tally=tally)
        # and the message the step came in was acknowledged by the same save, the chain's last one too
        assert not broker.hexists("unacked", tag) and broker.zscore("unacked_index", tag) is None
        assert dispatch.acked if dispatch is not None else tally.acked
    assert ran == messages_sent
    row = ctx.turns.get(first.turn_id)
    assert row is not None and row.status == "completed"


def _take(broker: redis.Redis, raw: bytes) -> str:
    """Take the message ``raw`` off its list and hold it unacknowledged, as kombu's consumer does; its delivery tag."""
    assert sum(broker.lrem(key, 1, raw) for key in broker.keys("*") if broker.type(key) == b"list") == 1
    tag = str(json.loads(raw)["properties"]["delivery_tag"])
    broker.zadd("unacked_index", {tag: time.time()})
    broker.hset("unacked", tag, json.dumps([raw.decode(), "", "pipeline"]))
    return tag


def test_kombus_ack_of_a_message_a_save_acknowledged_does_not_touch_redis(
    redis_db_url: str, redis_client: redis.Redis
) -> None:
    # Given two step messages a consumer holds unacknowledged (two tasks in progress)
    app = create_producer(Settings(broker_url=redis_db_url, redis_url=redis_db_url))
    StepSender(CeleryBroker(app, retry=False), timers=MemoryStateStore(), park_after=30).send(
        [TurnEnvelope(turn_id=f"turn_{n}", step=StepName.REASONER, hop=1) for n in range(2)]
    )
    with app.connection_for_read() as connection:
        queue = connection.SimpleQueue("pipeline")
        first, second = queue.get(timeout=5), queue.get(timeout=5)
        assert unacked_depth(redis_client)[Queue.PIPELINE] == 2
        # When the first one's save acknowledged it (said, not done here), and the task then acks both
        acknowledged_by_save(first.delivery_tag)
        first.ack()
        second.ack()
        # Then kombu forgot both, but only the second's ack went to Redis
        assert redis_client.hexists("unacked", first.delivery_tag)
        assert not redis_client.hexists("unacked", second.delivery_tag)
        assert {first.delivery_tag, second.delivery_tag} <= connection.default_channel.qos._dirty  # acked
        queue.close()


def test_a_broker_database_a_script_cannot_select_is_sent_to_apart(two_databases: tuple[str, str]) -> None:
    # Given Redis, whose scripts reach another database by SELECT, and fakeredis (aptix dev's embedded server),
    # whose scripts run every command on the caller's database
    state_url, broker_url = two_databases
    broker_db = int(broker_url.rsplit("/", 1)[1])
    assert scripts_reach(state_url, broker_url, broker_db)
    with EmbeddedRedis() as embedded:
        assert not scripts_reach(embedded.url(0), embedded.url(1), 1)
        # Then a worker there sends each step apart, as it would to a broker elsewhere
        sender = _sender(create_producer(Settings(broker_url=embedded.url(1))), embedded.url(0), embedded.url(1))
        assert sender.push(TurnEnvelope(turn_id="turn_dev", step=StepName.REASONER, hop=1)) is None
    assert _sender(create_producer(Settings(broker_url=broker_url)), state_url, broker_url).push(
        TurnEnvelope(turn_id="turn_redis", step=StepName.REASONER, hop=1)
    )
    assert redis.Redis.from_url(broker_url).keys("aptix:select-probe:*") == []  # the probe cleans up


def test_a_step_whose_message_kombu_cannot_build_while_the_broker_is_down_is_sent_apart_not_failed(
    two_databases: tuple[str, str],
) -> None:
    # Given a worker whose broker is down when its step saves (kombu's producer cannot connect to build the message)
    state_url, _ = two_databases
    down = f"redis://127.0.0.1:{free_port()}/1"
    app = create_producer(Settings(broker_url=down, redis_url=state_url))
    app.conf.broker_connection_retry = False
    app.conf.broker_connection_max_retries = 0
    broker = CeleryBroker(app, retry=False)
    sender = StepSender(broker, timers=MemoryStateStore(), park_after=30, pushes=lambda e, c: broker.push(e, c, db=1))
    store = RedisStateStore.from_url(state_url)
    ctx = make_context(FakeLlm(answer("hi")))
    ctx = replace(
        ctx, states=store, cancel_flags=store, in_flight=store, timers=store,
        leases=lease_renewer(store, ctx.settings), push=sender.push,
    )  # fmt: skip
    first = record_turn(ctx)
    # When its first step runs and saves
    dispatch = run_step(ctx, first, delivery_tag="tag-1")
    # Then the turn goes on: the state was saved with its next step, left for the task to send (and requeue)
    assert dispatch is not None and dispatch.failed is None and not dispatch.sent and not dispatch.acked
    saved = store.load(first.turn_id)
    assert saved is not None and saved.next_envelope == dispatch.envelope.model_dump(mode="json")


def _tool_call() -> LlmResponse:
    call = FunctionCall(call_id="call_1", name="counted_tool", arguments=json.dumps({"key": f"push-{time.time()}"}))
    return LlmResponse(response_id="r1", output_text=None, function_calls=(call,))


@pytest.mark.parametrize("pushed", [True, False])
def test_the_gateway_marks_counts_and_sends_an_interactive_turn_in_one_round_trip_when_it_can_push(
    two_databases: tuple[str, str], pushed: bool
) -> None:
    # Given a gateway's turn sender whose broker is another database of the state store's server (pushed), or one
    # that cannot push (publish signals connected, another broker: ``pushes`` None)
    state_url, broker_url = two_databases
    settings = Settings(redis_url=state_url, broker_url=broker_url)
    app = create_producer(settings)
    broker = CeleryBroker(app, retry=False)
    client = CountingRedis.from_url(state_url)
    store = RedisStateStore(client)
    steps = StepSender(
        broker, timers=store, park_after=math.inf, pushes=save_pushes(broker, settings) if pushed else None
    )
    admission = AdmissionQueue(client)
    sender = TurnSender(
        settings=settings, store=store, steps=steps, clock=lambda: datetime.now(UTC), metrics=GatewayMetrics(),
        admission=admission,
    )  # fmt: skip
    resumed = first_step("turn_" + "9" * 32, batch=False, round_=1)
    for _warm_up in range(2):  # the scripts loaded, as on a gateway that ran a turn
        sender.send_new(["turn_" + "f" * 32], batch=False, refused="not accepted", org_id="org-a")
    publishes: list[int] = []
    publish = broker.publish
    broker.publish = lambda envelopes, *, countdown: (
        publishes.append(len(envelopes))
        or publish(  # type: ignore[method-assign]
            envelopes, countdown=countdown
        )
    )
    client.round_trips = 0
    # When it accepts an interactive turn, and the tool results of another
    sender.send_new(["turn_" + "8" * 32], batch=False, refused="not accepted", org_id="org-a")
    sends = client.round_trips + len(publishes)
    sender.send_reentry(resumed.turn_id, round_=1, batch=False, org_id="org-a")
    # Then each is one round trip when pushed (else its marker and count in one, its message in another, on the
    # broker's own connection), with the marker set, the turn counted in flight and its message as send_task's
    assert (sends, client.round_trips + len(publishes) - sends) == ((1, 1) if pushed else (2, 2))
    assert set(store.alive_until(["turn_" + "8" * 32, resumed.turn_id])) == {"turn_" + "8" * 32, resumed.turn_id}
    assert admission.counts()["org-a"].in_flight == 3
    send_task(app, resumed, 0.0)
    by_send_task, sent = (without_ids(raw) for raw in reversed(messages(broker_url, resumed)))
    assert sent == by_send_task
    assert len(messages(broker_url, first_step("turn_" + "8" * 32, batch=False))) == 1
