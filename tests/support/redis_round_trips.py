"""A Redis client that counts its round trips, for tests that hold a write to a round-trip budget."""

from __future__ import annotations

from typing import Any

import redis

__all__ = ["CountingRedis"]


class CountingRedis(redis.Redis):
    """A Redis client that counts its round trips: each command, and each pipeline as one."""

    round_trips = 0

    def execute_command(self, *args: Any, **options: Any) -> Any:
        self.round_trips += 1
        return super().execute_command(*args, **options)

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Any:
        pipe = super().pipeline(transaction, shard_hint)
        execute = pipe.execute

        def counted(raise_on_error: bool = True) -> Any:
            self.round_trips += 1
            return execute(raise_on_error)

        pipe.execute = counted  # type: ignore[method-assign]
        return pipe
