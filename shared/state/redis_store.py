"""RedisStateStore: TurnState as one JSON value per turn, saved with optimistic concurrency."""

from __future__ import annotations

import redis

from shared.errors import StateConflict
from shared.state.keys import cancel_key, claim_key, state_key
from shared.state.turn_state import TurnState

__all__ = ["RedisStateStore"]



class RedisStateStore:
    """The production state store."""

    def __init__(self, client: redis.Redis) -> None:
        self._redis = client

    @classmethod
    def from_url(cls, url: str) -> RedisStateStore:
        """A store on a new connection pool to ``url``."""
        return cls(redis.Redis.from_url(url, health_check_interval=30))

    def load(self, turn_id: str) -> TurnState | None:
        raw = self._redis.get(state_key(turn_id))
        return None if raw is None else TurnState.model_validate_json(raw)

    def save(self, state: TurnState, *, ttl_seconds: int) -> None:
        key = state_key(state.turn_id)
        expected = state.version
        with self._redis.pipeline() as pipe:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]  # redis-py leaves watch untyped
                raw = pipe.get(key)
                current = None if raw is None else TurnState.model_validate_json(raw).version
                if current is not None and current != expected:
                    raise StateConflict(f"turn {state.turn_id!r} moved from version {expected} to {current}")
                state.version = expected + 1
                pipe.multi()
                pipe.set(key, state.model_dump_json(), ex=ttl_seconds)
                pipe.execute()
            except redis.WatchError as exc:
                state.version = expected
                raise StateConflict(f"turn {state.turn_id!r} was saved concurrently") from exc
            except StateConflict:
                state.version = expected
                raise

    def claim(self, turn_id: str, step_key: str, *, owner: str, ttl_seconds: int) -> bool:
        return bool(self._redis.set(claim_key(turn_id, step_key), owner, nx=True, ex=ttl_seconds))

    def extend(self, turn_id: str, step_key: str, *, owner: str, ttl_seconds: int) -> bool:
        key = claim_key(turn_id, step_key)
        with self._redis.pipeline() as pipe:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]  # redis-py leaves watch untyped
                if pipe.get(key) != owner.encode():
                    return False
                pipe.multi()
                pipe.expire(key, ttl_seconds)
                pipe.execute()
                return True
            except redis.WatchError:
                return False

    def release(self, turn_id: str, step_key: str, *, owner: str) -> None:
        key = claim_key(turn_id, step_key)
        with self._redis.pipeline() as pipe:
            try:
                pipe.watch(key)  # type: ignore[no-untyped-call]  # redis-py leaves watch untyped
                if pipe.get(key) == owner.encode():
                    pipe.multi()
                    pipe.delete(key)
                    pipe.execute()
            except redis.WatchError:
                pass  # someone else took the lease after ours expired; theirs stays

    def mark_cancelled(self, turn_id: str, *, ttl_seconds: int) -> None:
        self._redis.set(cancel_key(turn_id), b"1", ex=ttl_seconds)

    def is_cancelled(self, turn_id: str) -> bool:
        return bool(self._redis.exists(cancel_key(turn_id)))

    def ping(self) -> bool:
        try:
            return bool(self._redis.ping())
        except redis.RedisError:
            return False
