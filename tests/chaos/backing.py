"""The services under a chaos fault: a Redis server of its own and a PostgreSQL database of its own.

The machine's shared Redis (6379) is never touched: each fault runs its own ``redis-server`` child
on a free port (state on db 0, broker on db 1), which the redis_restart fault shuts down and
starts again. The database lives on the machine's PostgreSQL server, is created and migrated for
the fault and dropped (``WITH (FORCE)``) at the end.
"""

from __future__ import annotations

import logging
import os
import shutil
import uuid
from pathlib import Path

import psycopg
import redis

from aptix_cli.launcher import ManagedProcess, free_port, wait_until
from tests.chaos.processes import spawn
from tests.services_check import database_admin_url

__all__ = ["Database", "RedisServer"]

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
        client = redis.Redis.from_url(self.url(0), socket_timeout=5)
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
        client = redis.Redis.from_url(self.url(0), socket_timeout=1, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()


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


def _redis_server() -> str:
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError("redis-server is not on PATH: the chaos suite runs a Redis server of its own")
    return path
