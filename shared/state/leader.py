"""LeaderLease: one active copy among many (the reconciler's, the admission scheduler's), chosen through Redis.

Each copy calls :meth:`LeaderLease.hold` about once per period: the holder's call renews the lease,
another copy's takes it only once it lapsed (its holder stopped or died). A copy that stalls past
the lease's time may find another copy leading when it wakes: every user of the lease keeps its work
safe for two copies at once, so the lease only saves duplicated effort.
"""

from __future__ import annotations

from typing import Protocol

import redis

__all__ = ["Leader", "LeaderLease"]

_LEAD = """
local holder = redis.call('get', KEYS[1])
if holder == ARGV[1] then redis.call('pexpire', KEYS[1], ARGV[2]) return 1 end
if not holder then redis.call('set', KEYS[1], ARGV[1], 'PX', ARGV[2]) return 1 end
return 0
"""


class Leader(Protocol):
    """The port of a copy that leads only while it holds the lease (the reconciler's, the scheduler's)."""

    @property
    def owner(self) -> str:
        """This copy's name in the lease."""

    def hold(self, ttl_seconds: float) -> bool:
        """Take or renew the lease for ``ttl_seconds``; whether this copy holds it."""

    def give_up(self) -> None:
        """Let the lease go at once if this copy holds it."""


class LeaderLease:
    """The lease ``key`` as copy ``owner`` sees it."""

    def __init__(self, client: redis.Redis, *, key: str, owner: str) -> None:
        self._client = client
        self._key = key
        self.owner = owner
        self._script = client.register_script(_LEAD)

    def hold(self, ttl_seconds: float) -> bool:
        """Take or renew the lease for ``ttl_seconds``; whether this copy holds it (one Redis round trip)."""
        return bool(self._script(keys=[self._key], args=[self.owner, int(ttl_seconds * 1000)]))

    def give_up(self) -> None:
        """Let the lease go at once if this copy holds it (a clean stop: another copy leads without waiting)."""
        if self._client.get(self._key) == self.owner.encode():
            self._client.delete(self._key)
