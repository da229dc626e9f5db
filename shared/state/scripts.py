"""Pipelines of Lua scripts and commands that work on one Redis and on Redis Cluster alike.

A turn's hot path sends one round trip per state write; where one write must touch keys of two
slots (a turn's last save also frees its organisation's admission slot), its parts go in one
pipeline: one round trip on a single Redis, one per node on a cluster (redis-py sends them to
each node at once). Scripts go as ``EVALSHA`` (redis-py's cluster pipeline takes them only as raw
commands), and a script a node does not have yet (a new node, a promoted replica, a flushed cache)
is loaded and run again by itself: ``NOSCRIPT`` means it did not run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.commands.core import Script
from redis.exceptions import NoScriptError

__all__ = ["Call", "ScriptCall", "is_cluster", "pipelined"]


@dataclass(frozen=True, slots=True)
class ScriptCall:
    """One run of ``script`` on ``keys`` (all in one slot) with ``args``."""

    script: Script
    keys: Sequence[str]
    args: Sequence[str | int | float]


Call = ScriptCall | tuple[Any, ...]
"""A script run, or a plain command as its words (``("LPUSH", key, "1")``)."""


def is_cluster(client: Any) -> bool:
    """Whether ``client`` is a Redis Cluster client (``redis.cluster.RedisCluster``)."""
    from redis.cluster import RedisCluster

    return isinstance(client, RedisCluster)


def pipelined(client: redis.Redis, calls: Sequence[Call]) -> list[Any]:
    """Send ``calls`` in one non-transactional pipeline and return their replies in order.

    Each call is atomic by itself; the pipeline is not (on a cluster its parts run on different nodes).
    A script a node did not have is loaded and run again alone, after the others.

    Raises:
        redis.RedisError: the first reply that was an error (the other calls ran).
    """
    pipe = client.pipeline(transaction=False)
    cluster = is_cluster(client)
    for call in calls:
        if isinstance(call, ScriptCall):
            words = ("EVALSHA", call.script.sha, len(call.keys), *call.keys, *call.args)
            if cluster and call.keys:
                # Named node: redis-py's cluster pipeline would otherwise ask a node (COMMAND GETKEYS) where an
                # EVALSHA's keys are, a round trip per script (after a MOVED it asks, and follows, by itself).
                node = client.get_node_from_key(call.keys[0])  # type: ignore[attr-defined]
                pipe.execute_command(*words, target_nodes=node)  # type: ignore[no-untyped-call]
            else:
                pipe.execute_command(*words)  # type: ignore[no-untyped-call]
        else:
            pipe.execute_command(*call)  # type: ignore[no-untyped-call]
    replies = pipe.execute(raise_on_error=False)
    for index, reply in enumerate(replies):
        call = calls[index]
        if isinstance(reply, NoScriptError) and isinstance(call, ScriptCall):
            replies[index] = call.script(keys=list(call.keys), args=list(call.args))
    for reply in replies:
        if isinstance(reply, Exception):
            raise reply
    return list(replies)
