"""Worker liveness with real processes (docs/operations.md, "Worker health"): ``aptix worker-health`` passes for
every Celery process of a healthy ``aptix worker`` and fails, naming the process, when one is
stopped (SIGSTOP), holds a task past ``APTIX_WORKER_TASK_STUCK_SECONDS``, or has every tool thread
held by a hanging handler; it keeps passing while the broker is down, and recovers each time.

Every wait is on the condition, with a generous timeout: no test times the check.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from importlib import resources
from pathlib import Path

import pytest
import yaml

from scripted_llm import ScriptedServer
from tests.conftest import redis_databases
from tests.integration.conftest import System, start_system
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

STALE = "2"
"""APTIX_WORKER_HEARTBEAT_STALE_SECONDS of these workers: a hang shows within seconds."""

HOLD_TOOLS = [
    {"name": "hold", "description": "Wait for the test.", "handler": "tests.support.tools:hold", "timeout_seconds": 60,
     "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
    {"name": "hold_briefly", "description": "Overrun.", "handler": "tests.support.tools:hold", "timeout_seconds": 0.5,
     "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}},
]  # fmt: skip


class Health:
    """``aptix worker-health`` of one worker's heartbeat folder."""

    def __init__(self, stack: LocalStack, directory: Path) -> None:
        self.directory = directory
        self._env = {**stack.env, "APTIX_WORKER_HEALTH_DIR": str(directory)}

    def check(self) -> subprocess.CompletedProcess[str]:
        """Run the check as a probe would."""
        return subprocess.run(
            [sys.executable, "-m", "aptix_cli", "worker-health"],
            env=self._env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def passing(self) -> subprocess.CompletedProcess[str] | None:
        """The check's result when it exits 0."""
        done = self.check()
        return done if done.returncode == 0 else None

    def failing(self, *needles: str) -> subprocess.CompletedProcess[str] | None:
        """The check's result when it exits 1 and its message holds every needle."""
        done = self.check()
        return done if done.returncode == 1 and all(n in done.stderr for n in needles) else None

    def pid(self, name: str) -> int:
        """The pid the heartbeat of process ``name`` reports."""
        return int(json.loads((self.directory / f"{name}.heartbeat.json").read_text())["pid"])


@pytest.fixture
def health_system(
    database_url: str, scripted_llm: ScriptedServer, tmp_path: Path
) -> Iterator[tuple[LocalStack, System, Path]]:
    """A gateway on its own broker and state databases and a catalog offering the hold tools; no worker yet."""
    catalog = yaml.safe_load(resources.files("shared.modes").joinpath("default_catalog.yaml").read_text())
    catalog["tools"] = HOLD_TOOLS
    for mode in catalog["modes"]:
        if mode["name"] == "general":
            mode["tools"] = [*mode["tools"], "hold", "hold_briefly"]
    modes = tmp_path / "modes.yaml"
    modes.write_text(yaml.safe_dump(catalog))
    with redis_databases(2) as (state_url, broker_url):
        stack, system = start_system(
            database_url=database_url,
            redis_urls=(state_url, broker_url),
            llm=scripted_llm,
            modes_file=modes,
            workers=[],
        )
        try:
            yield stack, system, tmp_path / "health"
        finally:
            stack.stop_all()


def _worker_env(directory: Path, **settings: str) -> dict[str, str]:
    env = {"APTIX_WORKER_HEALTH_DIR": str(directory), "APTIX_WORKER_HEARTBEAT_STALE_SECONDS": STALE}
    env.update({f"APTIX_{name.upper()}": value for name, value in settings.items()})
    return env


def test_worker_health_passes_for_every_process_of_a_healthy_worker(
    health_system: tuple[LocalStack, System, Path],
) -> None:
    stack, system, directory = health_system
    # Given `aptix worker` with no --pool: a threads process and a gevent process
    stack.start_worker("hw", pool=None, env=_worker_env(directory))
    health = Health(stack, directory)
    # Then the check passes and names both, and still does after a turn crossed both
    done = wait_for(health.passing, what="aptix worker-health to pass", seconds=60)
    assert "ok: pipeline (pipeline.hw@" in done.stdout and "ok: llm (llm.hw@" in done.stdout, done.stdout
    assert system.run_turn({"input": f"hello {uuid.uuid4().hex}"})["status"] == "completed"
    assert health.check().returncode == 0


def test_worker_health_fails_for_a_stopped_worker_process_and_recovers_when_it_continues(
    health_system: tuple[LocalStack, System, Path],
) -> None:
    stack, _system, directory = health_system
    stack.start_worker("sw", pool=None, env=_worker_env(directory))
    health = Health(stack, directory)
    wait_for(health.passing, what="aptix worker-health to pass", seconds=60)
    # When the gevent (llm) process is stopped: no thread or greenlet of it runs
    llm = health.pid("llm")
    os.kill(llm, signal.SIGSTOP)
    try:
        # Then the check fails within the stale limit, naming that process only
        done = wait_for(lambda: health.failing("llm (llm.sw@", "no heartbeat"), what="the check to fail", seconds=60)
        assert "FAIL: pipeline" not in done.stderr and "ok: pipeline" in done.stdout, done.stdout + done.stderr
    finally:
        os.kill(llm, signal.SIGCONT)
    # And passes again once it runs again
    wait_for(health.passing, what="aptix worker-health to pass again", seconds=60)


def test_worker_health_fails_while_a_task_runs_past_the_stuck_limit(
    health_system: tuple[LocalStack, System, Path],
) -> None:
    stack, system, directory = health_system
    stack.start_worker("tw", pool=None, env=_worker_env(directory, worker_task_stuck_seconds="3"))
    health = Health(stack, directory)
    wait_for(health.passing, what="aptix worker-health to pass", seconds=60)
    # Given a turn whose server tool hangs (its step waits up to the tool's 60 s timeout)
    key = uuid.uuid4().hex
    turn_id = system.post_turn({"input": f'[[call:hold {{"key": "{key}"}}]] {key}'}).json()["turn_id"]
    try:
        # Then the process that runs the step fails the check, naming the task
        wait_for(
            lambda: health.failing("pipeline (pipeline.tw@", "aptix.step.execute_server_tools", "has run"),
            what="the check to fail on the held task",
            seconds=60,
        )
    finally:
        system.redis.rpush(f"aptix:test:release:{key}", "go")
    # And when the tool returns, the turn completes and the check passes again
    assert system.wait_turn(turn_id)["status"] == "completed"
    wait_for(health.passing, what="aptix worker-health to pass again", seconds=60)


def test_worker_health_fails_when_hanging_handlers_hold_every_tool_thread(
    health_system: tuple[LocalStack, System, Path],
) -> None:
    stack, system, directory = health_system
    stack.start_worker("ow", pool=None, env=_worker_env(directory, tool_threads="1"))
    health = Health(stack, directory)
    wait_for(health.passing, what="aptix worker-health to pass", seconds=60)
    # Given the only tool thread held by a handler that overran its 0.5 s timeout
    key = uuid.uuid4().hex
    turn = system.run_turn({"input": f'[[call:hold_briefly {{"key": "{key}"}}]] {key}'})
    try:
        assert turn["status"] == "failed" and turn["error"]["code"] == "tool_failed", turn
        # Then the check fails: no server tool can run in that process any more
        wait_for(
            lambda: health.failing("pipeline (pipeline.ow@", "all 1 tool threads are held"),
            what="the check to fail on the held tool threads",
            seconds=60,
        )
    finally:
        system.redis.rpush(f"aptix:test:release:{key}", "go")
    wait_for(health.passing, what="aptix worker-health to pass once the handler returned", seconds=60)


def test_worker_health_passes_while_the_broker_is_down_and_the_loop_resumes_after(
    database_url: str, tmp_path: Path
) -> None:
    from tests.chaos.backing import RedisServer

    # Given a worker on a Redis server of its own
    server = RedisServer(log_dir=tmp_path)
    server.start()
    stack = LocalStack(
        {"APTIX_DATABASE_URL": database_url, "APTIX_REDIS_URL": server.url(0), "APTIX_BROKER_URL": server.url(1)},
        log_dir=tmp_path,
    )
    try:
        worker = stack.start_worker("bw", pool=None, env=_worker_env(tmp_path / "health"))
        health = Health(stack, tmp_path / "health")
        wait_for(health.passing, what="aptix worker-health to pass", seconds=60)
        # When the broker goes away, the event loops stop: reconnecting is waiting, not hung
        server.shutdown_nosave()
        done = wait_for(
            lambda: (d := health.check()).stdout.count("not connected to the broker") == 2 and d,
            what="both processes to report the lost broker",
            seconds=60,
        )
        assert done.returncode == 0, done.stderr
        # And when it is back, both loops run again (their heartbeat timer survived the reconnect)
        server.start()
        wait_for(
            lambda: (d := health.check()).returncode == 0 and d.stdout.count("event loop ran") == 2,
            what="both event loops to run again",
            seconds=90,
        )
        assert worker.alive(), worker.log()
    finally:
        stack.stop_all()
        server.stop()
