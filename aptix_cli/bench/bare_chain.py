"""The bare Celery chain: what the same hops cost with no Aptix work in them, as a floor to compare with.

One no-op task, JSON, acks late, results ignored, on the Aptix broker options and queues
(:func:`shared.broker.celery_config`, so the Redis transport options match). A chain is a list of
queues, one per hop, copied from an Aptix turn; hop *i* runs on queue *i* and sends hop *i + 1*,
at the priorities a batch turn's messages get; the last hop records ``chain id -> time`` in a
Redis sorted set (in the state database), so the bench knows when every chain is done.

Workers run it as ``python -m celery -A aptix_cli.bench.bare_chain:app worker ...``: the ``app``
attribute is built on first access from the ``APTIX_*`` settings (``APTIX_BROKER_URL``,
``APTIX_REDIS_URL``), so importing this module does nothing.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Sequence
from typing import cast

import redis
from celery import Celery

from shared.broker import BATCH_PRIORITY, BATCH_START_PRIORITY, celery_config
from shared.redis_clients import redis_client
from shared.settings import Settings

__all__ = ["DONE_KEY", "HOP_TASK", "create_app", "finished_chains", "send_chains"]

HOP_TASK = "aptix.bench.bare_hop"
DONE_KEY = "aptix:bench:bare:done"
"""Sorted set in the state database: chain id -> epoch seconds its last hop ran."""


def create_app(settings: Settings) -> Celery:
    """The bare-chain Celery app on ``settings``' broker, with the one hop task registered."""
    app = Celery("aptix-bench-bare", set_as_current=False)
    app.conf.update(celery_config(settings))
    app.conf.worker_hijack_root_logger = True  # Aptix configures its own logging; this app lets Celery do it
    done = _Redis(settings.redis_url)

    @app.task(name=HOP_TASK, acks_late=True, ignore_result=True)  # type: ignore[untyped-decorator]  # Celery is untyped
    def hop(chain_id: str, index: int, queues: list[str]) -> None:
        following = index + 1
        if following < len(queues):
            app.send_task(
                HOP_TASK, args=[chain_id, following, queues], queue=queues[following], priority=BATCH_PRIORITY
            )
        else:
            done.client().zadd(DONE_KEY, {chain_id: time.time()})

    return app


def send_chains(app: Celery, queues: Sequence[str], ids: Sequence[str]) -> dict[str, float]:
    """Send the first hop of one chain per id, over one broker connection.

    Returns:
        Each chain's send time (epoch seconds).
    """
    sent: dict[str, float] = {}
    with app.producer_or_acquire() as producer:
        for chain_id in ids:
            sent[chain_id] = time.time()
            app.send_task(
                HOP_TASK,
                args=[chain_id, 0, list(queues)],
                queue=queues[0],
                priority=BATCH_START_PRIORITY,
                producer=producer,
            )
    return sent


def finished_chains(client: redis.Redis) -> dict[str, float]:
    """Chain id -> when its last hop ran, for every chain finished so far."""
    rows = cast(list[tuple[bytes, float]], client.zrange(DONE_KEY, 0, -1, withscores=True))
    return {member.decode(): float(score) for member, score in rows}


def __getattr__(name: str) -> Celery:
    if name == "app":
        return _app()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


@functools.cache
def _app() -> Celery:
    return create_app(Settings())


class _Redis:
    """One Redis client per process, made on first use (so a prefork child never uses its parent's)."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._client: redis.Redis | None = None

    def client(self) -> redis.Redis:
        if self._client is None:
            self._client = redis_client(self._url)
        return self._client
