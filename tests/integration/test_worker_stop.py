"""Stopping ``aptix worker`` with real processes (docs/configuration.md, ``APTIX_WORKER_STOP_SECONDS``): told to
stop while its broker is unreachable, the worker and every process it runs are gone within
``APTIX_WORKER_STOP_SECONDS`` plus the kill margin, instead of reconnecting forever.

The worker runs on a Redis server of its own (``tests.chaos.backing``), killed by its PID; the wait
is on the processes, with room to spare over the bound: no test times the stop.
"""

from __future__ import annotations

import base64
import json
import os
import signal
from pathlib import Path

import pytest
import redis

from aptix_cli.worker_stop import KILL_MARGIN_SECONDS
from tests.support.processes import alive, children_of
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

STOP_SECONDS = 3.0


@pytest.mark.parametrize(
    ("pool", "queues", "processes"),
    [
        (None, "pipeline,llm,tools,webhooks", 3),  # `aptix worker`: a parent, a threads and a gevent process
        ("gevent", "llm,webhooks", 1),  # one Celery process, as an LLM deployment runs it
    ],
    ids=["group", "gevent-alone"],
)
def test_a_worker_told_to_stop_while_its_broker_is_gone_ends_with_all_its_processes_within_the_bound(
    database_url: str, tmp_path: Path, pool: str | None, queues: str, processes: int
) -> None:
    from tests.chaos.backing import RedisServer

    # Given a worker on a Redis server of its own
    server = RedisServer(log_dir=tmp_path)
    server.start()
    env = {
        "APTIX_DATABASE_URL": database_url,
        "APTIX_REDIS_URL": server.url(0),
        "APTIX_BROKER_URL": server.url(1),
        "APTIX_WORKER_STOP_SECONDS": str(STOP_SECONDS),
        "APTIX_WORKER_HEALTH_DIR": str(tmp_path / "health"),
    }
    stack = LocalStack(env, log_dir=tmp_path)
    pids: list[int] = []
    try:
        worker = stack.start_worker("st", pool=pool, queues=queues, concurrency=None)
        pids += [worker.pid, *children_of(worker.pid)]
        assert len(pids) == processes, pids
        celery_pids = set(pids[1:] if pool is None else pids)
        # that has run a while: every Celery process sent its worker-heartbeat event, as it does every 2 s
        # (the next one, with the broker gone, is retried for ever, holding the lock that shutdown waits for)
        _wait_for_heartbeats(server.url(1), celery_pids)
        # When the broker goes away and every Celery process has failed to reconnect twice (2 s apart:
        # a heartbeat fell due meanwhile)
        server.stop()
        wait_for(
            lambda: worker.log().count("Trying again in 4.00 seconds... (2/100)") >= len(celery_pids),
            what="every Celery process to be reconnecting to the broker",
            seconds=60,
        )
        # And the worker is told to stop
        worker.popen.send_signal(signal.SIGTERM)
        # Then it and every process it ran are gone within the bound
        wait_for(
            lambda: not any(alive(pid) for pid in pids),
            what=f"the worker's processes {pids} to end within {STOP_SECONDS:g}s + {KILL_MARGIN_SECONDS:g}s",
            seconds=STOP_SECONDS + KILL_MARGIN_SECONDS + 10,
            interval=0.2,
        )
    finally:
        stack.stop_all()
        for pid in pids[1:]:  # a child left behind (the bug this tests), by its pid
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        server.stop()


def _wait_for_heartbeats(broker_url: str, pids: set[int]) -> None:
    """Return once each process of ``pids`` has published a ``worker-heartbeat`` event on the broker
    (kombu's Redis transport sends events by PUBLISH, the body base64-encoded JSON)."""
    client = redis.Redis.from_url(broker_url)
    subscription = client.pubsub()  # type: ignore[no-untyped-call]  # redis-py leaves it untyped
    subscription.psubscribe("*celeryev/worker.heartbeat")
    beaten: set[int] = set()

    def all_beat() -> bool:
        while (message := subscription.get_message(timeout=0.2)) is not None:
            if message["type"] == "pmessage":
                event = json.loads(base64.b64decode(json.loads(message["data"])["body"]))
                beaten.add(int(event["pid"]))
        return beaten >= pids

    try:
        wait_for(all_beat, what=f"a worker-heartbeat event from each of {sorted(pids)}", seconds=30)
    finally:
        subscription.close()
        client.close()
