"""A queued turn whose first message was lost while other turns' messages waited (a Redis failover that
did not replicate the push, a worker killed as it took the message), with a real gateway, a real
``aptix reconciler`` and a real worker: its marker vouches for it for the whole queued window
(``APTIX_RECONCILER_QUEUED_SECONDS``, an hour here), yet it is re-driven one deadline after the first
step's queue drains, not when the window ends (``workers.reconciler``)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from scripted_llm import ScriptedServer
from shared.broker import queue_depth
from shared.redis_clients import redis_client
from shared.task_names import DEFAULT_TASK_BOUNDARIES, StepName, step_queue
from tests.conftest import redis_databases
from tests.integration.conftest import System, system_env
from tests.support.databases import fresh_database
from tests.support.stack import LocalStack
from tests.support.step_messages import envelope_of
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

DEADLINE_SECONDS = 2
FIRST_QUEUE = step_queue(StepName.REQUEST_HANDLER, DEFAULT_TASK_BOUNDARIES)


@dataclass(frozen=True, slots=True)
class GatewayOnly:
    """A gateway with no worker yet, on a database and Redis databases of its own."""

    stack: LocalStack
    system: System
    database_url: str
    """Its database, for psycopg (no other test's reconciler scans it)."""


@pytest.fixture
def gateway_only(scripted_llm: ScriptedServer, modes_file: Path) -> Iterator[GatewayOnly]:
    """A gateway with short deadlines and no worker yet, on a database of its own: the session's
    database is scanned by the session system's reconciler, which would carry this test's turns on."""
    with redis_databases(2) as urls, fresh_database("aptix_lost_first") as database_url:
        env = system_env(
            database_url=database_url, redis_urls=(urls[0], urls[1]), llm=scripted_llm, modes_file=modes_file
        )
        env |= {
            "APTIX_RECONCILER_DEADLINE_SECONDS": str(DEADLINE_SECONDS),
            "APTIX_RECONCILER_INTERVAL_SECONDS": "0.5",
            "APTIX_RECONCILER_QUEUED_SECONDS": "3600",
        }
        stack = LocalStack(env)
        try:
            _, url = stack.start_gateway()
            running = System(stack=stack, gateway_url=url, llm=scripted_llm, env=env)
            yield GatewayOnly(stack, running, database_url.replace("postgresql+psycopg://", "postgresql://", 1))
            running.http.close()
        finally:
            stack.stop_all()


def _deadline(database_url: str, turn_id: str) -> tuple[float, int]:
    """The turn's deadline (0 once it ended) and how many times it was re-driven."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT deadline_at, redrives FROM turns WHERE turn_id = %s", (turn_id,)).fetchone()
    assert row is not None
    return (0.0 if row[0] is None else row[0].timestamp()), int(row[1])


def test_a_queued_turn_whose_first_message_was_lost_behind_a_backlog_is_re_driven_once_the_queue_drains(
    gateway_only: GatewayOnly,
) -> None:
    stack, system, database_url = gateway_only.stack, gateway_only.system, gateway_only.database_url
    broker = redis_client(system.env["APTIX_BROKER_URL"])
    # Given two turns accepted with no worker running, and the first one's message lost from the queue
    lost = system.post_turn({"input": "lost first message"}).json()["turn_id"]
    waiting = system.post_turn({"input": "waits in the queue"}).json()["turn_id"]
    assert queue_depth(broker, FIRST_QUEUE) == 2
    taken = broker.rpop(FIRST_QUEUE.value)  # the oldest message of the queue's priority-0 list
    assert isinstance(taken, bytes) and envelope_of(taken).turn_id == lost
    accepted_deadline, _ = _deadline(database_url, lost)

    # When the reconciler finds it past its deadline while the other turn's message still waits
    reconciler = stack.start_reconciler()
    wait_for(
        lambda: _deadline(database_url, lost)[0] > accepted_deadline or None, what="the deadline moved up", seconds=30
    )
    assert queue_depth(broker, FIRST_QUEUE) == 1 and reconciler.alive()
    moved_to, redrives = _deadline(database_url, lost)
    assert redrives == 0

    # Then its deadline moved up by one deadline, not to the end of its marker's hour
    assert moved_to - time.time() < 10 * DEADLINE_SECONDS

    # And once a worker drains the queue, the lost turn is re-driven at its next deadline and completes
    # (again at a later one, harmlessly, if the worker took its message but had not begun it by then)
    stack.start_worker("w1")
    assert system.wait_turn(waiting, seconds=60)["status"] == "completed"
    finished = system.wait_turn(lost, seconds=60)
    assert finished["status"] == "completed"
    assert _deadline(database_url, lost)[1] >= 1
