"""What the servers did for a batch: Redis commands and CPU by ``INFO``, PostgreSQL transactions by
``pg_stat_database``, each as the difference between a sample before the batch and one after it.

Redis's own counters say what a turn costs it wherever it runs (on this machine or not): ``INFO
commandstats`` counts every command, those a Lua script calls included (the scripts themselves under
``evalsha``), and ``INFO cpu`` the server's CPU (``used_cpu_sys`` + ``used_cpu_user``). The state
store and the broker are counted apart when they are separate servers, together when they are
databases of one server; a Redis Cluster is the sum over its nodes (``docs/scaling.md``). The
counters are the whole server's: anything else it serves meanwhile is counted too.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
import redis

from shared.state.scripts import is_cluster

__all__ = ["RedisSample", "RedisServer", "ServerFigures", "ServerStats", "pg_commits", "redis_figures"]


@dataclass(frozen=True, slots=True)
class RedisSample:
    """One Redis server's (or cluster's) counters at one moment."""

    calls: Counter[str]
    """Calls per command (lower case, ``evalsha`` for script runs)."""
    cpu_seconds: float


@dataclass(frozen=True, slots=True)
class RedisServer:
    """A Redis server the bench counts, under the role it plays (``state``, ``broker``, ``state+broker``)."""

    role: str
    client: redis.Redis

    def sample(self) -> RedisSample:
        """The server's counters now (every node's, summed, for a cluster)."""
        calls: Counter[str] = Counter()
        cpu = 0.0
        for info in _infos(self.client):
            cpu += float(info.get("used_cpu_sys", 0.0)) + float(info.get("used_cpu_user", 0.0))
            for name, value in info.items():
                if name.startswith("cmdstat_") and isinstance(value, Mapping):
                    calls[name.removeprefix("cmdstat_")] += int(value.get("calls", 0))
        return RedisSample(calls, cpu)


@dataclass(frozen=True, slots=True)
class ServerFigures:
    """Per item (a turn, a chain) of a batch: what each Redis server and PostgreSQL did."""

    redis: dict[str, tuple[float, float, dict[str, float]]]
    """Role -> (commands, CPU ms, the most called commands with their calls) per item."""
    pg_commits: float | None
    """PostgreSQL transactions committed in the scratch database per item (None: not counted)."""
    pg_rollbacks: float | None


class ServerStats:
    """Samples the servers before and after a batch.

    Args:
        servers: the Redis servers to count, by role.
        commits: reads (xact_commit, xact_rollback) of the scratch database; None: PostgreSQL is not counted.
        pg_settle_seconds: how long to wait before reading PostgreSQL's counters: a backend reports its
            transactions when it has been idle a while (up to 10 s after its last one, PostgreSQL 15+),
            so a read at once would miss the batch's last second or so, or count the previous batch's.
    """

    def __init__(
        self,
        servers: list[RedisServer],
        commits: Callable[[], tuple[int, int]] | None,
        *,
        pg_settle_seconds: float = 11.0,
    ) -> None:
        self._servers = servers
        self._commits = commits
        self._settle = pg_settle_seconds

    def sample(self) -> tuple[dict[str, RedisSample], tuple[int, int] | None]:
        """Every counter now: Redis's at once, PostgreSQL's after the settle time (nothing runs meanwhile)."""
        found = {server.role: server.sample() for server in self._servers}
        if self._commits is None:
            return found, None
        time.sleep(self._settle)
        return found, self._commits()

    def figures(
        self,
        before: tuple[dict[str, RedisSample], tuple[int, int] | None],
        after: tuple[dict[str, RedisSample], tuple[int, int] | None],
        items: int,
    ) -> ServerFigures:
        """What the servers did between ``before`` and ``after``, per item of ``items``."""
        per = max(items, 1)
        found = {role: redis_figures(before[0][role], sample, per) for role, sample in after[0].items()}
        commits = rollbacks = None
        if before[1] is not None and after[1] is not None:
            commits = (after[1][0] - before[1][0]) / per
            rollbacks = (after[1][1] - before[1][1]) / per
        return ServerFigures(found, commits, rollbacks)


def redis_figures(
    before: RedisSample, after: RedisSample, items: int, *, top: int = 4
) -> tuple[float, float, dict[str, float]]:
    """Commands, CPU ms and the ``top`` most called commands, per item, between two samples."""
    calls = after.calls - before.calls
    most = {name: count / items for name, count in calls.most_common(top)}
    return sum(calls.values()) / items, (after.cpu_seconds - before.cpu_seconds) * 1000 / items, most


def pg_commits(dsn: str, database: str) -> Callable[[], tuple[int, int]]:
    """A reader of ``database``'s committed and rolled back transactions (``pg_stat_database``)."""

    def read() -> tuple[int, int]:
        with psycopg.connect(dsn, autocommit=True) as conn:
            row = conn.execute(
                "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = %s", (database,)
            ).fetchone()
        return (int(row[0]), int(row[1])) if row else (0, 0)

    return read


def _infos(client: redis.Redis) -> list[dict[str, Any]]:
    """``INFO commandstats`` and ``INFO cpu`` of the server, or of each node of a cluster."""
    if not is_cluster(client):
        return [{**client.info("commandstats"), **client.info("cpu")}]
    infos = []
    for node in client.get_nodes():  # type: ignore[attr-defined]  # a RedisCluster
        stats = client.info("commandstats", target_nodes=node)
        infos.append({**stats, **client.info("cpu", target_nodes=node)})
    return infos
