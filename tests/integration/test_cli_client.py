"""The ``aptix`` client commands (turn, tool-results, trace, session, batch) against the running system.

Each test runs the CLI as a subprocess with ``APTIX_URL`` / ``APTIX_KEY`` pointing at the gateway
process of the ``system`` fixture, as a user would.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import KEY_A
from tests.integration.conftest import OPEN_FILE, System

pytestmark = pytest.mark.integration

_TURN_ID = re.compile(r"turn: (\S+)\s+session: (\S+)")


def _marker() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def _env(system: System, **extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("APTIX_URL", "APTIX_KEY")}
    return {**env, "APTIX_URL": system.gateway_url, "APTIX_KEY": KEY_A, **extra}


def _aptix(system: System, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "aptix_cli", *args],
        env=env if env is not None else _env(system),
        capture_output=True,
        text=True,
        timeout=120,
    )


def _ids(stdout: str) -> tuple[str, str]:
    found = _TURN_ID.search(stdout)
    assert found, stdout
    return found.group(1), found.group(2)


def test_turn_prints_the_answer_and_the_mode_when_the_turn_completes(system: System) -> None:
    marker = _marker()
    done = _aptix(system, "turn", f"hello {marker}")
    assert done.returncode == 0, done.stderr
    assert f"Echo: hello {marker}" in done.stdout
    assert "status: completed  mode: general" in done.stdout
    turn_id, session_id = _ids(done.stdout)
    assert turn_id.startswith("turn_") and session_id.startswith("sess_"), (turn_id, session_id)


def test_turn_json_prints_the_raw_turn(system: System) -> None:
    done = _aptix(system, "turn", f"raw {_marker()}", "--json")
    assert done.returncode == 0, done.stderr
    turn: dict[str, Any] = json.loads(done.stdout)
    assert turn["status"] == "completed" and turn["output_text"].startswith("Echo: raw")


def test_client_tool_pause_is_printed_and_tool_results_resume_the_turn(system: System, tmp_path: Path) -> None:
    # Given a tools file declaring a client tool, and an input that makes the model call it
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([OPEN_FILE]))
    call = '[[call:open_file {"path": "a.txt"}]]'
    # When the turn runs
    paused = _aptix(system, "turn", f"{call} {_marker()}", "--tools", str(tools))
    # Then it pauses and prints the pending call with the command to answer it
    assert paused.returncode == 0, paused.stderr
    assert "status: requires_client_tools" in paused.stdout
    (pending,) = re.findall(r"^  (\S+)  open_file  (.*)$", paused.stdout, flags=re.MULTILINE)
    call_id, arguments = pending
    assert json.loads(arguments) == {"path": "a.txt"}
    turn_id, _ = _ids(paused.stdout)
    assert f"aptix tool-results {turn_id} --result {call_id}=OUTPUT" in paused.stdout
    # When the output is sent with tool-results
    resumed = _aptix(system, "tool-results", turn_id, "--result", f"{call_id}=hello = from a.txt")
    # Then the same turn completes with the output (split on the first '=')
    assert resumed.returncode == 0, resumed.stderr
    assert "Tool results: open_file=hello = from a.txt" in resumed.stdout
    assert "status: completed" in resumed.stdout
    assert _ids(resumed.stdout)[0] == turn_id


def test_trace_prints_a_table_with_llm_call_and_exit_rows(system: System) -> None:
    turn_id, _ = _ids(_aptix(system, "turn", f"trace me {_marker()}").stdout)
    done = _aptix(system, "trace", turn_id)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["seq", "kind", "step", "worker", "r", "i", "ms", "details"]
    kinds = [line.split()[1] for line in lines[1:-1]]
    assert "llm_call" in kinds and "exit" in kinds
    assert all(len(line) <= 120 for line in lines)
    exit_row = next(line for line in lines if line.split()[1] == "exit")
    assert "exit_mode=1" in exit_row and "round=" not in exit_row
    assert lines[-1].endswith(f"turn {turn_id}")


def test_session_prints_the_mode_history_and_turns(system: System) -> None:
    # Given a session with a mode change and a follow-up turn
    change = '[[call:agent_change_mode {"targetMode": "ddr-authoring", "reason": "wants a DDR"}]]'
    first_id, session_id = _ids(_aptix(system, "turn", f"{change} {_marker()}").stdout)
    second = _aptix(system, "turn", f"again {_marker()}", "--session", session_id)
    assert second.returncode == 0, second.stderr
    second_id, _ = _ids(second.stdout)
    # When the session is printed
    done = _aptix(system, "session", session_id)
    # Then it shows the mode, the change and both turns
    assert done.returncode == 0, done.stderr
    assert f"session {session_id}  mode: ddr-authoring" in done.stdout
    assert re.search(r"general -> ddr-authoring  at \S+  wants a DDR", done.stdout), done.stdout
    assert "turns (2):" in done.stdout
    assert re.search(rf"{first_id}\s+completed", done.stdout) and re.search(rf"{second_id}\s+completed", done.stdout)


def test_bad_key_exits_1_with_the_401_message(system: System) -> None:
    done = _aptix(system, "turn", "hi", "--key", "not-a-key")
    assert done.returncode == 1
    assert done.stderr.strip() == "error 401 unauthorized: the API key is not valid"


def test_missing_key_exits_2_with_a_clear_message(system: System) -> None:
    env = _env(system)
    del env["APTIX_KEY"]
    done = _aptix(system, "session", "sess_x", env=env)
    assert done.returncode == 2
    assert "no API key" in done.stderr and "APTIX_KEY" in done.stderr


def test_unknown_session_exits_1_with_the_404(system: System) -> None:
    done = _aptix(system, "session", "sess_does_not_exist")
    assert done.returncode == 1
    assert done.stderr.startswith("error 404 ")


def test_unreachable_gateway_names_the_url(system: System) -> None:
    done = _aptix(system, "trace", "turn_x", "--url", "http://127.0.0.1:9")
    assert done.returncode == 1
    assert "cannot reach the gateway at http://127.0.0.1:9" in done.stderr


def test_batch_file_with_a_bad_line_is_refused_naming_the_line(system: System, tmp_path: Path) -> None:
    batch = tmp_path / "bad.jsonl"
    batch.write_text('{"input": "one"}\n\n{"input": oops}\n')
    done = _aptix(system, "batch", "submit", str(batch))
    assert done.returncode == 2
    assert "line 3" in done.stderr


def _batch_file(tmp_path: Path, count: int) -> Path:
    marker = _marker()
    path = tmp_path / "batch.jsonl"
    path.write_text("".join(json.dumps({"input": f"batch {marker} #{i}"}) + "\n" + ("\n" if i == 3 else "")
                            for i in range(count)))  # fmt: skip
    return path


def test_batch_submit_wait_writes_every_result_when_all_turns_complete(system: System, tmp_path: Path) -> None:
    # Given a file of 20 turn requests (with a blank line in it)
    source, out = _batch_file(tmp_path, 20), tmp_path / "results.jsonl"
    # When it is submitted and followed to the end
    done = _aptix(system, "batch", "submit", str(source), "--wait", "--out", str(out), "--poll", "0.3")
    # Then all 20 turns completed, their results are in the file and the summary says so
    assert done.returncode == 0, done.stderr
    assert re.search(r"^batch \S+: 20 turns$", done.stdout, flags=re.MULTILINE), done.stdout
    turns = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(turns) == 20
    assert {turn["status"] for turn in turns} == {"completed"}
    assert all(turn["output_text"].startswith("Echo: batch ") for turn in turns)
    assert "finished: completed 20 failed 0" in done.stdout and "turns/s" in done.stdout
    assert "20/20 100%" in done.stderr and "\r" not in done.stderr


def test_batch_progress_bar_redraws_in_place_on_a_terminal(system: System, tmp_path: Path) -> None:
    # Given a terminal for the command's output
    source = _batch_file(tmp_path, 10)
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "aptix_cli", "batch", "submit", str(source), "--wait", "--poll", "0.2"],
        env=_env(system), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    # When the batch runs to the end
    output = _read_until_exit(master, process)
    # Then the bar was drawn (and redrawn) in place with its rate
    assert process.returncode == 0, output
    assert output.count("\r[") >= 2 and "#" in output and "turns/s" in output
    assert "10/10 100%" in output and "done in" in output


def _read_until_exit(master: int, process: subprocess.Popen[bytes], timeout: float = 120) -> str:
    chunks: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.5)
            if ready:
                try:
                    chunk = os.read(master, 4096)
                except OSError:  # EIO: the child closed its side of the terminal
                    break
                if not chunk:
                    break
                chunks.append(chunk)
            elif process.poll() is not None:
                break
        process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)
    return b"".join(chunks).decode(errors="replace")


def test_batch_status_wait_and_results_pick_a_batch_up_by_its_id(system: System, tmp_path: Path) -> None:
    # Given a batch submitted without --wait (as after Ctrl-C in submit --wait)
    submitted = _aptix(system, "batch", "submit", str(_batch_file(tmp_path, 6)))
    assert submitted.returncode == 0, submitted.stderr
    found = re.search(r"^batch (\S+): 6 turns$", submitted.stdout, flags=re.MULTILINE)
    assert found, submitted.stdout
    batch_id, out = found.group(1), tmp_path / "again.jsonl"
    # When another command follows it by id on a terminal
    master, slave = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "aptix_cli", "batch", "wait", batch_id, "--out", str(out), "--poll", "0.2"],
        env=_env(system), stdin=subprocess.DEVNULL, stdout=slave, stderr=slave,
    )  # fmt: skip
    os.close(slave)
    output = _read_until_exit(master, process)
    # Then it draws the same progress bar, writes every result and sums up
    assert process.returncode == 0, output
    assert "6/6 100%" in output and f"batch {batch_id} finished: completed 6" in output
    assert len(out.read_text().splitlines()) == 6
    # And status and results read the finished batch
    status = _aptix(system, "batch", "status", batch_id)
    assert status.returncode == 0, status.stderr
    assert "completed 6 failed 0 cancelled 0" in status.stdout and "nothing in flight" in status.stdout
    raw = json.loads(_aptix(system, "batch", "status", batch_id, "--json").stdout)
    assert raw["batch_id"] == batch_id and raw["counts"]["completed"] == 6
    results = _aptix(system, "batch", "results", batch_id)
    assert results.returncode == 0, results.stderr
    assert sorted(json.loads(line)["status"] for line in results.stdout.splitlines()) == ["completed"] * 6


def test_batch_status_of_an_unknown_batch_exits_1_with_the_404(system: System) -> None:
    done = _aptix(system, "batch", "status", "batch_does_not_exist")
    assert done.returncode == 1 and done.stderr.startswith("error 404 "), done.stderr


def test_trace_and_session_json_print_the_raw_bodies(system: System) -> None:
    turn_id, session_id = _ids(_aptix(system, "turn", f"raw bodies {_marker()}").stdout)
    trace = json.loads(_aptix(system, "trace", turn_id, "--json").stdout)
    assert trace["turn_id"] == turn_id and any(step["kind"] == "exit" for step in trace["steps"])
    session = json.loads(_aptix(system, "session", session_id, "--json").stdout)
    assert session["session_id"] == session_id and [t["turn_id"] for t in session["turns"]] == [turn_id]


def test_trace_wide_keeps_the_details_the_table_cuts(system: System, tmp_path: Path) -> None:
    # Given a turn whose model call offered many client tools (a long details cell)
    tools = [{**OPEN_FILE, "name": f"client_tool_with_a_long_name_{i}"} for i in range(8)]
    tools_file = tmp_path / "tools.json"
    tools_file.write_text(json.dumps(tools))
    turn_id, _ = _ids(_aptix(system, "turn", f"wide {_marker()}", "--tools", str(tools_file)).stdout)
    # When the trace is printed plain and --wide
    narrow = _aptix(system, "trace", turn_id).stdout.splitlines()
    wide = _aptix(system, "trace", turn_id, "--wide").stdout.splitlines()
    # Then only --wide shows every tool name
    assert all(len(line) <= 120 for line in narrow)
    assert not any("client_tool_with_a_long_name_7" in line for line in narrow)
    assert any("client_tool_with_a_long_name_7" in line and len(line) > 120 for line in wide)


def test_a_closed_pipe_ends_the_command_quietly(system: System) -> None:
    # Given a reader that goes away before the command writes (as `aptix turn ... | head -1` does)
    process = subprocess.Popen(
        [sys.executable, "-m", "aptix_cli", "turn", f"pipe {_marker()}"],
        env=_env(system), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    # When it writes its answer
    stderr = process.stderr.read().decode()
    process.wait(timeout=120)
    # Then it exits as a command stopped by SIGPIPE would, without a traceback
    assert process.returncode == 141, stderr
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_tool_results_with_a_misspelled_call_id_are_refused_and_the_turn_still_waits(
    system: System, tmp_path: Path
) -> None:
    # Given a turn paused on one client tool call
    tools = tmp_path / "tools.json"
    tools.write_text(json.dumps([OPEN_FILE]))
    paused = _aptix(system, "turn", f'[[call:open_file {{"path": "a.txt"}}]] {_marker()}', "--tools", str(tools))
    turn_id, _ = _ids(paused.stdout)
    call_id = re.search(r"--result '?(\S+?)=OUTPUT", paused.stdout)
    assert call_id, paused.stdout
    # When results are sent for a misspelled id
    done = _aptix(system, "tool-results", turn_id, "--result", f"{call_id.group(1)}x=contents")
    # Then the CLI refuses them, naming both ids, and the turn is still waiting
    assert done.returncode == 2
    assert f"not pending: {call_id.group(1)}x" in done.stderr and f"missing: {call_id.group(1)}" in done.stderr
    assert system.http.get(f"/v1/turns/{turn_id}", headers=system.headers()).json()["status"] == "requires_client_tools"
    # And the right id resumes it
    resumed = _aptix(system, "tool-results", turn_id, "--result", f"{call_id.group(1)}=contents")
    assert resumed.returncode == 0, resumed.stderr
    assert "status: completed" in resumed.stdout


def test_batch_submit_with_an_idempotency_key_twice_is_one_batch_then_list_and_cancel(
    system: System, tmp_path: Path
) -> None:
    # Given a file of slow requests submitted twice with one idempotency key
    path = tmp_path / "slow.jsonl"
    path.write_text("".join(json.dumps({"input": f"[[sleep:3000]] cli {_marker()} #{i}"}) + "\n" for i in range(12)))
    key = _marker()
    first = _aptix(system, "batch", "submit", str(path), "--idempotency-key", key)
    again = _aptix(system, "batch", "submit", str(path), "--idempotency-key", key)
    # Then both name the same batch of 12 turns
    ids = [re.search(r"^batch (\S+): 12 turns$", done.stdout, flags=re.MULTILINE) for done in (first, again)]
    assert ids[0] and ids[1], (first.stdout, first.stderr, again.stdout, again.stderr)
    batch_id = ids[0].group(1)
    assert ids[1].group(1) == batch_id
    # And the list shows it first
    listed = _aptix(system, "batch", "list", "--limit", "1")
    assert listed.returncode == 0 and listed.stdout.startswith(batch_id), listed.stdout
    raw = json.loads(_aptix(system, "batch", "list", "--limit", "1", "--json").stdout)
    assert raw["object"] == "list" and raw["data"][0]["batch_id"] == batch_id
    # When it is cancelled, running turns included
    cancelled = _aptix(system, "batch", "cancel", batch_id, "--running", "cancel")
    # Then no turn of it is queued or running any more
    assert cancelled.returncode == 0, cancelled.stderr
    assert cancelled.stdout.startswith(f"batch {batch_id}: cancel"), cancelled.stdout
    status = json.loads(_aptix(system, "batch", "status", batch_id, "--json").stdout)
    assert status["counts"]["queued"] == status["counts"]["running"] == 0
    # And cancelling it again is refused: nothing is left to cancel
    refused = _aptix(system, "batch", "cancel", batch_id)
    assert refused.returncode == 1 and "409 batch_finished" in refused.stderr
