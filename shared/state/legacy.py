"""The keys earlier releases named without hash tags, retired on upgrade.

A Redis that ran an earlier release holds its keys under untagged names (``aptix:turn:<id>:state``,
``aptix:inflight``, ``aptix:timers``, …). This release reads none of them: to it that Redis looks as
one restarted empty, which the checkpoints and the reconciler recover (``docs/operations.md``,
"Upgrading past the Redis key renames"). Two kinds of old keys would otherwise linger: the parked
timers (envelopes due later, which this release moves into its shards so that no wait restarts
from the reconciler's deadline) and the shared keys without an expiry (:data:`LEGACY_KEYS`, deleted).
Every other old key has a TTL and expires by itself.
"""

from __future__ import annotations

import logging

import redis

from shared.state.keys import LEGACY_KEYS, LEGACY_TIMERS_KEY, timer_shard
from shared.state.scripts import is_cluster

__all__ = ["retire_legacy_keys"]

logger = logging.getLogger(__name__)

_CHUNK = 1000


def retire_legacy_keys(client: redis.Redis) -> int:
    """Move the old parked timers into the timer shards and delete the old keys without expiry.

    Safe to run any number of times, by several processes at once (a timer moved twice is parked
    once: it is the same member of the same shard). Nothing to do on a Redis Cluster: earlier
    releases never ran on one.

    Returns:
        How many parked timers were moved.
    """
    if is_cluster(client):
        return 0
    moved = 0
    while True:
        entries: list[tuple[bytes, float]] = client.zrange(LEGACY_TIMERS_KEY, 0, _CHUNK - 1, withscores=True)  # type: ignore[assignment]  # redis-py's stubs do not know withscores
        if not entries:
            break
        pipe = client.pipeline(transaction=False)
        for member, due in entries:
            pipe.zadd(timer_shard(member.decode()), {member: due})
        pipe.zrem(LEGACY_TIMERS_KEY, *(member for member, _ in entries))
        pipe.execute()
        moved += len(entries)
    deleted = int(client.delete(*LEGACY_KEYS))
    if moved or deleted:
        logger.info("retired the Redis keys of an earlier release: %d parked timer(s) moved, %d key(s) deleted",
                    moved, deleted)  # fmt: skip
    return moved
