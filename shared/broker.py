"""Celery configuration both sides share: JSON only, acks late, task events on demand, routing by task name.

The gateway builds a producer-only app from it (it sends tasks by name); the workers build the
full app in ``workers.app``. Step messages leave through ``shared.step_sender``; webhook delivery
attempts through :func:`send_webhook`.
"""

from __future__ import annotations

import json
from typing import Any

from celery import Celery
from kombu.entity import Exchange
from kombu.entity import Queue as KombuQueue

from shared.models.envelope import BATCH_PRIORITY, BATCH_START_PRIORITY, INTERACTIVE_PRIORITY
from shared.redis_clients import broker_connection, parse_sentinel_url
from shared.settings import Settings
from shared.task_names import TASK_QUEUES, WEBHOOK_TASK, Queue

__all__ = [
    "BATCH_PRIORITY",
    "BATCH_START_PRIORITY",
    "INTERACTIVE_PRIORITY",
    "celery_config",
    "create_producer",
    "queue_depth",
    "send_webhook",
    "unacked_depth",
    "visibility_timeout",
]

# kombu's Redis transport keeps a queue's messages in one list per priority step: the queue's own
# name for priority 0, ``<queue>\x06\x16<step>`` for the others (kombu.transport.redis, PRIORITY_STEPS).
_PRIORITY_STEPS = (0, 3, 6, 9)
_PRIORITY_SEPARATOR = "\x06\x16"
_REDIS_TRANSPORT = "shared.broker_transport:Transport"
_SENTINEL_TRANSPORT = "shared.broker_transport:SentinelTransport"
# Messages a worker has taken but not acknowledged (acks_late: every task in progress) leave the
# lists for this hash, field delivery tag, value ``[message, exchange, routing_key]``
# (kombu.transport.redis.QoS.append). Our routing key is the queue's name.
_UNACKED_KEY = "unacked"


def celery_config(settings: Settings) -> dict[str, Any]:
    """The Celery settings of every Aptix process.

    A ``sentinel://`` broker URL (``shared.redis_clients``) becomes kombu's Sentinel transport: kombu's form
    of the URL, and ``master_name`` (and the sentinels' password) among the transport options; every
    channel then asks the sentinels for the primary whenever it connects, so a worker, the gateway and
    Flower follow a failover on their own.
    """
    broker_url, sentinel_options = broker_connection(
        settings.effective_broker_url, sentinel_password=settings.sentinel_password
    )
    return {
        "broker_url": broker_url,
        "broker_connection_retry_on_startup": True,
        # max_connections: above any pool's concurrency (Redis's default of 10 gave duplicate runs
        # under acks_late). visibility_timeout: a message whose worker died unacknowledged comes
        # back after this long; the driver then runs the step only if its lease (renewed by a live
        # worker's heartbeat) has expired, which is what APTIX_STEP_LEASE_SECONDS promises. kombu
        # scans for such messages every interval x throttle seconds (10 x 10 by default): scan
        # every 2 s so recovery takes seconds, not minutes.
        "broker_transport_options": {
            "max_connections": 512,
            "visibility_timeout": visibility_timeout(settings),
            "unacked_restore_interval": 2,
            "unacked_restore_throttle": 1,
            **sentinel_options,
        },
        "broker_pool_limit": 64,
        # kombu's Redis (or Sentinel) transport with one client per channel (shared.broker_transport); a
        # URL of another scheme keeps its own transport.
        "broker_transport": _transport(settings.effective_broker_url),
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "event_serializer": "json",
        "task_ignore_result": True,
        "result_backend": None,
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        # Off at start: task events cost the worker CPU on every task (docs/operations.md, "Flower"). Flower
        # sends ``enable_events`` to every worker when it starts (and every few seconds after), so
        # Flower still shows every task from the moment it runs; without Flower nothing pays.
        "worker_send_task_events": False,
        # Off: "sent" events cost ≈ 0.7 ms CPU per publish (FIELD-NOTES) — ≈ 19 % of a plain turn here;
        # Flower still shows every step from its received/started/succeeded events.
        "task_send_sent_event": False,
        "task_default_queue": Queue.PIPELINE.value,
        # One direct exchange per queue, keyed by its name: a shared exchange with one key would
        # copy every message into every queue.
        "task_queues": [_queue(q.value) for q in Queue],
        "task_default_exchange": Queue.PIPELINE.value,
        "task_default_routing_key": Queue.PIPELINE.value,
        "task_routes": {name: {"queue": queue.value} for name, queue in TASK_QUEUES.items()},
        "worker_hijack_root_logger": False,
    }


def _transport(url: str) -> str | None:
    if parse_sentinel_url(url) is not None:
        return _SENTINEL_TRANSPORT
    return _REDIS_TRANSPORT if url.startswith("redis://") else None


def visibility_timeout(settings: Settings) -> int:
    """Seconds after which the Redis transport hands an unacknowledged message to another worker."""
    return max(2 * settings.step_lease_seconds, 10)


def queue_depth(client: Any, *queues: Queue) -> int:
    """Messages waiting in ``queues`` on a Redis broker (every priority list; not those workers hold); one round trip.

    Args:
        client: a ``redis.Redis`` on the broker's database.
        queues: the queues.
    """
    names = [
        queue.value if step == 0 else f"{queue.value}{_PRIORITY_SEPARATOR}{step}"
        for queue in queues
        for step in _PRIORITY_STEPS
    ]
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.llen(name)
    return sum(int(length) for length in pipe.execute())


def unacked_depth(client: Any) -> dict[Queue, int]:
    """Messages of each queue that workers hold unacknowledged on a Redis broker (tasks in progress).

    Together with :func:`queue_depth` this is the whole backlog of a queue: an autoscaler that
    counted only the queue's own list would see the priority-0 messages alone, and none in progress.

    Args:
        client: a ``redis.Redis`` on the broker's database.

    Returns:
        The count per queue (0 for a queue with none).
    """
    counts = dict.fromkeys(Queue, 0)
    queues = {queue.value: queue for queue in Queue}
    for _tag, value in client.hscan_iter(_UNACKED_KEY, count=1000):
        try:
            routing_key = json.loads(value)[2]
        except (ValueError, IndexError, TypeError):
            continue  # not a kombu entry: not ours to count
        queue = queues.get(routing_key)
        if queue is not None:
            counts[queue] += 1
    return counts


PRODUCER_TIMEOUT_SECONDS = 2.0
"""How long the gateway waits for the broker to connect or answer a send before it answers 503 (as its Redis
clients do): a broker cut off from it (packets dropped, no reset) otherwise held a request as long as the
client waited."""


def create_producer(settings: Settings) -> Celery:
    """A Celery app that only sends tasks (the gateway's); a broker that does not answer in
    :data:`PRODUCER_TIMEOUT_SECONDS` is a refused send."""
    app = Celery("aptix-gateway", set_as_current=False)
    config = celery_config(settings)
    config["broker_transport_options"] = {
        **config["broker_transport_options"],
        "socket_timeout": PRODUCER_TIMEOUT_SECONDS,
        "socket_connect_timeout": PRODUCER_TIMEOUT_SECONDS,
    }
    config["broker_connection_timeout"] = PRODUCER_TIMEOUT_SECONDS
    app.conf.update(config)
    return app


def send_webhook(app: Celery, delivery_id: str, *, attempt: int, countdown: float | None = None) -> None:
    """Send attempt number ``attempt`` of the webhook delivery ``delivery_id`` to the webhooks queue.

    The broker is asked once, without Celery's publish retries: the caller is a turn's commit or the
    sweep, and a delivery that could not be sent is sent by the sweep later (a webhook never delays a turn).

    Raises:
        kombu.exceptions.OperationalError: the broker refused (callers log it and carry on).
    """
    args = [{"delivery_id": delivery_id, "attempt": attempt}]
    app.send_task(
        WEBHOOK_TASK,
        args=args,
        queue=TASK_QUEUES[WEBHOOK_TASK].value,
        countdown=countdown if countdown else None,
        retry=False,
        argsrepr=repr(args),
        kwargsrepr="{}",
    )


def _queue(name: str) -> KombuQueue:
    exchange = Exchange(name, type="direct")  # type: ignore[no-untyped-call]  # kombu is untyped
    return KombuQueue(name, exchange, routing_key=name)  # type: ignore[no-untyped-call]
