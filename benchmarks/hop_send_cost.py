"""What the end of a hop costs on Redis: the state's save, the next step's message and the acknowledgement of
the message the step came in, as three round trips and as the one the save makes of them (issue 28).

Run from the repo root against a Redis server (two of its empty databases are used and flushed)::

    .venv/bin/python benchmarks/hop_send_cost.py                  # 2,000 hops per case and round
    .venv/bin/python benchmarks/hop_send_cost.py --hops 5000 --redis-url redis://host:6379

Cases, each hop on a turn of its own with a ~3 KB state (a server-tool turn's), the broker in another
database of the state store's server (as ``aptix bench`` runs it):

- apart (before): the save (``RedisStateStore.save``), then the message through ``StepSender.send`` (kombu's
  producer, one ``LPUSH``), then kombu's ack of the step's own message (a pipeline of ``ZREM`` and ``HDEL``);
- in the save: ``StepSender.push`` builds the message (kombu routes it, its ``LPUSH`` taken rather than sent),
  the save pushes it and acknowledges the step's message in its own script, and kombu's ack stays in memory.

Client CPU is this process's (``time.process_time``); Redis CPU is the server's (``INFO cpu``, the whole
server: keep it otherwise idle); wall is the time per hop. Each case runs ``--rounds`` times, interleaved;
the figures are the rounds' medians.
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
from shared.state import MemoryStateStore, RedisStateStore, TurnState
from shared.step_sender import CeleryBroker, StepSender, beside_state
from shared.task_names import StepName


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hops", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--redis-url", default="redis://127.0.0.1:6379")
    args = parser.parse_args()
    state_url, broker_url = _empty_databases(args.redis_url.rstrip("/"))
    settings = Settings(redis_url=state_url, broker_url=broker_url)
    app = create_producer(settings)
    broker = CeleryBroker(app, retry=False)
    beside = beside_state(state_url, broker_url)
    assert beside is not None
    sender = StepSender(
        broker, timers=MemoryStateStore(), park_after=30, pushes=lambda e, c: broker.push(e, c, db=beside.db)
    )
    store = RedisStateStore.from_url(state_url)
    broker_client = redis.Redis.from_url(broker_url)

    def apart(state: TurnState, envelope: TurnEnvelope, tag: str) -> None:
        store.save(state, ttl_seconds=300)
        sender.send([envelope])
        broker_client.pipeline().zrem("unacked_index", tag).hdel("unacked", tag).execute()  # kombu's ack

    def in_the_save(state: TurnState, envelope: TurnEnvelope, tag: str) -> None:
        store.save(state, ttl_seconds=300, push=sender.push(envelope, 0.0, tag))

    cases: dict[str, Callable[[TurnState, TurnEnvelope, str], None]] = {
        "apart: save, send, ack (3 round trips)": apart,
        "in the save: one script (1 round trip)": in_the_save,
    }
    figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
    try:
        for _ in range(args.rounds):
            for name, hop in cases.items():
                figures[name].append(_round(hop, args.hops, store.client, broker_client))
    finally:
        store.client.flushdb()
        broker_client.flushdb()
    print(f"{args.hops} hops per case, {args.rounds} interleaved rounds, medians (two databases of {args.redis_url})")
    print(f"{'case':42s} {'client CPU':>12s} {'Redis CPU':>12s} {'wall':>10s}")
    for name, rounds in figures.items():
        client, server, wall = (statistics.median(values) for values in zip(*rounds, strict=True))
        print(f"{name:42s} {client * 1e6:9.0f} µs {server * 1e6:9.0f} µs {wall * 1e6:7.0f} µs")


def _round(
    hop: Callable[[TurnState, TurnEnvelope, str], None], hops: int, state_client: redis.Redis, broker: redis.Redis
) -> tuple[float, float, float]:
    """One round of ``hops`` hops: (client CPU, Redis CPU, wall) per hop."""
    work = []
    for _ in range(hops):
        turn_id = f"turn_{uuid.uuid4().hex}"
        state = TurnState(
            turn_id=turn_id, session_id="s", org_id="o", user_id="u", new_session=True, user_input="x" * 200,
            output_text="z" * 800, history=[{"role": "user", "content": "y" * 100} for _ in range(15)],
        )  # fmt: skip
        tag = str(uuid.uuid4())
        broker.zadd("unacked_index", {tag: time.time()})
        broker.hset("unacked", tag, "x" * 600)  # the step's own message, held as kombu holds it
        work.append((state, TurnEnvelope(turn_id=turn_id, step=StepName.REASONER, hop=5, priority=3), tag))
    redis_before, cpu_before, wall_before = _redis_cpu(state_client), time.process_time(), time.perf_counter()
    for state, envelope, tag in work:
        hop(state, envelope, tag)
    wall, cpu, server = time.perf_counter() - wall_before, time.process_time() - cpu_before, _redis_cpu(state_client)
    assert broker.zcard("unacked_index") == 0, "every step's message acknowledged"
    broker.flushdb()
    state_client.flushdb()
    return cpu / hops, (server - redis_before) / hops, wall / hops


def _redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"]) + float(info["used_cpu_user"])


def _empty_databases(base: str) -> tuple[str, str]:
    free = [index for index in range(15, 0, -1) if redis.Redis.from_url(f"{base}/{index}").dbsize() == 0]
    if len(free) < 2:
        raise SystemExit(f"two empty databases are needed on {base}")
    return f"{base}/{free[0]}", f"{base}/{free[1]}"


if __name__ == "__main__":
    main()
