"""Flower as docs/operations.md starts it next to plain-process workers, and its HTTP API for the tests.

``celery -A workers.app:celery_app flower`` with the project's app, its password and task history
bound from the environment (``FLOWER_BASIC_AUTH``, ``FLOWER_MAX_TASKS``: never on the command line,
where ``ps`` shows it) and the task list's columns including ``args`` (where the turn id is).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from aptix_cli.launcher import ManagedProcess, ProcessGroup, answers, free_port, wait_until
from tests.support.waiting import wait_for

__all__ = ["TASKS_COLUMNS", "Flower", "start_flower"]

TASKS_COLUMNS = "name,uuid,state,args,result,received,started,runtime,worker"
"""The task list's columns in every deployment file: ``args`` shows the turn id, ``result`` the steps a task ran."""


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


def start_flower(
    group: ProcessGroup,
    *,
    password: str,
    probe: Callable[[], str],
    max_tasks: int = 1000,
    timeout: float = 60.0,
) -> Flower:
    """Start Flower on a free port and return once it sees the workers' tasks.

    The workers start with task events off; Flower turns them on with its first ``enable_events``
    broadcast, about 5 s after it starts (then every 5 s, for workers that start later). A task that
    ran before is not in Flower, and a worker's heartbeats reach Flower before its task events do.
    So this runs ``probe`` turns until Flower lists the tasks of one.

    Args:
        group: starts (and later stops) the process.
        password: the basic-auth password (user ``operator``).
        probe: runs a short turn to its end and returns its turn id.
        max_tasks: Flower's task history (``FLOWER_MAX_TASKS``).
        timeout: seconds to wait for each stage.

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
    probes: list[str] = []

    def sees_a_probe() -> bool:
        if probes and flower.tasks(search=probes[-1]):
            return True
        probes.append(probe())
        return False

    wait_for(sees_a_probe, what="Flower to list the tasks of a turn", seconds=timeout, interval=0.5)
    return flower
