"""RedisStateStore: TurnState as one JSON value per turn, saved with optimistic concurrency (Lua CAS)."""

from __future__ import annotations

import redis

from shared.errors import StateConflict
from shared.state.keys import cancel_key, claim_key, state_key, version_key
from shared.state.turn_state import TurnState

__all__ = ["RedisStateStore"]



# One round trip each, atomically: a save is refused unless the stored version is the one the
# caller loaded; a lease is renewed or released only by its holder.
_SAVE = """
if (redis.call('get', KEYS[2]) or '0') ~= ARGV[1] then return 0 end
redis.call('set', KEYS[1], ARGV[2], 'EX', ARGV[4])
redis.call('set', KEYS[2], ARGV[3], 'EX', ARGV[4])
return 1
"""
_EXTEND = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('expire', KEYS[1], ARGV[2])
"""
_RELEASE = """
if redis.call('get', KEYS[1]) ~= ARGV[1] then return 0 end
return redis.call('del', KEYS[1])
"""


class RedisStateStore:
    """The production state store."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client
        self._save = client.register_script(_SAVE)
        self._extend = client.register_script(_EXTEND)
        self._release = client.register_script(_RELEASE)

    @classmethod
    def from_url(cls, url: str) -> RedisStateStore:
        """A store on a new connection pool to ``url``."""
        return cls(redis.Redis.from_url(url, health_check_interval=30))

    def load(self, turn_id: str) -> TurnState | None:
        raw = self._redis.get(state_key(turn_id))
        return None if raw is None else TurnState.model_validate_json(raw)

    def save(self, state: TurnState, *, ttl_seconds: int) -> None:
        expected = state.version
        state.version = expected + 1
        keys = [state_key(state.turn_id), version_key(state.turn_id)]
        saved = self._save(keys=keys, args=[str(expected), state.model_dump_json(), str(state.version), ttl_seconds])
        if not saved:
            state.version = expected
            raise StateConflict(f"turn {state.turn_id!r} was saved by someone else since version {expected}")

    def claim(self, turn_id: str, step_key: str, *, owner: str, ttl_seconds: int) -> bool:
        return bool(self._redis.set(claim_key(turn_id, step_key), owner, nx=True, ex=ttl_seconds))

    def extend(self, turn_id: str, step_key: str, *, owner: str, ttl_seconds: int) -> bool:
        return bool(self._extend(keys=[claim_key(turn_id, step_key)], args=[owner, ttl_seconds]))

    def release(self, turn_id: str, step_key: str, *, owner: str) -> None:
        self._release(keys=[claim_key(turn_id, step_key)], args=[owner])

    def mark_cancelled(self, turn_id: str, *, ttl_seconds: int) -> None:
        self._redis.set(cancel_key(turn_id), b"1", ex=ttl_seconds)

    def is_cancelled(self, turn_id: str) -> bool:
        return bool(self._redis.exists(cancel_key(turn_id)))

    def ping(self) -> bool:
        try:
            return bool(self._redis.ping())
        except redis.RedisError:
            return False
