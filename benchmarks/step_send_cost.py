"""What sending a step message costs the sender: CPU per message, ``StepSender`` against Celery's ``send_task``.

Every hop of every turn is one message (a plain turn is 6), and the gateway sends a batch's first
steps 1,000 at a time, so this is on the hot path. Run from the repo root against a Redis (an
empty database is claimed as the broker and flushed afterwards)::

    .venv/bin/python benchmarks/step_send_cost.py                 # 1,000 messages a case, 7 rounds
    .venv/bin/python benchmarks/step_send_cost.py --tracing       # with OpenTelemetry on (spans kept in memory)
    .venv/bin/python benchmarks/step_send_cost.py --redis-base redis://127.0.0.1:6379

Cases, each alternated with the others round by round, medians (and minimum) of the rounds:

- ``send_task``: Celery's own ``app.send_task`` of the same message, one at a time (the yardstick:
  how the driver and the reconciler sent before ``shared.step_sender``);
- one step now / after a countdown: ``StepSender.send([envelope])`` as the driver sends its next
  step (publish retries on, as in a worker);
- a batch of 1,000: one ``send`` of 1,000 envelopes (one Redis pipeline), as the gateway sends a
  batch's first steps; a batch of 1: an interactive turn's first step at the gateway.

The CPU is this process's (message building, kombu, redis-py), not Redis's.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable

import redis

from shared.broker import create_producer
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings
from shared.state import MemoryStateStore
from shared.step_sender import CeleryBroker, StepSender
from shared.task_names import TASK_QUEUES, StepName, task_name

_OWNER_KEY = "aptix:bench:step-send-cost"


def main() -> int:
    """Measure each case and print its CPU per message."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tracing", action="store_true")
    parser.add_argument("--redis-base", default="redis://127.0.0.1:6379", help="a Redis server, without database")
    args = parser.parse_args()
    url = _claim_database(args.redis_base)
    client = redis.Redis.from_url(url)
    app = create_producer(Settings(broker_url=url, redis_url=url))
    if args.tracing:
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

        from shared.telemetry import start_telemetry

        start_telemetry(Settings(), service_name="step-send-cost", exporter=InMemorySpanExporter())
    worker = StepSender(CeleryBroker(app, retry=True), timers=MemoryStateStore(), park_after=30)
    gateway = StepSender(CeleryBroker(app, retry=False), timers=MemoryStateStore(), park_after=30)
    envelopes = [
        TurnEnvelope(turn_id=f"turn_{uuid.uuid4().hex}", step=StepName.REASONER, hop=4, priority=3)
        for _ in range(args.messages)
    ]

    def send_task(envelope: TurnEnvelope, countdown: float = 0.0) -> None:
        name = task_name(envelope.step)
        app.send_task(
            name, args=[envelope.model_dump(mode="json")], queue=TASK_QUEUES[name].value,
            countdown=countdown or None, priority=envelope.priority,
        )  # fmt: skip

    def each(send: Callable[[TurnEnvelope], None]) -> Callable[[], None]:
        def run() -> None:
            for envelope in envelopes:
                send(envelope)

        return run

    cases: dict[str, Callable[[], None]] = {
        "send_task, one step now": each(send_task),
        "StepSender, one step now": each(lambda envelope: worker.send([envelope])),
        "send_task, one step, countdown 2 s": each(lambda envelope: send_task(envelope, 2.0)),
        "StepSender, one step, countdown 2 s": each(lambda envelope: worker.send([envelope], countdown=2.0)),
        f"StepSender, a batch of {args.messages}": lambda: gateway.send(envelopes),
        "StepSender, a batch of 1": each(lambda envelope: gateway.send([envelope])),
    }
    figures: dict[str, list[float]] = {name: [] for name in cases}
    try:
        for run in cases.values():  # warm up: connections, imports, caches
            run()
        _empty(client)
        for _round in range(args.rounds):
            for name, run in cases.items():
                cpu = time.process_time()
                run()
                figures[name].append((time.process_time() - cpu) / len(envelopes) * 1e6)
                _empty(client)
    finally:
        client.flushdb()
    tracing = "on" if args.tracing else "off"
    print(f"CPU per message, {args.messages} messages a case, {args.rounds} rounds, tracing {tracing}:")
    for name, values in figures.items():
        print(f"  {name:40s} {statistics.median(values):6.1f} µs (min {min(values):.1f})")
    return 0


def _claim_database(base: str) -> str:
    """The URL of an empty Redis database, marked as this run's so that no test run takes it meanwhile."""
    for index in range(15, 0, -1):
        client = redis.Redis.from_url(f"{base.rstrip('/')}/{index}")
        if client.dbsize() == 0 and client.set(_OWNER_KEY, "bench", nx=True, ex=3600) and client.dbsize() == 1:
            return f"{base.rstrip('/')}/{index}"
    raise SystemExit(f"no empty Redis database at {base}")


def _empty(client: redis.Redis) -> None:
    """Drop the messages sent, keeping the database this run's."""
    client.flushdb()
    client.set(_OWNER_KEY, "bench", ex=3600)


if __name__ == "__main__":
    raise SystemExit(main())
