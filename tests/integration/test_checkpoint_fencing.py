"""A stale worker's checkpoint never puts a turn back (issue 25: a worker host cut off for 30 s comes back).

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

from shared.db.engine import normalise_database_url, session_factory
from shared.db.turns import NewTurn, TurnRepository
from tests.unit.fakes import FIXED_NOW, sqlite_engine

pytestmark = pytest.mark.integration


@pytest.fixture(params=["postgresql", "sqlite"])
def turns(request: pytest.FixtureRequest) -> Iterator[tuple[TurnRepository, str]]:
    """A running turn on a repository of each kind: (the repository, the turn's id)."""
    turn_id = f"turn_{uuid.uuid4().hex}"
    engine: Engine = (
        create_engine(normalise_database_url(request.getfixturevalue("database_url")))
        if request.param == "postgresql"
        else sqlite_engine()
    )
    repository = TurnRepository(session_factory(engine))
    repository.create(
        NewTurn(turn_id=turn_id, session_id=f"sess_{uuid.uuid4().hex}", org_id="o", user_id="u", new_session=True,
                requested_mode=None, request={"input": "q"}, request_hash="h"),
        now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60),
    )  # fmt: skip
    repository.mark_running(turn_id, now=FIXED_NOW, deadline_at=FIXED_NOW + timedelta(seconds=60))
    yield repository, turn_id
    engine.dispose()


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
