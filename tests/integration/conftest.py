"""The running system for integration tests: scripted model, worker processes, gateway process."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import Engine, create_engine

from aptix_cli.launcher import ManagedProcess
from scripted_llm import ScriptedServer
from shared.db.engine import normalise_database_url
from shared.state.redis_store import connect
from tests.conftest import API_KEYS, KEY_A, redis_databases
from tests.integration.events import TaskEventRecorder, recording
from tests.responses_fixtures import validate_request_bodies
from tests.support.flower import Flower, start_flower
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

TEST_TOOLS = [
    {"name": "record_call", "description": "Count a call.", "handler": "tests.support.tools:record_call",
     "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
    {"name": "explode", "description": "Always fails.", "handler": "tests.support.tools:explode",
     "parameters": {"type": "object", "properties": {"reason": {"type": "string"}}}},
    {"name": "sleepy", "description": "Too slow.", "handler": "tests.support.tools:sleepy", "timeout_seconds": 0.5,
     "parameters": {"type": "object", "properties": {"seconds": {"type": "number"}}}},
    {"name": "whoami", "description": "The tool context.", "handler": "tests.support.tools:whoami",
     "parameters": {"type": "object", "properties": {}}},
]  # fmt: skip


OPEN_FILE = {
    "type": "function",
    "name": "open_file",
    "description": "Open a file on the client.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
}
"""A client tool the tests declare."""


class System:
    """Handles on the running system, with helpers the tests share."""

    def __init__(self, *, stack: LocalStack, gateway_url: str, llm: ScriptedServer, env: dict[str, str]) -> None:
        self.stack = stack
        self.gateway_url = gateway_url
        self.llm = llm
        self.env = env
        self.http = httpx.Client(base_url=gateway_url, timeout=90.0)
        self.redis = connect(env["APTIX_REDIS_URL"], max_connections=8)  # a single Redis or a cluster

    def headers(self, key: str = KEY_A) -> dict[str, str]:
        """Authorization for ``key``."""
        return {"Authorization": f"Bearer {key}"}

    def post_turn(self, body: dict[str, Any], *, key: str = KEY_A, wait: float | None = None) -> httpx.Response:
        """POST /v1/turns."""
        params = {"wait": wait} if wait is not None else None
        return self.http.post("/v1/turns", json=body, headers=self.headers(key), params=params)

    def run_turn(self, body: dict[str, Any], *, key: str = KEY_A) -> dict[str, Any]:
        """Start a turn and long-poll until it leaves queued/running."""
        response = self.post_turn(body, key=key, wait=30)
        assert response.status_code == 200, response.text
        turn: dict[str, Any] = response.json()
        return self.wait_turn(turn["turn_id"], key=key) if turn["status"] in ("queued", "running") else turn

    def post_results(self, turn_id: str, results: list[dict[str, str]], *, key: str = KEY_A) -> httpx.Response:
        """POST /v1/turns/{id}/tool-results."""
        return self.http.post(
            f"/v1/turns/{turn_id}/tool-results", json={"tool_results": results}, headers=self.headers(key)
        )

    def resume(self, turn_id: str, results: list[dict[str, str]]) -> dict[str, Any]:
        """Post client tool results and wait for the turn to leave running."""
        response = self.post_results(turn_id, results)
        assert response.status_code == 202, response.text
        return self.wait_turn(turn_id)

    def wait_turn(self, turn_id: str, *, key: str = KEY_A, seconds: float = 60) -> dict[str, Any]:
        """GET the turn, long-polling until it is no longer queued/running; fails the test after ``seconds``."""

        def finished() -> dict[str, Any] | None:
            response = self.http.get(f"/v1/turns/{turn_id}", headers=self.headers(key), params={"wait": 10})
            assert response.status_code == 200, response.text
            turn: dict[str, Any] = response.json()
            return None if turn["status"] in ("queued", "running") else turn

        return wait_for(finished, what=f"turn {turn_id} to finish", seconds=seconds)

    def trace(self, turn_id: str) -> list[dict[str, Any]]:
        """The turn's trace steps."""
        response = self.http.get(f"/v1/turns/{turn_id}/trace", headers=self.headers())
        assert response.status_code == 200, response.text
        steps: list[dict[str, Any]] = response.json()["steps"]
        return steps

    def session(self, session_id: str) -> dict[str, Any]:
        """GET /v1/sessions/{id}."""
        response = self.http.get(f"/v1/sessions/{session_id}", headers=self.headers())
        assert response.status_code == 200, response.text
        session: dict[str, Any] = response.json()
        return session

    def llm_requests(self, contains: str) -> list[dict[str, Any]]:
        """The request bodies the scripted model received that contain ``contains``."""
        return [entry["body"] for entry in self.llm.requests(contains)]

    def tool_calls(self, key: str) -> int:
        """How often ``record_call`` ran for ``key``."""
        return int(self.redis.get(f"aptix:test:calls:{key}") or 0)


@pytest.fixture(scope="session")
def modes_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The packaged catalog plus the test operator tools, offered in mode general."""
    from importlib import resources

    catalog = yaml.safe_load(resources.files("shared.modes").joinpath("default_catalog.yaml").read_text())
    catalog["tools"] = TEST_TOOLS
    for mode in catalog["modes"]:
        if mode["name"] == "general":
            mode["tools"] = [*mode["tools"], *(tool["name"] for tool in TEST_TOOLS)]
    path = tmp_path_factory.mktemp("catalog") / "modes.yaml"
    path.write_text(yaml.safe_dump(catalog))
    return path


@pytest.fixture(scope="session")
def scripted_llm() -> Iterator[ScriptedServer]:
    """The scripted model; at the end, every request it received must conform (tests.responses_fixtures)."""
    with ScriptedServer(journal_size=100_000) as llm:
        yield llm
        bodies = [entry["body"] for entry in llm.requests()]
        if bodies:
            validate_request_bodies(bodies)


def start_system(
    *,
    database_url: str,
    redis_urls: tuple[str, str],
    llm: ScriptedServer,
    modes_file: Path,
    workers: list[str],
    env: dict[str, str] | None = None,
) -> tuple[LocalStack, System]:
    """Start worker processes and a gateway process on the given services (``env``: settings on top of
    :func:`system_env`'s)."""
    env = system_env(database_url=database_url, redis_urls=redis_urls, llm=llm, modes_file=modes_file) | (env or {})
    stack = LocalStack(env)
    try:
        for name in workers:
            stack.start_worker(name)
        _, url = stack.start_gateway()
    except BaseException:
        stack.stop_all()
        raise
    return stack, System(stack=stack, gateway_url=url, llm=llm, env=env)


@contextmanager
def own_system(
    *, database_url: str, llm: ScriptedServer, modes_file: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[LocalStack, System]]:
    """A gateway on broker and state databases of its own (``env``: settings on top of :func:`system_env`'s),
    with no worker yet; all it started stops at the end."""
    with redis_databases(2) as urls:
        stack, system = start_system(
            database_url=database_url, redis_urls=urls, llm=llm, modes_file=modes_file, workers=[], env=env
        )
        try:
            yield stack, system
        finally:
            system.http.close()
            stack.stop_all()


def system_env(
    *, database_url: str, redis_urls: tuple[str, str], llm: ScriptedServer, modes_file: Path
) -> dict[str, str]:
    """The settings every process of a test system gets."""
    state_url, broker_url = redis_urls
    return {
        "APTIX_DATABASE_URL": database_url,
        "APTIX_REDIS_URL": state_url,
        "APTIX_BROKER_URL": broker_url,
        "APTIX_LLM_BASE_URL": llm.base_url,
        "APTIX_LLM_API_KEY": "test-llm-key",
        "APTIX_LLM_MODEL": "scripted-model",
        "APTIX_API_KEYS": API_KEYS,
        "APTIX_MAX_BODY_BYTES": "65536",
        "APTIX_LLM_LOCAL_ONLY": "1",
        "APTIX_MODES_FILE": str(modes_file),
        "APTIX_STEP_LEASE_SECONDS": "5",
    }


@pytest.fixture(scope="session")
def system(
    database_url: str, redis_urls: tuple[str, str], scripted_llm: ScriptedServer, modes_file: Path
) -> Iterator[System]:
    """Scripted model + one worker process (threads pool) + the gateway process."""
    stack, running = start_system(
        database_url=database_url, redis_urls=redis_urls, llm=scripted_llm, modes_file=modes_file, workers=["w1"]
    )
    try:
        yield running
    finally:
        running.http.close()  # an idle pooled connection left open is a ResourceWarning at exit
        stack.stop_all()


@pytest.fixture(scope="session")
def engine(system: System) -> Iterator[Engine]:
    """An engine on the running system's database, for checking what a request recorded."""
    db = create_engine(normalise_database_url(system.env["APTIX_DATABASE_URL"]))
    yield db
    db.dispose()


@pytest.fixture(scope="module")
def two_worker_system(database_url: str, scripted_llm: ScriptedServer, modes_file: Path) -> Iterator[System]:
    """A separate broker and state store served by two worker processes (for kill and flush tests)."""
    with redis_databases(2) as (state_url, broker_url):
        stack, running = start_system(
            database_url=database_url,
            redis_urls=(state_url, broker_url),
            llm=scripted_llm,
            modes_file=modes_file,
            workers=["wa", "wb"],
        )
        try:
            yield running
        finally:
            stack.stop_all()


@pytest.fixture
def extra_gateway(system: System) -> Iterator[Callable[[dict[str, str]], str]]:
    """Start another gateway process with some settings changed; it stops when the test ends
    (a gateway left running would keep sweeping the shared database with its own settings)."""
    started: list[ManagedProcess] = []

    def start(env: dict[str, str]) -> str:
        process, url = system.stack.start_gateway(env=env)
        started.append(process)
        return url

    yield start
    for process in started:
        process.stop()
        system.stack.processes.remove(process)


@pytest.fixture(scope="session")
def task_events(system: System) -> Iterator[TaskEventRecorder]:
    """Every Celery task event the workers emit during the run."""
    with recording(system.env["APTIX_BROKER_URL"]) as recorder:
        yield recorder


@pytest.fixture(scope="session")
def flower(system: System) -> Iterator[Flower]:
    """Real Flower on the running system, as docs/operations.md starts it (password and history bound from
    its environment); stopped at the end of the run."""
    import uuid

    def probe() -> str:
        turn = system.run_turn({"input": f"flower probe {uuid.uuid4().hex}"})
        return str(turn["turn_id"])

    running = start_flower(system.stack, password=uuid.uuid4().hex, probe=probe)
    yield running
    system.stack.stop([running.process])
