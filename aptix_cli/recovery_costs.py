"""``aptix bench --recovery-costs``: what the recovery machinery costs, measured on the configured services.

Prints, on the database and Redis of ``APTIX_DATABASE_URL`` / ``APTIX_REDIS_URL`` (a scratch SQLite
file and the embedded Redis when unset):

- one durable checkpoint (the turn's state after a model answer) and one server tool's started and
  outcome records: wall time and this process's CPU per write;
- one reconciler scan over turns past their deadline, per turn checked: CPU, Redis and database round
  trips, once for turns that are still moving (their deadline moves up) and once for stalled turns
  (re-driven).

The turns it creates use ids of their own and are deleted afterwards; messages it would re-send go
to a counter, not to the broker.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from sqlalchemy import delete

from shared.db import create_db_engine, session_factory
from shared.db.migrate import upgrade
from shared.db.tables import ProviderSnapshotRow, ToolRunRow, TurnRow
from shared.db.tool_runs import ToolRunRepository
from shared.db.turns import NewTurn, TurnRepository
from shared.logging import configure_logging
from shared.models.envelope import TurnEnvelope
from shared.settings import Settings
from shared.state import RedisStateStore, TurnState
from shared.state.keys import RECONCILER_LEADER_KEY, state_key
from shared.state.leader import LeaderLease
from shared.step_sender import StepSender
from shared.task_names import StepName
from shared.turn_ending import TurnEnding
from workers.context import utc_now
from workers.metrics import WorkerMetrics
from workers.reconciler import Reconciler

__all__ = ["run_recovery_costs"]


def run_recovery_costs(*, turns: int = 500, writes: int = 300) -> int:
    """Measure and print."""
    configure_logging("ERROR")
    folder = tempfile.mkdtemp(prefix="aptix-costs-")
    database_url = os.environ.get("APTIX_DATABASE_URL") or f"sqlite:///{folder}/costs.sqlite"
    embedded = None
    redis_url = os.environ.get("APTIX_REDIS_URL")
    if not redis_url:
        from aptix_cli.embedded_redis import EmbeddedRedis

        embedded = EmbeddedRedis()
        embedded.__enter__()
        redis_url = embedded.url(0)
    settings = Settings(database_url=database_url, redis_url=redis_url)
    upgrade(database_url)
    engine = create_db_engine(database_url)
    db = session_factory(engine)
    repo, tool_runs = TurnRepository(db), ToolRunRepository(db)
    store = RedisStateStore.from_url(redis_url)
    run = uuid.uuid4().hex[:8]
    ids = [f"turn_{run}{index:024d}" for index in range(max(turns, writes))]
    now = datetime.now(UTC)
    for turn_id in ids:
        repo.create(
            NewTurn(turn_id=turn_id, session_id=f"sess_{turn_id[5:]}", org_id="costs", user_id="costs",
                    new_session=True, requested_mode=None, request={"input": "x"}, request_hash="h"),
            now=now, deadline_at=now - timedelta(seconds=1),
        )  # fmt: skip
        repo.mark_running(turn_id, now=now, deadline_at=now - timedelta(seconds=1))
    state = _typical_state(ids[0])
    _say(f"aptix bench --recovery-costs on {engine.dialect.name} and {'embedded' if embedded else 'real'} Redis")
    try:
        blob = state.checkpoint()
        per = _timed(writes, lambda i: repo.checkpoint(ids[i], blob, now=now, deadline_at=now - timedelta(seconds=1)))
        _say(f"  checkpoint after a model answer ({len(state.model_dump_json())} B of state): {per}")

        def tool_records(i: int) -> None:
            tool_runs.start(turn_id=ids[i], call_id="call_1", name="t", worker="costs", now=now)
            tool_runs.finish(turn_id=ids[i], call_id="call_1", status="succeeded", output="ok", now=now)

        _say(f"  server tool started + outcome records:                  {_timed(writes, tool_records)}")
        sent = _Counted()
        ending = TurnEnding(turns=repo, cancel_flags=store, in_flight=store, metrics=WorkerMetrics(), clock=utc_now)
        reconciler = Reconciler(
            settings=settings, turns=repo, states=store, in_flight=store, ending=ending,
            leader=LeaderLease(store.client, key=RECONCILER_LEADER_KEY, owner=f"costs-{run}"),
            steps=StepSender(sent, timers=store, park_after=30),
        )  # fmt: skip
        scanned = ids[:turns]
        repo.set_deadlines({turn_id: now + timedelta(hours=1) for turn_id in ids[turns:]})  # only ``turns`` are due
        store.mark_alive(scanned, until=time.time() + 3600)
        _say(f"  reconciler scan, {turns} overdue turns still moving:     {_scan(reconciler, turns)}")
        store.forget_all()
        repo.set_deadlines({turn_id: now - timedelta(seconds=1) for turn_id in scanned})
        _say(f"  reconciler scan, {turns} stalled turns re-driven:        {_scan(reconciler, turns)}")
        _say(f"  (messages the stalled scan would have sent: {len(sent)})")
    finally:
        with db.begin() as session:
            for table in (ToolRunRow, ProviderSnapshotRow, TurnRow):
                session.execute(delete(table).where(table.turn_id.in_(ids)))
        store.forget_all()
        store.client.delete(*[state_key(turn_id) for turn_id in ids[:1]])
        engine.dispose()
        if embedded is not None:
            embedded.__exit__(None, None, None)
    return 0


class _Counted(list[TurnEnvelope]):
    """The broker the measured reconciler sends to: it keeps the envelopes."""

    def publish(self, envelopes: Sequence[TurnEnvelope], *, countdown: float) -> None:
        self.extend(envelopes)


def _timed(count: int, action: Callable[[int], None]) -> str:
    wall, cpu = time.perf_counter(), time.process_time()
    for index in range(count):
        action(index)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return f"{wall / count * 1000:.2f} ms wall, {cpu / count * 1000:.2f} ms CPU each"


def _scan(reconciler: Reconciler, turns: int) -> str:
    before = (reconciler.stats.cpu_seconds, reconciler.stats.redis_calls, reconciler.stats.db_calls)
    wall = time.perf_counter()
    reconciler.scan()
    wall = time.perf_counter() - wall
    cpu, redis_calls, db_calls = (
        after - then
        for after, then in zip(
            (reconciler.stats.cpu_seconds, reconciler.stats.redis_calls, reconciler.stats.db_calls),
            before,
            strict=True,
        )
    )
    return (
        f"{cpu / turns * 1e6:.0f} µs CPU, {redis_calls / turns:.2f} Redis + {db_calls / turns:.2f} database "
        f"round trips per turn ({wall * 1000:.0f} ms wall in all)"
    )


def _typical_state(turn_id: str) -> TurnState:
    """A turn's state right after its first model answer asked for one server tool."""
    state = TurnState(
        turn_id=turn_id, session_id="sess_x", org_id="costs", user_id="costs", new_session=True, mode="general",
        user_input="What time is it in Lisbon? " * 4,
        transcript=[{"type": "message", "role": "user", "content": "What time is it in Lisbon? " * 4}],
        last_response={"response_id": "resp_1", "output_text": None, "input_tokens": 120, "output_tokens": 20,
                       "function_calls": [{"call_id": "call_1", "name": "get_current_time", "arguments": "{}"}],
                       "output_items": [{"type": "function_call", "call_id": "call_1", "name": "get_current_time",
                                         "arguments": "{}"}]},
        next_envelope=TurnEnvelope(turn_id=turn_id, step=StepName.REASONER, hop=9, iteration=1).model_dump(mode="json"),
    )  # fmt: skip
    for hop in range(9):
        state.steps_done[f"0:{hop}:step:0"] = {"turn_id": turn_id, "step": "reasoner", "hop": hop + 1}
        state.record("step", at=datetime.now(UTC), step="step", worker="w@host", duration_ms=1.0)
    return state


def _say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()
