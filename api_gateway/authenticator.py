"""The Authenticator: which caller a bearer key stands for, from ``APTIX_API_KEYS`` or the database's keys.

``APTIX_API_KEYS`` (read at start) is checked first. A key shaped like a database key
(``shared.api_keys``) is then looked up by its SHA-256, through two bounded memories of this
process (least recently used first out, ``APTIX_API_KEY_CACHE_SIZE`` entries each): keys accepted
and tokens refused. So a request costs one hash and a dictionary probe, and the database is asked:

- on a key's first use, and on its first use ``APTIX_API_KEY_VERIFY_SECONDS`` after it was last
  verified: one short transaction that also writes the key's ``last_used_at`` (so at most once an
  interval per key and gateway). While that lookup runs, the key's other requests go on with what
  was remembered;
- every ``APTIX_API_KEY_REFRESH_SECONDS`` by :meth:`Authenticator.refresh_forever`: one query for the
  version of ``api_keys`` (``shared.db.api_keys``), and when it moved, the hashes of the keys created
  or revoked since; those are forgotten, so their next use looks them up. A key created or revoked
  is honoured within about the refresh interval, on every gateway, without a restart.

When the database does not answer, a remembered key is accepted as it was (its expiry still
checked), and a key not remembered gets ``503 unavailable``; for a refresh interval after a failure
the database is not asked again. Nothing can be revoked meanwhile (a revocation is a write to the
same database): a gateway that alone lost the database applies what changed when it reaches it again.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Protocol

from prometheus_client import Counter
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.concurrency import run_in_threadpool

from api_gateway.errors import ApiError
from shared.api_keys import KEY_PATTERN, hash_key
from shared.db.api_keys import ApiKeyRecord, KeyChanges
from shared.settings import ApiKey

__all__ = ["OUTCOMES", "Authenticator", "KeyLookups"]

logger = logging.getLogger(__name__)

OUTCOMES = ("env", "remembered", "looked_up", "outage", "refused", "unavailable")
"""The ``outcome`` label of ``aptix_api_key_checks_total``: accepted from ``APTIX_API_KEYS``, from
memory, after a lookup, from memory while the database did not answer; refused (401); not
verifiable (503)."""

_DATABASE_DOWN = (OperationalError, InterfaceError, PoolTimeout)
_REASONS = {"unknown": "the API key is not valid", "revoked": "the API key was revoked",
            "expired": "the API key has expired"}  # fmt: skip


class KeyLookups(Protocol):
    """What the authenticator asks the database (``shared.db.api_keys.ApiKeyRepository``)."""

    def verify(self, key_hash: str, *, now: datetime, touch_before: datetime) -> ApiKeyRecord | None: ...

    def changes_since(self, version: int) -> KeyChanges: ...

    def any_accepted(self, now: datetime) -> bool: ...


@dataclass(slots=True)
class _Entry:
    """What this process remembers of a database key: whom it stands for, or why it is refused."""

    identity: ApiKey | None
    refusal: str | None
    expires_at: datetime | None
    verified: float
    """When (``monotonic``) the database last said so; ``-inf`` to look it up at its next use."""
    version: int | None = None
    """The version of the key's last change the database said it at (None: a token of no key)."""


class _Memory:
    """A bounded map of key hashes to entries; the least recently used goes first."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def get(self, key_hash: str) -> _Entry | None:
        entry = self._entries.get(key_hash)
        if entry is not None:
            self._entries.move_to_end(key_hash)
        return entry

    def put(self, key_hash: str, entry: _Entry) -> None:
        self._entries[key_hash] = entry
        self._entries.move_to_end(key_hash)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def peek(self, key_hash: str) -> _Entry | None:
        """The entry, without counting it as used."""
        return self._entries.get(key_hash)

    def pop(self, key_hash: str) -> None:
        self._entries.pop(key_hash, None)

    def clear(self) -> None:
        self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class Authenticator:
    """Checks bearer keys: ``APTIX_API_KEYS`` first, then the database's through bounded memories.

    Every method runs on the event loop; only the repository's calls go to worker threads, and what
    they return is applied back on the loop (the memories need no lock).

    Args:
        env_keys: the parsed ``APTIX_API_KEYS``.
        keys: the database's keys.
        cache_size: entries of each memory (``APTIX_API_KEY_CACHE_SIZE``).
        verify_seconds: how long a remembered answer is trusted (``APTIX_API_KEY_VERIFY_SECONDS``).
        refresh_seconds: how often the version is polled (``APTIX_API_KEY_REFRESH_SECONDS``); also how
            long the database is left alone after it failed.
        checks: ``aptix_api_key_checks_total``, labelled by outcome.
        clock: the wall clock (expiry, ``last_used_at``).
        monotonic: the interval clock.
    """

    def __init__(
        self,
        *,
        env_keys: dict[str, ApiKey],
        keys: KeyLookups,
        cache_size: int,
        verify_seconds: float,
        refresh_seconds: float,
        checks: Counter,
        clock: Callable[[], datetime],
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._env_keys = [(key.encode(), identity) for key, identity in env_keys.items()]
        self._keys = keys
        self._accepted = _Memory(cache_size)
        self._refused = _Memory(cache_size)
        self._verify_seconds = verify_seconds
        self._refresh_seconds = refresh_seconds
        self._checks = {outcome: checks.labels(outcome) for outcome in OUTCOMES}
        self._clock = clock
        self._monotonic = monotonic
        self._version: int | None = None
        """The ``api_key_version`` applied; None before the first refresh."""
        self._generation = 0
        """Bumped whenever entries are forgotten: a lookup that began before stores its answer unverified."""
        self._down_until = -float("inf")

    @property
    def has_env_keys(self) -> bool:
        """Whether ``APTIX_API_KEYS`` holds any key."""
        return bool(self._env_keys)

    async def authenticate(self, token: str) -> ApiKey:
        """The caller ``token`` stands for.

        Raises:
            ApiError: 401 ``unauthorized`` for a key not accepted (unknown, revoked, expired); 503
                ``unavailable`` for a database key this process does not remember while the database
                does not answer.
        """
        presented = token.encode()
        for key, identity in self._env_keys:
            if hmac.compare_digest(key, presented):
                self._checks["env"].inc()
                return identity
        if not KEY_PATTERN.fullmatch(token):
            raise self._refuse("unknown")
        key_hash = hash_key(token)
        now = self._monotonic()
        entry = self._accepted.get(key_hash) or self._refused.get(key_hash)
        if entry is not None and now - entry.verified < self._verify_seconds:
            return self._answer(key_hash, entry, "remembered")
        if entry is not None and now < self._down_until:
            return self._answer(key_hash, entry, "outage")
        if entry is None and now < self._down_until:
            raise self._unavailable()
        last_verified = now
        if entry is not None:
            last_verified, entry.verified = entry.verified, now  # its other requests go on with it meanwhile
        generation = self._generation
        try:
            record = await run_in_threadpool(self._verify, key_hash)
        except _DATABASE_DOWN:
            self._database_failed()
            if entry is None:
                raise self._unavailable() from None
            entry.verified = last_verified  # looked up again once the database is left alone no more
            return self._answer(key_hash, entry, "outage")
        verified = now if generation == self._generation else -float("inf")
        return self._answer(key_hash, self._remember(key_hash, record, verified), "looked_up")

    async def refresh(self) -> None:
        """Forget the keys created or revoked since the version this process applied (one query when none),
        unless this process looked one up after that change (a key created, then used at once).

        The first refresh only learns the version, and forgets everything remembered before it.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database did not answer (nothing is forgotten).
        """
        since = sys.maxsize if self._version is None else self._version
        try:
            changes: KeyChanges = await run_in_threadpool(self._keys.changes_since, since)
        except _DATABASE_DOWN:
            self._database_failed()
            raise
        self._down_until = -float("inf")
        if self._version is None:
            self._accepted.clear()
            self._refused.clear()
            self._generation += 1
        elif changes.key_versions:
            for key_hash, version in changes.key_versions.items():
                for memory in (self._accepted, self._refused):
                    entry = memory.peek(key_hash)
                    if entry is not None and (entry.version is None or entry.version < version):
                        memory.pop(key_hash)  # looked up before that change (a key that used to be unknown)
            self._generation += 1
        self._version = changes.version

    async def refresh_forever(self) -> None:
        """:meth:`refresh` every refresh interval, logging when the database stops and starts answering."""
        failing = False
        while True:
            await asyncio.sleep(self._refresh_seconds)
            try:
                await self.refresh()
            except Exception:  # a database outage must not end the refresh; remembered keys stay accepted
                if not failing:
                    logger.warning("API keys: the database did not answer; remembered keys stay accepted",
                                   exc_info=True)  # fmt: skip
                failing = True
                continue
            if failing:
                logger.info("API keys: the database answers again; created and revoked keys applied")
                failing = False

    def accepts_some_key(self) -> bool:
        """Whether some key could be accepted: one in ``APTIX_API_KEYS``, or a database key neither revoked
        nor expired (a database query; call it off the event loop).

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database did not answer.
        """
        return self.has_env_keys or self._keys.any_accepted(self._clock())

    def _verify(self, key_hash: str) -> ApiKeyRecord | None:
        """Runs on a worker thread."""
        now = self._clock()
        return self._keys.verify(key_hash, now=now, touch_before=now - timedelta(seconds=self._verify_seconds))

    def _remember(self, key_hash: str, record: ApiKeyRecord | None, verified: float) -> _Entry:
        if record is None:
            entry = _Entry(identity=None, refusal="unknown", expires_at=None, verified=verified)
        else:
            refusal = record.refusal(self._clock())
            identity = None if refusal else ApiKey(record.key_id, record.org_id, record.key_id)
            entry = _Entry(
                identity=identity, refusal=refusal, expires_at=record.expires_at, verified=verified,
                version=record.version,
            )  # fmt: skip
        if entry.identity is None:
            self._accepted.pop(key_hash)
            self._refused.put(key_hash, entry)
        else:
            self._refused.pop(key_hash)
            self._accepted.put(key_hash, entry)
        return entry

    def _answer(self, key_hash: str, entry: _Entry, outcome: str) -> ApiKey:
        if entry.identity is not None and entry.expires_at is not None and entry.expires_at <= self._clock():
            entry = replace(entry, identity=None, refusal="expired")
            self._accepted.pop(key_hash)
            self._refused.put(key_hash, entry)
        if entry.identity is None:
            raise self._refuse(entry.refusal or "unknown")
        self._checks[outcome].inc()
        return entry.identity

    def _refuse(self, reason: str) -> ApiError:
        self._checks["refused"].inc()
        return ApiError(401, "unauthorized", _REASONS[reason])

    def _unavailable(self) -> ApiError:
        self._checks["unavailable"].inc()
        return ApiError(
            503, "unavailable", "the database did not answer, so the API key cannot be verified now; retry shortly"
        )

    def _database_failed(self) -> None:
        self._down_until = self._monotonic() + self._refresh_seconds
