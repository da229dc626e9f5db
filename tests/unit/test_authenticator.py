"""The Authenticator: env keys, database keys through its bounded memories, refreshes and outages."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Coroutine
from datetime import datetime, timedelta
from typing import Any, TypeVar

import pytest
from sqlalchemy.exc import OperationalError

from api_gateway.authenticator import Authenticator
from api_gateway.errors import ApiError
from api_gateway.metrics import GatewayMetrics
from shared.db.api_keys import ApiKeyRecord, ApiKeyRepository, KeyChanges
from shared.settings import ApiKey, parse_api_keys
from tests.unit.fakes import Clock, sqlite_db

T = TypeVar("T")


class Ticks:
    """A settable monotonic clock."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Keys:
    """The repository on SQLite, which can be told to stop answering, and counts what it is asked."""

    def __init__(self) -> None:
        self.repository = ApiKeyRepository(sqlite_db())
        self.down = False
        self.verified = 0
        self.answered = threading.Event()
        """Set once a lookup has its answer (which it then holds until ``release`` is set)."""
        self.release: threading.Event | None = None

    def verify(self, key_hash: str, *, now: datetime, touch_before: datetime) -> ApiKeyRecord | None:
        self._answer()
        self.verified += 1
        record = self.repository.verify(key_hash, now=now, touch_before=touch_before)
        self.answered.set()
        if self.release is not None:
            self.release.wait(10)
        return record

    def changes_since(self, version: int) -> KeyChanges:
        self._answer()
        return self.repository.changes_since(version)

    def any_accepted(self, now: datetime) -> bool:
        self._answer()
        return self.repository.any_accepted(now)

    def _answer(self) -> None:
        if self.down:
            raise OperationalError("SELECT", {}, ConnectionRefusedError("the database is down"))


class Setup:
    def __init__(self, *, env: str = "", cache_size: int = 100) -> None:
        self.keys = Keys()
        self.clock = Clock()
        self.ticks = Ticks()
        self.metrics = GatewayMetrics()
        self.auth = Authenticator(
            env_keys=parse_api_keys(env), keys=self.keys, cache_size=cache_size, verify_seconds=60,
            refresh_seconds=1, checks=self.metrics.api_key_checks, clock=self.clock, monotonic=self.ticks,
        )  # fmt: skip

    def create(self, org_id: str = "acme", *, expires_in: timedelta | None = None) -> tuple[ApiKeyRecord, str]:
        expires_at = None if expires_in is None else self.clock.now + expires_in
        return self.keys.repository.create(org_id=org_id, name=None, expires_at=expires_at, now=self.clock.now)

    def check(self, token: str) -> ApiKey:
        return run(self.auth.authenticate(token))

    def refused(self, token: str) -> ApiError:
        with pytest.raises(ApiError) as caught:
            self.check(token)
        return caught.value

    def count(self, outcome: str) -> float:
        value = self.metrics.registry.get_sample_value("aptix_api_key_checks_total", {"outcome": outcome})
        return 0.0 if value is None else value


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


def test_an_env_key_stands_for_its_triple_and_is_named_by_its_position() -> None:
    setup = Setup(env="first-key:o1:u1,second-key:o2:u2")
    identity = setup.check("second-key")
    assert (identity.key_id, identity.org_id, identity.user_id) == ("env:2", "o2", "u2")
    assert setup.keys.verified == 0 and setup.count("env") == 1


def test_a_database_key_is_looked_up_once_then_remembered() -> None:
    setup = Setup()
    record, key = setup.create()
    first = setup.check(key)
    second = setup.check(key)
    assert (first.key_id, first.org_id, first.user_id) == (record.key_id, "acme", record.key_id)
    assert second.key_id == record.key_id
    assert setup.keys.verified == 1
    assert (setup.count("looked_up"), setup.count("remembered")) == (1, 1)


def test_a_token_not_shaped_like_a_key_is_refused_without_asking_the_database() -> None:
    setup = Setup()
    error = setup.refused("aptix_not-a-key")
    assert (error.status_code, error.code, error.message) == (401, "unauthorized", "the API key is not valid")
    assert setup.keys.verified == 0


def test_an_unknown_key_is_refused_and_remembered_as_refused() -> None:
    setup = Setup()
    unknown = "aptix_" + "0" * 48
    assert setup.refused(unknown).message == "the API key is not valid"
    assert setup.refused(unknown).status_code == 401
    assert setup.keys.verified == 1


def test_a_revoked_key_is_refused_after_the_next_refresh_and_only_it_is_looked_up_again() -> None:
    # Given two keys in use on a gateway that has learned the version
    setup = Setup()
    revoked, key = setup.create()
    _, other = setup.create("other")
    run(setup.auth.refresh())
    setup.check(key)
    setup.check(other)
    # When one is revoked
    setup.keys.repository.revoke(revoked.key_id, now=setup.clock.now)
    assert setup.check(key).org_id == "acme"  # remembered until the gateway refreshes
    run(setup.auth.refresh())
    # Then it is refused at its next use, and the other is still remembered (no lookup)
    assert setup.refused(key).message == "the API key was revoked"
    assert setup.check(other).org_id == "other"
    assert setup.keys.verified == 3


def test_a_refresh_that_finds_no_change_forgets_nothing() -> None:
    setup = Setup()
    run(setup.auth.refresh())
    _, key = setup.create()
    setup.check(key)
    run(setup.auth.refresh())  # reports the key's creation, which this gateway looked up after it
    setup.check(key)
    run(setup.auth.refresh())
    run(setup.auth.refresh())
    setup.check(key)
    assert setup.keys.verified == 1


def test_a_key_used_as_soon_as_created_is_still_accepted_when_the_database_stops_after_the_refresh() -> None:
    # Given a gateway that looked a new key up before its refresh reported the key's creation
    setup = Setup()
    run(setup.auth.refresh())
    _, key = setup.create()
    assert setup.check(key).org_id == "acme"
    run(setup.auth.refresh())
    # When the database stops answering
    setup.keys.down = True
    # Then the key is accepted from memory, not refused 503 for want of a lookup
    assert setup.check(key).org_id == "acme"
    assert setup.keys.verified == 1


def test_an_expired_key_is_refused_and_a_remembered_one_stops_when_it_expires() -> None:
    setup = Setup()
    _, expired = setup.create(expires_in=timedelta(seconds=-1))
    assert setup.refused(expired).message == "the API key has expired"
    _, key = setup.create(expires_in=timedelta(minutes=5))
    assert setup.check(key).org_id == "acme"
    setup.clock.now += timedelta(minutes=5)
    assert setup.refused(key).message == "the API key has expired"


def test_a_remembered_key_is_verified_again_after_the_interval_and_its_last_use_written_then() -> None:
    setup = Setup()
    record, key = setup.create()
    setup.check(key)
    used = setup.keys.repository.find_all()[0].last_used_at
    assert used == setup.clock.now
    setup.clock.now += timedelta(seconds=30)
    setup.ticks.now += 30
    setup.check(key)
    assert setup.keys.verified == 1 and setup.keys.repository.find_all()[0].last_used_at == used
    setup.clock.now += timedelta(seconds=31)
    setup.ticks.now += 31
    setup.check(key)
    assert setup.keys.verified == 2 and setup.keys.repository.find_all()[0].last_used_at == setup.clock.now
    assert record.key_id == setup.keys.repository.find_all()[0].key_id


def test_a_remembered_key_is_accepted_while_the_database_is_down_and_an_unknown_one_is_503() -> None:
    setup = Setup()
    _, key = setup.create()
    _, other = setup.create("other")
    setup.check(key)
    # When the database stops answering and the key's verification falls due
    setup.keys.down = True
    setup.ticks.now += 61
    # Then the key is still accepted, from memory
    assert setup.check(key).org_id == "acme"
    assert setup.count("outage") == 1
    with pytest.raises(OperationalError):
        run(setup.auth.refresh())
    assert setup.check(key).org_id == "acme"
    # and a key never seen cannot be verified: 503, not 401
    error = setup.refused(other)
    assert (error.status_code, error.code) == (503, "unavailable")
    # When the database answers again, both are verified as usual
    setup.keys.down = False
    setup.ticks.now += 2
    assert setup.check(other).org_id == "other"
    assert setup.check(key).org_id == "acme"


def test_the_memory_of_accepted_keys_is_bounded_least_recently_used_first() -> None:
    setup = Setup(cache_size=2)
    keys = [setup.create()[1] for _ in range(3)]
    for key in keys:
        setup.check(key)
    assert setup.keys.verified == 3
    setup.check(keys[2])
    setup.check(keys[1])
    assert setup.keys.verified == 3
    setup.check(keys[0])  # forgotten: the least recently used
    assert setup.keys.verified == 4


def test_a_lookup_that_began_before_a_refresh_is_verified_again_at_its_next_use() -> None:
    # Given a gateway that has learned the version, and a lookup that has read the key as valid
    setup = Setup()
    record, key = setup.create()
    run(setup.auth.refresh())
    release = setup.keys.release = threading.Event()

    async def race() -> None:
        lookup = asyncio.ensure_future(setup.auth.authenticate(key))
        await asyncio.to_thread(setup.keys.answered.wait, 10)
        # When the key is revoked and a refresh applies it before the lookup's answer is kept
        setup.keys.repository.revoke(record.key_id, now=setup.clock.now)
        await setup.auth.refresh()
        release.set()
        assert (await lookup).org_id == "acme"

    run(race())
    # Then the racing answer is not trusted: the key's next use looks it up again, and is refused
    assert setup.refused(key).message == "the API key was revoked"


def test_some_key_is_accepted_when_the_env_has_one_or_the_database_has_a_live_one() -> None:
    assert Setup(env="k:o:u").auth.accepts_some_key()
    setup = Setup()
    assert not setup.auth.accepts_some_key()
    record, _ = setup.create()
    assert setup.auth.accepts_some_key()
    setup.keys.repository.revoke(record.key_id, now=setup.clock.now)
    assert not setup.auth.accepts_some_key()
