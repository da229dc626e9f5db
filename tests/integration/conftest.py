"""The running system for integration tests: scripted model, worker processes, gateway process."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from aptix_cli.stack import LocalStack
from scripted_llm import ScriptedServer
from tests.conftest import API_KEYS, KEY_A
from tests.integration.events import TaskEventRecorder


class System:
    """Handles on the running system, with helpers the tests share."""

    def __init__(self, *, stack: LocalStack, gateway_url: str, llm: ScriptedServer, env: dict[str, str]) -> None:
        self.stack = stack
        self.gateway_url = gateway_url
        self.llm = llm
        self.env = env
        self.http = httpx.Client(base_url=gateway_url, timeout=90.0)

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

    def wait_turn(self, turn_id: str, *, key: str = KEY_A, seconds: float = 60) -> dict[str, Any]:
        """GET the turn, long-polling until it is no longer queued/running."""
        deadline = time.monotonic() + seconds
        while True:
            response = self.http.get(f"/v1/turns/{turn_id}", headers=self.headers(key), params={"wait": 10})
            assert response.status_code == 200, response.text
            turn: dict[str, Any] = response.json()
            if turn["status"] not in ("queued", "running") or time.monotonic() > deadline:
                return turn

    def llm_requests(self, contains: str) -> list[dict[str, Any]]:
        """The request bodies the scripted model received that contain ``contains``."""
        return [entry["body"] for entry in self.llm.requests(contains)]


@pytest.fixture(scope="session")
def system(database_url: str, redis_urls: tuple[str, str]) -> Iterator[System]:
    """Scripted model + one worker process (threads pool) + the gateway process."""
    state_url, broker_url = redis_urls
    with ScriptedServer() as llm:
        env = {
            "APTIX_DATABASE_URL": database_url,
            "APTIX_REDIS_URL": state_url,
            "APTIX_BROKER_URL": broker_url,
            "APTIX_LLM_BASE_URL": llm.base_url,
            "APTIX_LLM_API_KEY": "test-llm-key",
            "APTIX_LLM_MODEL": "scripted-model",
            "APTIX_API_KEYS": API_KEYS,
            "APTIX_MAX_BODY_BYTES": "65536",
            "APTIX_LLM_LOCAL_ONLY": "1",
        }
        stack = LocalStack(env)
        try:
            stack.start_worker("w1")
            _, url = stack.start_gateway()
            yield System(stack=stack, gateway_url=url, llm=llm, env=env)
        finally:
            stack.stop_all()


@pytest.fixture(scope="session")
def task_events(system: System) -> Iterator[TaskEventRecorder]:
    """Every Celery task event the workers emit during the run."""
    recorder = TaskEventRecorder(system.env["APTIX_BROKER_URL"])
    recorder.start()
    yield recorder
    recorder.stop()
