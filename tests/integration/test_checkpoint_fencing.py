"""A stale worker's checkpoint never puts a turn back (issue 25: a worker host cut off for 30 s comes back);
a checkpoint pushes its turn's deadline, and on PostgreSQL costs one round trip (issue 28).

The worker that held a step when its host was cut off loses the step's lease; another worker runs the
step again and carries the turn on, checkpointing it further (or to its commit point). When the first
worker's network heals, it finishes the step it still holds and checkpoints it: that checkpoint got
less far and must not replace the newer one (its Redis save is refused by the state's version; the
database checkpoint had no such guard). On PostgreSQL and on SQLite, whose SQL differ.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import timedelta

import pytest
from sqlalchemy import Engine, create_engine
from sqlalchemy.pool import StaticPool

from shared.db.engine import normalise_database_url, session_factory
from shared.db.turns import NewTurn, TurnRepository
from tests.support.pg_trace import traced
from tests.unit.fakes import FIXED_NOW, sqlite_engine

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
def turns(request: pytest.FixtureRequest) -> Iterator[tuple[TurnRepository, str]]:
    """A running turn on a repository of each kind: (the repository, the turn's id)."""
    engine: Engine = (
        create_engine(normalise_database_url(request.getfixturevalue("database_url")))
        if request.param == "postgresql"
        else sqlite_engine()
    )
    repository = TurnRepository(session_factory(engine))
    yield repository, _running_turn(repository)
    engine.dispose()


def _running_turn(repository: TurnRepository) -> str:
    turn_id = f"turn_{uuid.uuid4().hex}"
    repository.create(
        NewTurn(turn_id=turn_id, session_id=f"sess_{uuid.uuid4().hex}", org_id="o", user_id="u", new_session=True,
                requested_mode=None, request={"input": "q"}, request_hash="h"),
        now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
    )  # fmt: skip
    repository.mark_running(turn_id, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))
    return turn_id


def _state(steps: int, marker: str) -> dict[str, object]:
    return {"marker": marker, "steps_done": {f"0:{hop}:step:0": None for hop in range(steps)}}


def test_a_late_checkpoint_from_a_stale_worker_leaves_the_newer_one(turns: tuple[TurnRepository, str]) -> None:
    repository, turn_id = turns
    # Given the worker that took the step over checkpointed the turn after 5 steps
    later = FIXED_NOW + timedelta(seconds=40)
    repository.checkpoint(turn_id, _state(5, "taken over"), now=later, deadline_at=later + timedelta(seconds=60))

    # When the stale worker comes back and checkpoints the step it held, after 3 steps
    after = later + timedelta(seconds=5)
    repository.checkpoint(turn_id, _state(3, "stale"), now=after, deadline_at=after + timedelta(seconds=60))

    # Then the newer checkpoint stands
    snapshot = repository.load_snapshot(turn_id)
    assert snapshot is not None and snapshot["marker"] == "taken over"


def test_a_checkpoint_that_got_as_far_or_further_replaces_the_stored_one(turns: tuple[TurnRepository, str]) -> None:
    repository, turn_id = turns
    # Given a checkpoint after 3 steps
    repository.checkpoint(turn_id, _state(3, "first"), now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))

    # When the same step's result is checkpointed again, then the turn's next checkpoint
    repository.checkpoint(turn_id, _state(3, "again"), now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))
    again = repository.load_snapshot(turn_id)
    repository.checkpoint(turn_id, _state(6, "next"), now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))

    # Then each replaced the one before
    snapshot = repository.load_snapshot(turn_id)
    assert again is not None and again["marker"] == "again"
    assert snapshot is not None and snapshot["marker"] == "next"


def test_a_checkpoint_pushes_its_turns_deadline_even_when_a_newer_checkpoint_stands(
    turns: tuple[TurnRepository, str],
) -> None:
    repository, turn_id = turns
    # Given a checkpoint after 5 steps
    repository.checkpoint(turn_id, _state(5, "newer"), now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))
    # When a checkpoint that got less far comes later (the turn is still moving: its worker is alive)
    later = FIXED_NOW + timedelta(seconds=30)
    repository.checkpoint(turn_id, _state(2, "stale"), now=later, deadline_at=later + timedelta(seconds=60))
    # Then the deadline moved, and the newer checkpoint stands
    record = repository.get(turn_id)
    assert record is not None and record.deadline_at == later + timedelta(seconds=60)
    snapshot = repository.load_snapshot(turn_id)
    assert snapshot is not None and snapshot["marker"] == "newer"


def test_a_checkpoint_on_postgresql_is_one_round_trip(database_url: str) -> None:
    # Given a running turn on PostgreSQL, its repository on one connection whose messages libpq traces
    engine = create_engine(normalise_database_url(database_url), poolclass=StaticPool)
    repository = TurnRepository(session_factory(engine))
    turn_id = _running_turn(repository)
    try:
        # When the turn is checkpointed
        deadline = FIXED_NOW + timedelta(seconds=90)
        with traced(engine) as sent:
            repository.checkpoint(turn_id, _state(4, "traced"), now=FIXED_NOW, deadline_at=deadline)
        # Then the client sent one statement and waited once (no BEGIN, no COMMIT)
        assert (sent.round_trips, sent.transactions) == (1, 0), sent.messages
        # And both writes landed
        record = repository.get(turn_id)
        assert record is not None and record.deadline_at == deadline
        snapshot = repository.load_snapshot(turn_id)
        assert snapshot is not None and snapshot["marker"] == "traced"
    finally:
        engine.dispose()
