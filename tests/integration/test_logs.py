"""Logs an SRE can follow, from real processes: every line of a step carries its turn, in text and in JSON,
and the gateway logs its start and one line per request."""

from __future__ import annotations

import json
import re
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from aptix_cli.launcher import ManagedProcess, wait_until
from scripted_llm import ScriptedServer
from tests.conftest import API_KEYS, KEY_A, ORG_A, redis_databases
from tests.integration.conftest import OPEN_FILE, System
from tests.support.databases import fresh_database
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

DB_PASSWORD = "hunter2-not-needed"  # the test server trusts local connections: a password it ignores
# The default APTIX_TASK_BOUNDARIES=call: a task per model or tool call (docs/pipeline.md, "Task boundaries")
SERVER_TOOL_HOPS = 3  # entry (and the first model call), execute_server_tools, llm_call
CLIENT_TOOL_HOPS = 2  # the entry (and its model call) until it pauses, the same once the results come back
_TEXT_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (\w+) (\S+) \[turn=(\S+) step=(\S+)\] (.*)$")
_TASK_LINE = re.compile(r"Task (aptix\.step\.\w+)\[([0-9a-f-]+)\] (received|succeeded)")
_ACCEPTED_LINE = re.compile(r"Task accepted: aptix\.step\.\w+\[([0-9a-f-]+)\]")


@pytest.fixture(scope="module")
def own_database(services: None) -> Iterator[str]:
    """A database of this module's own (its URL with a password): its reconciler touches no other test's turns."""
    with fresh_database("aptix_logs", password=DB_PASSWORD) as url:
        yield url


@contextmanager
def _running_system(
    database_url: str, llm: ScriptedServer, modes_file: Path, *, log_format: str, worker_args: list[str]
) -> Iterator[tuple[System, ManagedProcess]]:
    """A worker (``aptix worker ... --loglevel DEBUG``) and a gateway on a broker and state store of their own."""
    with redis_databases(2) as (state_url, broker_url):
        env = {
            "APTIX_DATABASE_URL": database_url,
            "APTIX_REDIS_URL": state_url,
            "APTIX_BROKER_URL": broker_url,
            "APTIX_LLM_BASE_URL": llm.base_url,
            "APTIX_LLM_API_KEY": "test-llm-key",
            "APTIX_LLM_MODEL": "scripted-model",
            "APTIX_API_KEYS": API_KEYS,
            "APTIX_LLM_LOCAL_ONLY": "1",
            "APTIX_MODES_FILE": str(modes_file),
            "APTIX_LOG_FORMAT": log_format,
        }
        stack = LocalStack(env)
        try:
            argv = [sys.executable, "-m", "aptix_cli", "worker", "--hostname", "logs@%h", "--loglevel", "DEBUG",
                    "--no-reconciler", *worker_args]  # fmt: skip
            worker = stack.start("worker", argv)
            processes = 1 if "--pool" in worker_args else 2
            wait_until([worker], lambda: worker.log().count("ready.") >= processes, 60)
            _, url = stack.start_gateway()
            system = System(stack=stack, gateway_url=url, llm=llm, env=env)
            try:
                yield system, worker
            finally:
                system.http.close()
        finally:
            stack.stop_all()


def _run_turns(system: System, worker: ManagedProcess) -> dict[str, dict[str, Any]]:
    """A turn with a server tool call and one that pauses for a client tool and resumes, and their log lines.

    A turn is completed for its client before its last task's "succeeded" line is written: wait for it.
    """
    server = system.run_turn({"input": f"now [[call:get_current_time {{}}]] m{uuid.uuid4().hex[:8]}"})
    assert server["status"] == "completed", server
    directive = "[[call:open_file " + json.dumps({"path": "x"}) + "]]"
    paused = system.run_turn({"input": f"{directive} m{uuid.uuid4().hex[:8]}", "tools": [OPEN_FILE]})
    assert paused["status"] == "requires_client_tools", paused
    call_id = paused["pending_tool_calls"][0]["call_id"]
    client = system.resume(paused["turn_id"], [{"call_id": call_id, "output": "file body"}])
    assert client["status"] == "completed", client
    expected = {server["turn_id"]: SERVER_TOOL_HOPS, client["turn_id"]: CLIENT_TOOL_HOPS}

    def logged() -> bool:
        lines = [line for line in worker.log().splitlines() if "] succeeded in" in line]
        return all(sum(turn_id in line for line in lines) >= hops for turn_id, hops in expected.items())

    wait_for(logged, what="Celery's succeeded line of every step task")
    return {"server": server, "client": client}


@pytest.fixture(scope="module")
def text_system(
    own_database: str, scripted_llm: ScriptedServer, modes_file: Path
) -> Iterator[tuple[System, ManagedProcess, dict[str, dict[str, Any]]]]:
    """Text logs; one worker thread at DEBUG, so a step's lines are exactly those between its
    task's "accepted" and "succeeded" lines (one message at a time: acks late, prefetch 1)."""
    worker_args = ["--pool", "threads", "--concurrency", "1"]
    with _running_system(own_database, scripted_llm, modes_file, log_format="text", worker_args=worker_args) as (
        system,
        worker,
    ):
        yield system, worker, _run_turns(system, worker)


def test_every_line_a_worker_logs_while_a_step_runs_carries_its_turn(
    text_system: tuple[System, ManagedProcess, dict[str, dict[str, Any]]],
) -> None:
    _system, worker, turns = text_system
    records = [match for line in worker.log().splitlines() if (match := _TEXT_LINE.match(line))]
    # Celery's lines about each step task ("received", "accepted", "succeeded") name its turn
    task_lines = [record for record in records if _TASK_LINE.search(record[5])]
    assert task_lines and not [r[0] for r in task_lines if r[3] == "-"], [r[0] for r in task_lines if r[3] == "-"]
    # and so does every line logged while a step runs: from its "accepted" (the pool thread takes it)
    # to its "succeeded"; the one thread runs one task at a time
    steps: dict[str, list[list[re.Match[str]]]] = {}
    running: tuple[str, int] | None = None
    for index, record in enumerate(records):
        if accepted := _ACCEPTED_LINE.search(record[5]):
            assert running is None, f"two step tasks at once on one thread: {record[0]}"
            running = (accepted[1], index)
        elif (done := _TASK_LINE.search(record[5])) and done[3] == "succeeded":
            assert running is not None and running[0] == done[2], f"succeeded, not running: {record[0]}"
            steps.setdefault(record[3], []).append(records[running[1] : index + 1])
            running = None
    for turn_id, windows in steps.items():
        for lines in windows:
            strays = [line[0] for line in lines if line[3] != turn_id and not _about_another_task(line)]
            assert not strays, f"lines of a step of {turn_id} without its turn id:\n" + "\n".join(strays)
    # (a step may run twice: sent again later when its turn was not committed yet, say)
    assert len(steps.get(turns["server"]["turn_id"], [])) >= SERVER_TOOL_HOPS, sorted(steps)
    assert len(steps.get(turns["client"]["turn_id"], [])) >= CLIENT_TOOL_HOPS, sorted(steps)
    assert set(steps) == {turns["server"]["turn_id"], turns["client"]["turn_id"]}  # no "-": no step lost its turn


def _about_another_task(line: re.Match[str]) -> bool:
    """The consumer's lines while a step runs: another task received (a retry held for its countdown,
    with that task's own turn), or the prefetch count moved for it."""
    return (_TASK_LINE.search(line[5]) is not None and line[3] != "-") or (
        line[2] == "kombu.common" and line[5].startswith("basic.qos:")
    )


def test_gateway_logs_its_start_and_one_access_line_per_request(
    text_system: tuple[System, ManagedProcess, dict[str, dict[str, Any]]],
) -> None:
    system, _worker, _turns = text_system
    gateway = next(process for process in system.stack.processes if process.name.startswith("gateway"))
    marker = uuid.uuid4().hex
    # When the gateway answers requests of every kind
    created = system.post_turn({"input": f"hello m{marker}"})
    assert created.status_code == 202, created.text
    turn_id, session_id = created.json()["turn_id"], created.json()["session_id"]
    system.wait_turn(turn_id)
    unknown = f"turn_{marker}"
    assert system.http.get(f"/v1/turns/{unknown}", headers=system.headers()).status_code == 404
    assert system.http.get(f"/v1/turns/{unknown}/trace").status_code == 401
    assert system.http.get(f"/nowhere-{marker}%0A2026 forged line").status_code == 404  # a newline in the path
    # (each line is written once its response has gone: the last request's line comes last)
    log = wait_for(lambda: gateway.log() if f"/nowhere-{marker}" in gateway.log() else None, what="the last line")
    # Then its start line says where it listens, its version, its services (no password), its keys
    (start,) = [line for line in log.splitlines() if "listening on" in line]
    assert f"listening on {system.gateway_url};" in start and "aptix gateway 0.1.0" in start
    assert f"postgresql+psycopg://postgres:***@{own_db_host(system)}" in start and "2 API key(s)" in start
    assert system.env["APTIX_REDIS_URL"] in start and system.env["APTIX_BROKER_URL"] in start
    assert DB_PASSWORD not in log
    # and each request got exactly one line: route template, status, duration, org, turn
    created_lines = [line for line in log.splitlines() if f"[turn={turn_id} " in line and "POST /v1/turns " in line]
    assert len(created_lines) == 1 and re.search(r"POST /v1/turns 202 \d+\.\dms$", created_lines[0]), created_lines
    unknown_lines = [line for line in log.splitlines() if f"[turn={unknown} " in line]
    assert [re.sub(r"\d+\.\dms$", "ms", line.split("] ", 1)[1]) for line in unknown_lines] == [
        "GET /v1/turns/{turn_id} 404 ms",
        "GET /v1/turns/{turn_id}/trace 401 ms",
    ]
    (nowhere,) = [line for line in log.splitlines() if f"/nowhere-{marker}" in line]
    assert nowhere.endswith(f"GET /nowhere-{marker}\\n2026 forged line 404 " + nowhere.rsplit(" ", 1)[1])
    assert ' HTTP/1.1" ' not in log  # uvicorn's own access line is off
    assert session_id  # the JSON test checks the session and org fields


def own_db_host(system: System) -> str:
    """host:port/database of the module's database URL."""
    return system.env["APTIX_DATABASE_URL"].split("@", 1)[1]


def test_json_logs_of_every_process_parse_and_name_turn_session_org_step_and_worker(
    own_database: str, scripted_llm: ScriptedServer, modes_file: Path
) -> None:
    # Given every process command in JSON: the worker (its two Celery processes), the gateway, the reconciler
    with _running_system(own_database, scripted_llm, modes_file, log_format="json", worker_args=[]) as (
        system,
        worker,
    ):
        argv = [sys.executable, "-m", "aptix_cli", "reconciler"]
        reconciler = system.stack.start("reconciler", argv, {"APTIX_MAX_ITERATOINS": "3"})
        wait_until([reconciler], lambda: "ready." in reconciler.log(), 30)
        # When turns run
        turns = _run_turns(system, worker)
        gateway = next(process for process in system.stack.processes if process.name.startswith("gateway"))
        system.stack.stop_all()  # each process's last lines too (a worker's shutdown)
        logs = {process.name: process.log() for process in (worker, gateway, reconciler)}
    # Then every line of every process is one JSON object with every field
    keys = {"time", "level", "logger", "message", "turn_id", "session_id", "org_id", "step", "worker", "exception"}
    records: dict[str, list[dict[str, Any]]] = {}
    for name, text in logs.items():
        records[name] = []
        for line in text.splitlines():
            record = json.loads(line)  # raises on any line that is not JSON (a banner, a printed warning)
            assert keys <= set(record), (name, line)
            records[name].append(record)
    assert any("APTIX_MAX_ITERATOINS" in r["message"] for r in records["reconciler"])
    # and Celery's lines about each step task name its turn; "succeeded" also its session, org and worker
    task_lines = [r for r in records["worker"] if _TASK_LINE.search(r["message"])]
    assert task_lines and all(r["turn_id"] for r in task_lines), [r for r in task_lines if not r["turn_id"]][:3]
    for turn in turns.values():
        succeeded = [r for r in task_lines if r["turn_id"] == turn["turn_id"] and "succeeded" in r["message"]]
        # (a step may run twice: sent again later when its turn was not committed yet, say)
        assert len(succeeded) >= (SERVER_TOOL_HOPS if turn is turns["server"] else CLIENT_TOOL_HOPS), succeeded
        assert {(r["session_id"], r["org_id"]) for r in succeeded} == {(turn["session_id"], ORG_A)}
        assert all(r["step"] and re.fullmatch(r"(pipeline|llm)\.logs@\S+", r["worker"]) for r in succeeded)
    # and the gateway's lines: its start with its services as fields, one access line per turn it created
    (start,) = [r for r in records[gateway.name] if "listening on" in r["message"]]
    assert start["url"] == system.gateway_url and start["api_keys"] == 2 and start["tracing"] is False
    assert start["database"].startswith("postgresql+psycopg://postgres:***@")
    created = [r for r in records[gateway.name] if r.get("route") == "/v1/turns" and r["method"] == "POST"]
    assert {(r["turn_id"], r["session_id"], r["org_id"], r["status"]) for r in created} == {
        (turn["turn_id"], turn["session_id"], ORG_A, 200) for turn in turns.values()
    }
    assert all(isinstance(r["duration_ms"], float) for r in created)
    assert KEY_A not in "".join(logs.values())
