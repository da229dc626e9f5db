"""``aptix dev`` and ``aptix demo``: one process, no external services, the production pipeline."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from aptix_cli.launcher import free_port
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _env_without_aptix_urls() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("APTIX_") and k != "OPENAI_API_KEY"}


def _isolated(argv: list[str]) -> list[str]:
    """``argv`` inside a new network namespace with only loopback: no Redis or PostgreSQL is reachable."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        raise RuntimeError("these tests need `unshare -n` (util-linux, run as root) to cut the local services off")
    quoted = " ".join(f"'{part}'" for part in argv)
    return ["unshare", "-n", "sh", "-c", f"ip link set lo up && exec {quoted}"]


def test_dev_serves_turns_and_a_client_tool_round_trip_without_external_services(tmp_path: Path) -> None:
    # Given `aptix dev` with every APTIX_* URL unset, in a namespace where no local service is reachable
    port = free_port()
    argv = [sys.executable, "-m", "aptix_cli", "dev", "--port", str(port), "--sqlite", str(tmp_path / "dev.sqlite")]
    log = (tmp_path / "dev.log").open("wb")
    # The test talks to it from inside the same namespace, through a small client script.
    client = tmp_path / "client.py"
    client.write_text(_CLIENT_SCRIPT)
    process = subprocess.Popen(
        _isolated([sys.executable, str(client), str(port), *argv]),
        env=_env_without_aptix_urls(),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
        start_new_session=True,  # its own process group: the client and `aptix dev` end together below
    )
    try:
        process.wait(timeout=100)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)  # `aptix dev` too, not the client alone
            process.wait()
    output = (tmp_path / "dev.log").read_text()
    # Then it printed how to use it, and served a plain turn and a client-tool pause and re-entry
    assert process.returncode == 0, output
    assert re.search(r"API key:\s+dev-", output), output
    assert "Ctrl-C" in output
    results = json.loads(output.split("RESULTS ", 1)[1].splitlines()[0])
    assert results["plain"]["status"] == "completed"
    assert results["plain"]["output_text"] == "Echo: hello dev"
    assert results["paused"]["status"] == "requires_client_tools"
    assert results["resumed"]["status"] == "completed"
    assert results["resumed"]["output_text"] == "Tool results: open_file=file body"
    assert results["resumed"]["turn_id"] == results["paused"]["turn_id"]
    assert results["readyz"] == {"database": "ok", "schema": "ok", "redis": "ok", "broker": "ok", "api_keys": "ok"}


_CLIENT_SCRIPT = r"""
import json, re, signal, subprocess, sys, time
import httpx

port, argv = sys.argv[1], sys.argv[2:]
# Ctrl-C as a terminal sends it: a run started in the background (make test &) ignores SIGINT, and an
# ignored signal stays ignored across exec, so `aptix dev` would never see it.
signal.signal(signal.SIGINT, signal.default_int_handler)
dev = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
key, lines = None, []
deadline = time.monotonic() + 60
while key is None and time.monotonic() < deadline:
    line = dev.stdout.readline()
    if not line:
        break
    lines.append(line)
    sys.stdout.write(line)
    found = re.search(r"API key:\s+(\S+)", line)
    key = found.group(1) if found else None
if key is None:
    dev.kill()
    sys.exit("aptix dev did not print its key:\n" + "".join(lines))
url = f"http://127.0.0.1:{port}"
headers = {"Authorization": f"Bearer {key}"}
tool = {"type": "function", "name": "open_file", "parameters": {"type": "object", "properties": {}}}
with httpx.Client(base_url=url, headers=headers, timeout=60) as http:
    plain = http.post("/v1/turns", params={"wait": 30}, json={"input": "hello dev"}).json()
    paused = http.post("/v1/turns", params={"wait": 30},
                       json={"input": '[[call:open_file {"path": "x"}]]', "tools": [tool]}).json()
    call_id = paused["pending_tool_calls"][0]["call_id"]
    http.post(f"/v1/turns/{paused['turn_id']}/tool-results",
              json={"tool_results": [{"call_id": call_id, "output": "file body"}]})
    resumed = http.get(f"/v1/turns/{paused['turn_id']}", params={"wait": 30}).json()
    readyz = http.get("/readyz").json()["checks"]
print("RESULTS " + json.dumps({"plain": plain, "paused": paused, "resumed": resumed, "readyz": readyz}))
dev.send_signal(signal.SIGINT)
sys.stdout.write(dev.stdout.read())  # the same buffered reader as above: communicate() would skip its buffer
sys.exit(dev.wait(timeout=30))
"""


def test_demo_tours_the_system_without_external_services(tmp_path: Path) -> None:
    # Given no APTIX_* URL and no reachable Redis or PostgreSQL
    argv = [sys.executable, "-m", "aptix_cli", "demo"]
    # When the demo runs
    done = subprocess.run(
        _isolated(argv), env=_env_without_aptix_urls(), capture_output=True, text=True, timeout=900, cwd=tmp_path
    )
    # Then it exits 0 after every step of the tour
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-5000:]
    for expected in (
        "1. A new session",
        "2. A server tool",
        "3. A mode change",
        "4. A client tool",
        "5. A batch of 500 turns",
        "500/500 100%",
        "turns/s; latency p50",
        "6. The CompositionTrace",
        "every step worked",
    ):
        assert expected in output, f"{expected!r} missing from the demo output:\n{output[-3000:]}"
    assert "[requires_client_tools, mode ddr-authoring]" in output


def test_dev_runs_the_admission_scheduler_and_the_reconciler(tmp_path: Path, redis_urls: tuple[str, str]) -> None:
    # Given `aptix dev` on real Redis databases (its embedded worker never sends Celery's worker_ready)
    import redis

    from shared.state.keys import RECONCILER_LEADER_KEY, SCHEDULER_LEADER_KEY

    state_url, broker_url = redis_urls
    state = redis.Redis.from_url(state_url)
    state.delete(RECONCILER_LEADER_KEY, SCHEDULER_LEADER_KEY)
    env = {**_env_without_aptix_urls(), "APTIX_REDIS_URL": state_url, "APTIX_BROKER_URL": broker_url}
    argv = [
        sys.executable,
        "-m",
        "aptix_cli",
        "dev",
        "--port",
        str(free_port()),
        "--sqlite",
        str(tmp_path / "d.sqlite"),
    ]
    log = (tmp_path / "dev.log").open("wb")
    process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        # Then both background loops start and take their leader leases in the state store
        wait_for(
            lambda: (
                process.poll() is not None
                or (state.exists(RECONCILER_LEADER_KEY) and state.exists(SCHEDULER_LEADER_KEY))
            ),
            what=f"aptix dev to take both leader leases (its log: {tmp_path / 'dev.log'})",
            seconds=90,
            interval=0.2,
        )
        held = {key: bool(state.exists(key)) for key in (RECONCILER_LEADER_KEY, SCHEDULER_LEADER_KEY)}
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
    assert held == {RECONCILER_LEADER_KEY: True, SCHEDULER_LEADER_KEY: True}, (tmp_path / "dev.log").read_text()
