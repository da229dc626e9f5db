"""API keys in the database (issue 27): created, revoked and expired keys on two gateway processes, and
a database outage, made by stopping the TCP relay the gateways reach PostgreSQL through.

The gateways share a database of this module's own, through a ``socat`` relay this module starts
(in a session of its own, so that stopping it ends the connections its children serve). Gateway
``a`` verifies remembered keys at the default interval (a minute: only the version it polls can
tell it of a revocation in seconds); gateway ``b`` every 2 s (so the outage test makes it try the
database for keys it remembers).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import pytest

from aptix_cli.launcher import ManagedProcess, free_port, wait_until
from shared.db import create_db_engine, session_factory
from shared.db.api_keys import ApiKeyRepository
from tests.integration.conftest import System
from tests.support.databases import fresh_database
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

HONOURED_WITHIN = 5.0
"""Seconds within which every gateway honours a created or revoked key (the issue's bound)."""


class Relay:
    """``socat`` forwarding a local port to PostgreSQL; :meth:`stop` cuts every connection through it."""

    def __init__(self, target: tuple[str, int], log_dir: Path) -> None:
        self.port = free_port()
        self._target = target
        self._log_dir = log_dir
        self._process: ManagedProcess | None = None
        self.start()

    def start(self) -> None:
        host, port = self._target
        argv = ["socat", f"TCP-LISTEN:{self.port},bind=127.0.0.1,reuseaddr,fork", f"TCP:{host}:{port}"]
        self._process = ManagedProcess(f"relay-{self.port}", argv, dict(os.environ), self._log_dir, own_session=True)
        wait_until([self._process], self._listening, 10)

    def stop(self) -> None:
        """SIGKILL the relay and the children serving its connections (its process group, by its pid)."""
        if self._process is not None:
            self._process.kill()
            self._process = None

    def _listening(self) -> bool:
        import socket

        with socket.socket() as sock:
            return sock.connect_ex(("127.0.0.1", self.port)) == 0


@dataclass
class Gateways:
    urls: dict[str, str]
    processes: dict[str, ManagedProcess]
    database_url: str
    """The database, directly (what `aptix keys` uses)."""
    relay: Relay
    http: httpx.Client

    def get(self, name: str, key: str) -> httpx.Response:
        """``GET /v1/modes`` on gateway ``name`` with ``key`` (a route that needs no database)."""
        return self.http.get(f"{self.urls[name]}/v1/modes", headers={"Authorization": f"Bearer {key}"})

    def status(self, name: str, key: str) -> int:
        """The status of :meth:`get`."""
        return self.get(name, key).status_code

    def await_status(self, key: str, status: int, *, since: float, seconds: float) -> None:
        """Wait until both gateways answer ``key`` with ``status``, failing ``seconds`` after ``since``."""
        for name in self.urls:
            wait_for(
                partial(_answers, self, name, key, status), what=f"gateway {name} to answer {status}",
                seconds=max(0.0, since + seconds - time.monotonic()), interval=0.1,
            )  # fmt: skip

    def keys(self, *args: str) -> subprocess.CompletedProcess[str]:
        """``aptix keys ARGS`` on the module's database."""
        return subprocess.run(
            [sys.executable, "-m", "aptix_cli", "keys", *args],
            env={**os.environ, "APTIX_DATABASE_URL": self.database_url},
            capture_output=True, text=True, timeout=120,
        )  # fmt: skip

    def create(self, *args: str) -> dict[str, Any]:
        done = self.keys("create", "--org", "org-keys", "--json", *args)
        assert done.returncode == 0, done.stderr
        created: dict[str, Any] = json.loads(done.stdout)
        return created

    def metric(self, name: str, outcome: str) -> float:
        for line in self.http.get(f"{self.urls[name]}/metrics").text.splitlines():
            if line.startswith(f'aptix_api_key_checks_total{{outcome="{outcome}"}}'):
                return float(line.split()[-1])
        raise AssertionError(f"no aptix_api_key_checks_total for {outcome}")


@pytest.fixture(scope="module")
def gateways(system: System, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateways]:
    with fresh_database("aptix_keys") as database_url:
        parts = urlsplit(database_url)
        relay = Relay((parts.hostname or "127.0.0.1", parts.port or 5432), tmp_path_factory.mktemp("relay"))
        netloc = parts.netloc.rsplit("@", 1)
        relayed = urlunsplit(parts._replace(netloc=f"{netloc[0]}@127.0.0.1:{relay.port}"))
        started: dict[str, ManagedProcess] = {}
        urls: dict[str, str] = {}
        try:
            common = {"APTIX_DATABASE_URL": relayed, "APTIX_LOG_FORMAT": "json"}
            for name, env in (("a", {}), ("b", {"APTIX_API_KEY_VERIFY_SECONDS": "2"})):
                started[name], urls[name] = system.stack.start_gateway(env={**common, **env})
            with httpx.Client(timeout=30) as http:
                yield Gateways(urls, started, database_url, relay, http)
        finally:
            system.stack.stop(list(started.values()))
            relay.stop()


def _logged(process: ManagedProcess, text: str) -> bool:
    return text in process.log()


def _answers(gateways: Gateways, name: str, key: str, status: int) -> bool:
    return gateways.status(name, key) == status


def test_a_key_created_by_the_cli_is_accepted_by_both_gateways_within_5s(gateways: Gateways) -> None:
    # When a key is created with `aptix keys create --json`
    created = gateways.create("--name", "ci")
    made = time.monotonic()
    # Then the command printed what the issue says, the key once, with its recognisable prefix
    assert set(created) == {"id", "key", "org", "name", "prefix", "created_at", "expires_at"}
    assert created["key"].startswith(created["prefix"]) and created["prefix"].startswith("aptix_")
    assert (created["org"], created["name"], created["expires_at"]) == ("org-keys", "ci", None)
    # and both gateways accept it within 5 s
    gateways.await_status(created["key"], 200, since=made, seconds=HONOURED_WITHIN)
    # and the listing names it, never showing the key
    listing = gateways.keys("list", "--org", "org-keys", "--json")
    assert listing.returncode == 0 and created["key"] not in listing.stdout
    (listed,) = [entry for entry in json.loads(listing.stdout) if entry["id"] == created["id"]]
    assert listed["prefix"] == created["prefix"] and listed["last_used_at"] is not None
    # and each gateway's access line names the key's id, never the key
    for process in gateways.processes.values():
        wait_for(partial(_logged, process, created["id"]), what="the access line with the key id")
        log = process.log()
        assert created["key"] not in log
        lines = [json.loads(line) for line in log.splitlines() if line.startswith("{")]
        assert any(line.get("key_id") == created["id"] and line["route"] == "/v1/modes" for line in lines)


def test_a_revoked_key_is_refused_by_both_gateways_within_5s(gateways: Gateways) -> None:
    # Given a key both gateways have accepted (and remember)
    created = gateways.create()
    gateways.await_status(created["key"], 200, since=time.monotonic(), seconds=30)
    # When it is revoked with the CLI
    done = gateways.keys("revoke", created["id"])
    revoked = time.monotonic()
    assert done.returncode == 0, done.stderr
    # Then both refuse it within 5 s (gateway a would trust its memory for a minute without the version poll)
    gateways.await_status(created["key"], 401, since=revoked, seconds=HONOURED_WITHIN)
    response = gateways.get("a", created["key"])
    assert response.json()["error"] == {"code": "unauthorized", "message": "the API key was revoked", "details": None}


def test_an_expired_key_is_refused_by_both_gateways(gateways: Gateways) -> None:
    engine = create_db_engine(gateways.database_url, pool_size=1, max_overflow=0)
    repository = ApiKeyRepository(session_factory(engine))
    now = datetime.now(UTC)
    try:
        # Given a key that expired a second ago, and one that expires in 3 s and is in use
        _, expired = repository.create(org_id="org-keys", name=None, expires_at=now - timedelta(seconds=1), now=now)
        _, expiring = repository.create(org_id="org-keys", name=None, expires_at=now + timedelta(seconds=3), now=now)
    finally:
        engine.dispose()
    for name in ("a", "b"):
        assert gateways.status(name, expiring) == 200
    # Then the expired key is refused, and the other once it expires, though both gateways remember it
    for name in ("a", "b"):
        response = gateways.get(name, expired)
        assert (response.status_code, response.json()["error"]["message"]) == (401, "the API key has expired")
    gateways.await_status(expiring, 401, since=time.monotonic(), seconds=10)


def test_the_database_stopped_for_10s_does_not_refuse_a_key_in_use(gateways: Gateways) -> None:
    # Given a key in use on both gateways
    in_use = gateways.create()
    gateways.await_status(in_use["key"], 200, since=time.monotonic(), seconds=30)
    outages_before = gateways.metric("b", "outage")
    # When the gateways' way to the database is cut for 10 s (a key is created meanwhile, directly)
    gateways.relay.stop()
    try:
        unseen = gateways.create()
        assert gateways.http.get(f"{gateways.urls['a']}/readyz").json()["error"]["details"]["database"] == "down"
        statuses: dict[str, set[int]] = {"a": set(), "b": set()}
        unseen_statuses: set[int] = set()
        ends = time.monotonic() + 10
        while time.monotonic() < ends:
            for name in ("a", "b"):
                statuses[name].add(gateways.status(name, in_use["key"]))
                unseen_statuses.add(gateways.status(name, unseen["key"]))
            time.sleep(0.2)
    finally:
        gateways.relay.start()
    # Then the key in use was accepted by both throughout (b tried the database for it and went on from memory)
    assert statuses == {"a": {200}, "b": {200}}
    assert gateways.metric("b", "outage") > outages_before
    # and a key neither had seen could not be verified (503, not 401)
    assert unseen_statuses == {503}
    # and once the database is back, that key is accepted by both within 5 s
    gateways.await_status(unseen["key"], 200, since=time.monotonic(), seconds=HONOURED_WITHIN)
