"""The README's quick start, pasted line by line into fresh shells in a fresh clone, works.

The blocks are read from the README (the ``<!-- quickstart: server -->`` and ``<!-- quickstart:
client -->`` fences), so this test breaks when the README drifts from what the code does. The clone
is made at another path; each block runs in ``bash --noprofile --norc`` with a minimal
environment. The only change made to the text is the port: a free one instead of 8000.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from aptix_cli.launcher import answers, free_port
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

REPO = Path(__file__).resolve().parents[2]
_BLOCK = re.compile(r"<!-- quickstart: (\w+) -->\n```bash\n(.*?)```", re.DOTALL)


def quickstart_blocks(readme: str) -> dict[str, list[str]]:
    """The README's quick-start blocks by name, as the shell lines a reader would paste."""
    return {name: [line for line in body.splitlines() if line.strip()] for name, body in _BLOCK.findall(readme)}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of this repository's HEAD at another path."""
    target = tmp_path_factory.mktemp("elsewhere") / "aptix-clone"
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(REPO), str(target)], check=True, timeout=120)
    return target


def _fresh_env() -> dict[str, str]:
    keep = {name: os.environ[name] for name in ("HOME", "LANG", "TMPDIR") if name in os.environ}
    return {**keep, "PATH": "/usr/local/bin:/usr/bin:/bin", "TERM": "dumb"}


def _with_port(lines: list[str], port: int) -> list[str]:
    return [line.replace("8000", str(port)) for line in lines]


@pytest.fixture(scope="module")
def dev_server(clone: Path) -> Iterator[tuple[int, subprocess.Popen[bytes]]]:
    """The server block: its install line runs to the end, its last line (aptix dev) stays up."""
    blocks = quickstart_blocks((clone / "README.md").read_text())
    assert set(blocks) == {"server", "client"}, f"README quick-start blocks found: {sorted(blocks)}"
    port = free_port()
    *setup, serve = _with_port(blocks["server"], port)
    done = subprocess.run(["bash", "--noprofile", "--norc", "-ec", "\n".join(setup)], cwd=clone, env=_fresh_env(),
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    log = (clone / "dev.log").open("wb")
    server = subprocess.Popen(
        ["bash", "--noprofile", "--norc", "-c", f"exec {serve}"], cwd=clone, env=_fresh_env(),
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        wait_for(lambda: server.poll() is not None or answers(f"http://127.0.0.1:{port}/readyz"),
                 what="aptix dev to be ready", seconds=120, interval=0.2)  # fmt: skip
        assert server.poll() is None, (clone / "dev.log").read_text()
        yield port, server
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGINT)  # Ctrl-C, as the README says
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)
                server.wait()
        log.close()


def test_the_quick_start_runs_as_written_in_a_fresh_clone(clone: Path, dev_server: tuple[int, object]) -> None:
    # Given aptix dev started by the README's first block
    port, _ = dev_server
    client = _with_port(quickstart_blocks((clone / "README.md").read_text())["client"], port)
    # When the second block is pasted into a fresh shell, line by line
    done = subprocess.run(["bash", "--noprofile", "--norc", "-ec", "\n".join(client)], cwd=clone,
                          env=_fresh_env(), capture_output=True, text=True, timeout=300)  # fmt: skip
    # Then every line succeeds and does what its comment says
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Echo: hello" in done.stdout and "status: completed  mode: general" in done.stdout
    paused = json.loads((clone / "paused.json").read_text())
    assert paused["status"] == "requires_client_tools", paused
    assert done.stdout.count("status: completed") >= 2, done.stdout  # hello, then the resumed turn
    assert re.search(r"^\d+ steps, turn " + paused["turn_id"], done.stdout, re.MULTILINE), done.stdout
    assert f"session {paused['session_id']}" in done.stdout
    results = [json.loads(line) for line in (clone / "results.jsonl").read_text().splitlines()]
    requests = (clone / "examples" / "requests.jsonl").read_text().splitlines()
    assert len(results) == len(requests) and results[0]["batch_id"]
    assert {turn["status"] for turn in results} <= {"completed", "requires_client_tools"}, results
    assert done.stdout.rstrip().endswith(str(len(requests))), done.stdout  # `batch results | wc -l`
