"""Flower as the README starts it next to plain-process workers, and its HTTP API for the tests.

``celery -A workers.app:celery_app flower`` with the project's app, its password and task history
bound from the environment (``FLOWER_BASIC_AUTH``, ``FLOWER_MAX_TASKS``: never on the command line,
where ``ps`` shows it) and the task list's columns including ``args`` (where the turn id is).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import httpx

from aptix_cli.launcher import ManagedProcess, ProcessGroup, answers, free_port, wait_until
from tests.support.waiting import wait_for

__all__ = ["TASKS_COLUMNS", "Flower", "start_flower"]

TASKS_COLUMNS = "name,uuid,state,args,received,started,runtime,worker"
"""The task list's columns in every deployment file: ``args`` shows the turn id."""


@dataclass
class Flower:
    """A running Flower: its URL, credentials and process."""

    url: str
    user: str
    password: str
    process: ManagedProcess

    def get(self, path: str, **params: Any) -> httpx.Response:
        """GET ``path`` with the basic-auth credentials."""
        return httpx.get(f"{self.url}{path}", params=params, auth=(self.user, self.password), timeout=10)

    def tasks(self, **params: Any) -> dict[str, dict[str, Any]]:
        """``/api/tasks`` (task id -> what Flower knows of it); ``params`` filter, as Flower's search does."""
        response = self.get("/api/tasks", **params)
        assert response.status_code == 200, response.text
        tasks: dict[str, dict[str, Any]] = response.json()
        return tasks


def start_flower(group: ProcessGroup, *, password: str, max_tasks: int = 1000, timeout: float = 60.0) -> Flower:
    """Start Flower on a free port and return once every worker's task events reach it.

    Flower turns the workers' task events on when it starts (they start with them off); until a
    worker's events arrive, Flower would miss its tasks, so this waits until Flower reports every
    worker that answers a ping as online (its heartbeat events arrive).

    Raises:
        RuntimeError: Flower exited or did not answer in time (with its log).
    """
    port = free_port()
    user = "operator"
    argv = [
        sys.executable, "-m", "celery", "-A", "workers.app:celery_app", "flower",
        "--address=127.0.0.1", f"--port={port}", f"--tasks_columns={TASKS_COLUMNS}",
    ]  # fmt: skip
    env = {"FLOWER_BASIC_AUTH": f"{user}:{password}", "FLOWER_MAX_TASKS": str(max_tasks)}
    process = group.start(f"flower-{port}", argv, env)
    flower = Flower(url=f"http://127.0.0.1:{port}", user=user, password=password, process=process)
    wait_until([process], lambda: answers(f"{flower.url}/healthcheck"), timeout)
    workers = wait_for(lambda: _registered(flower), what="Flower to see the workers", seconds=timeout)
    wait_for(
        lambda: _online(flower) >= workers,
        what=f"every worker's events to reach Flower ({sorted(workers)})",
        seconds=timeout,
    )
    return flower


def _registered(flower: Flower) -> set[str]:
    """The workers that answer Flower's inspect (``/api/workers?refresh=1``)."""
    response = flower.get("/api/workers", refresh=1)
    return set(response.json()) if response.status_code == 200 else set()


def _online(flower: Flower) -> set[str]:
    """The workers whose events reach Flower (``/api/workers?status=1``: alive by heartbeat)."""
    response = flower.get("/api/workers", status=1)
    return {name for name, alive in response.json().items() if alive} if response.status_code == 200 else set()
