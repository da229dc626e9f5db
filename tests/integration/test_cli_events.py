"""``aptix turn --stream`` and ``aptix watch`` against the running system, run as a user would."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import httpx
import pytest

from tests.conftest import KEY_A
from tests.integration.conftest import OPEN_FILE, System
from tests.support.sse import read_sse

pytestmark = pytest.mark.integration


def _aptix(system: System, *args: str) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if key not in ("APTIX_URL", "APTIX_KEY")}
    return subprocess.run(
        [sys.executable, "-m", "aptix_cli", *args],
        env={**env, "APTIX_URL": system.gateway_url, "APTIX_KEY": KEY_A},
        capture_output=True,
        text=True,
        timeout=120,
    )


def _event_ids(system: System, turn_id: str) -> list[tuple[str | None, str]]:
    with httpx.stream("GET", f"{system.gateway_url}/v1/turns/{turn_id}/events", headers=system.headers()) as r:
        return [(event.event_id, event.event) for event in read_sse(r).events]


def test_turn_stream_prints_the_answer_once_and_the_summary(system: System) -> None:
    marker = uuid.uuid4().hex[:10]
    done = _aptix(system, "turn", "--stream", f"streamed {marker}")
    assert done.returncode == 0, done.stderr
    assert done.stdout.count(f"Echo: streamed {marker}") == 1, done.stdout
    assert "status: completed  mode: general" in done.stdout


def test_watch_prints_a_line_per_event_of_a_live_turn_until_it_ends(system: System) -> None:
    # Given a turn whose model takes a while
    turn_id = system.post_turn({"input": f"{uuid.uuid4().hex[:10]} [[sleep:1000]]"}).json()["turn_id"]
    # When it is watched while it runs
    done = _aptix(system, "watch", turn_id)
    # Then each event is one line, id first, the last one the turn's end
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    events = _event_ids(system, turn_id)
    assert [tuple(line.split("  ")[:2]) for line in lines] == events
    assert lines[-1].split("  ")[1] == "turn.completed" and "status=completed" in lines[-1]
    assert any(" llm_call " in line for line in lines)


def test_watch_json_prints_each_event_of_a_paused_turn_and_stops_at_the_pause(system: System, tmp_path: Path) -> None:
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([OPEN_FILE]))
    paused = _aptix(system, "turn", '[[call:open_file {"path": "a"}]] watch', "--tools", str(tools), "--json")
    turn_id = json.loads(paused.stdout)["turn_id"]

    done = _aptix(system, "watch", turn_id, "--json")

    assert done.returncode == 0, done.stderr
    printed = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(event["id"], event["event"]) for event in printed] == _event_ids(system, turn_id)
    assert printed[-1]["event"] == "turn.requires_client_tools"
    assert printed[-1]["data"]["pending_tool_calls"][0]["name"] == "open_file"
