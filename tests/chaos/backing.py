"""The services under a chaos fault: a Redis of its own and a PostgreSQL database of its own.

The machine's shared Redis (6379) is never touched: each fault runs its own ``redis-server`` child
on a free port (state on db 0, broker on db 1), which the redis_restart fault shuts down and
starts again; or, for the Sentinel fault, a :class:`SentinelRedis`: a primary, a replica and three
sentinels, each a ``redis-server`` child on a free port of loopback. The database lives on the
machine's PostgreSQL server, is created and migrated for the fault and dropped (``WITH (FORCE)``) at
the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import uuid
from pathlib import Path

import psycopg
import redis

from aptix_cli.launcher import ManagedProcess, free_port, wait_until
from shared.redis_clients import redis_client
from tests.chaos.processes import spawn
from tests.services_check import database_admin_url

__all__ = ["SENTINEL_MASTER", "Database", "RedisServer", "SentinelRedis"]

logger = logging.getLogger(__name__)


class RedisServer:
    """A ``redis-server`` child without persistence, restartable on the same port."""

    def __init__(self, *, log_dir: Path) -> None:
        self.port = free_port()
        self._log_dir = log_dir
        self._data_dir = log_dir / "redis-data"
        self._data_dir.mkdir(exist_ok=True)
        self._process: ManagedProcess | None = None
        self._generation = 0

    def url(self, db: int) -> str:
        """The URL of database ``db``."""
        return f"redis://127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        """Start the server (again) on its port and wait until it answers PING."""
        self._generation += 1
        argv = [
            _redis_server(), "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
            "--appendonly", "no", "--dir", str(self._data_dir), "--daemonize", "no",
        ]  # fmt: skip
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        self._process = spawn(f"redis-{self._generation}", argv, env=env, log_dir=self._log_dir)
        wait_until([self._process], self._answers, 20)

    def shutdown_nosave(self) -> None:
        """``SHUTDOWN NOSAVE``: the server exits and everything it held is gone."""
        client = redis_client(self.url(0), socket_timeout=5)
        try:
            client.shutdown(nosave=True)
        except redis.ConnectionError:
            pass  # the server closed the connection as it exited, as SHUTDOWN does
        finally:
            client.close()
        if self._process is not None:
            self._process.popen.wait(timeout=20)
            self._process.kill()

    def stop(self) -> None:
        """Kill the server if it runs."""
        if self._process is not None:
            self._process.kill()
            self._process = None

    def _answers(self) -> bool:
        return _answers(self.port)


SENTINEL_MASTER = "aptix"
"""The name the sentinels of a :class:`SentinelRedis` monitor its primary under."""
_DOWN_AFTER_MS = 2000
"""A primary that has not answered a sentinel for this long is down (FIELD-NOTES: promotion in ~10 s)."""


class SentinelRedis:
    """A Sentinel-managed Redis on loopback: a primary, one replica and three sentinels (quorum 2), each a
    ``redis-server`` child on a free port, without persistence; ended by their process groups."""

    def __init__(self, *, log_dir: Path) -> None:
        self._log_dir = log_dir
        self.node_ports = [free_port(), free_port()]
        """The two data nodes' ports; the first starts as the primary."""
        self.sentinel_ports = [free_port() for _ in range(3)]
        self._nodes: dict[int, ManagedProcess] = {}
        self._sentinels: list[ManagedProcess] = []
        self._generation = 0

    def url(self, db: int) -> str:
        """The ``sentinel://`` URL of database ``db``."""
        hosts = ",".join(f"127.0.0.1:{port}" for port in self.sentinel_ports)
        return f"sentinel://{hosts}/{SENTINEL_MASTER}/{db}"

    def node_url(self, port: int, db: int = 0) -> str:
        """The plain ``redis://`` URL of database ``db`` on the data node at ``port`` (whatever its role)."""
        return f"redis://127.0.0.1:{port}/{db}"

    def start(self) -> None:
        """Start the primary, the replica (synced) and the sentinels (each seeing the others)."""
        primary, replica = self.node_ports
        self._start_node(primary, replica_of=None)
        self._start_node(replica, replica_of=primary)
        wait_until(list(self._nodes.values()), lambda: _in_sync(primary, replica), 30)
        for port in self.sentinel_ports:
            config = self._log_dir / f"sentinel-{port}.conf"
            config.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {self._log_dir}\n"
                f"sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {primary} 2\n"
                f"sentinel down-after-milliseconds {SENTINEL_MASTER} {_DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {SENTINEL_MASTER} 10000\n"
                f"sentinel parallel-syncs {SENTINEL_MASTER} 1\n"
            )
            self._sentinels.append(self._spawn(f"sentinel-{port}", [_redis_server(), str(config), "--sentinel"]))
        wait_until(self._sentinels, lambda: self._sentinels_agree(primary), 30)

    def primary_port(self) -> int | None:
        """The primary's port as the first sentinel that answers says it (None: none answers)."""
        for port in self.sentinel_ports:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
            try:
                address = client.sentinel_get_master_addr_by_name(SENTINEL_MASTER)
            except redis.RedisError:
                continue
            finally:
                client.close()
            if address:
                return int(address[1])
        return None

    def kill_primary(self) -> int:
        """SIGKILL the primary the sentinels name; returns its port."""
        port = self.primary_port()
        if port is None or port not in self._nodes:
            raise RuntimeError(f"no primary to kill (the sentinels say {port})")
        self._nodes.pop(port).kill()
        logger.info("killed the Redis primary on port %d", port)
        return port

    def wait_promoted(self, old: int, *, timeout: float = 60.0) -> int:
        """Wait until every sentinel names a primary other than ``old`` and it takes writes; returns its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self.primary_port()
            if port is not None and port != old and self._sentinels_agree(port) and _is_primary(port):
                return port
            time.sleep(0.2)
        raise RuntimeError(f"the sentinels promoted no replica within {timeout:.0f} s")

    def failover(self, *, timeout: float = 60.0) -> tuple[int, int]:
        """``SENTINEL FAILOVER``: the sentinels demote the live primary to a replica of its replica, which they
        promote. Retried while the sentinels refuse (a failover still in progress, a replica not yet seen
        as good). Returns the (demoted, promoted) ports once the demoted node follows the promoted one."""
        old = self.primary_port()
        deadline = time.monotonic() + timeout
        client = redis.Redis(host="127.0.0.1", port=self.sentinel_ports[0], socket_timeout=5)
        try:
            while True:
                try:
                    client.execute_command("SENTINEL", "FAILOVER", SENTINEL_MASTER)
                    break
                except redis.ResponseError:
                    if time.monotonic() >= deadline:
                        raise
                    time.sleep(0.5)
        finally:
            client.close()
        assert old is not None
        new = self.wait_promoted(old, timeout=max(1.0, deadline - time.monotonic()))
        wait_until(list(self._nodes.values()), lambda: _in_sync(new, old), max(1.0, deadline - time.monotonic()))
        return old, new

    def restart_as_replica(self, port: int, *, primary: int) -> None:
        """Start the data node on ``port`` again, empty, as a replica of ``primary``, and wait until it synced."""
        self._start_node(port, replica_of=primary)
        wait_until(list(self._nodes.values()), lambda: _in_sync(primary, port), 60)

    def stop(self) -> None:
        """Kill every process of the setup that runs."""
        for process in [*self._sentinels, *self._nodes.values()]:
            process.kill()
        self._sentinels.clear()
        self._nodes.clear()

    def _start_node(self, port: int, *, replica_of: int | None) -> None:
        argv = [
            _redis_server(), "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self._log_dir), "--dbfilename", f"node-{port}.rdb", "--daemonize", "no",
            "--repl-diskless-sync", "yes", "--repl-diskless-sync-delay", "0",
        ]  # fmt: skip
        if replica_of is not None:
            argv += ["--replicaof", "127.0.0.1", str(replica_of)]
        self._nodes[port] = self._spawn(f"redis-{port}", argv)
        wait_until([self._nodes[port]], lambda: _answers(port), 20)

    def _spawn(self, name: str, argv: list[str]) -> ManagedProcess:
        self._generation += 1
        env = {"PATH": os.environ.get("PATH", os.defpath)}
        return spawn(f"{name}-{self._generation}", argv, env=env, log_dir=self._log_dir)

    def _sentinels_agree(self, primary: int) -> bool:
        """Whether every sentinel names ``primary`` and knows the two other sentinels."""
        for port in self.sentinel_ports:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
            try:
                state = client.sentinel_master(SENTINEL_MASTER)
            except redis.RedisError:
                return False
            finally:
                client.close()
            if int(state["port"]) != primary or int(state.get("num-other-sentinels", 0)) < 2:
                return False
        return True


class Database:
    """A fresh, migrated PostgreSQL database, dropped by :meth:`drop`."""

    def __init__(self) -> None:
        self.admin_url = database_admin_url()
        self.name = f"aptix_chaos_{uuid.uuid4().hex[:12]}"
        self.url = self.admin_url.rsplit("/", 1)[0] + "/" + self.name
        self._created = False

    def create(self) -> None:
        """Create the database and migrate it to the newest schema."""
        from shared.db.migrate import upgrade

        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self._created = True
        upgrade(self.url)

    def terminate_backends(self) -> int:
        """``pg_terminate_backend`` every connection to the database; returns how many were ended.

        Run from the admin database, so the harness's own connection is never among them.
        """
        query = (
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = %s AND pid <> pg_backend_pid()"
        )
        with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as conn:
            row = conn.execute(query, (self.name,)).fetchone()
        return int(row[0]) if row else 0

    def drop(self) -> None:
        """Drop the database, ending whatever connections remain."""
        if not self._created:
            return
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self._created = False


def _answers(port: int) -> bool:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def _is_primary(port: int) -> bool:
    client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return client.info("replication").get("role") == "master"
    except redis.RedisError:
        return False
    finally:
        client.close()


def _in_sync(primary: int, replica: int) -> bool:
    """Whether the replica on ``replica`` follows ``primary`` with its link up."""
    client = redis.Redis(host="127.0.0.1", port=replica, socket_timeout=1, socket_connect_timeout=1)
    try:
        info = client.info("replication")
    except redis.RedisError:
        return False
    finally:
        client.close()
    return (
        info.get("role") == "slave"
        and int(info.get("master_port", 0)) == primary
        and (info.get("master_link_status") == "up")
    )


def _redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError("redis-server is not on PATH: the chaos suite runs a Redis server of its own")
    return path
