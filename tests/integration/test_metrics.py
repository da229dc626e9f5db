"""Metrics of real processes: what a completed, a failed and a paused turn move on the workers'
metrics ports, the gateway's own metrics port, a dead prefork child's counts, and the sample
Grafana dashboard against the names the processes really export.

The stack is its own (database, broker, state store): no other test's turn can move its counters.
Two ``aptix worker`` serve it: one with no ``--pool`` (a group of two Celery processes whose parent
serves their sum) and one ``--pool prefork`` (a parent and two children); every count below is
the sum of both metrics pages, whichever worker ran what.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from aptix_cli.launcher import ManagedProcess, free_port
from scripted_llm import ScriptedServer
from shared.settings import Settings
from tests.conftest import redis_databases
from tests.integration.conftest import OPEN_FILE, System, system_env
from tests.support.databases import fresh_database
from tests.support.prometheus import Samples, changes, sample_names, scrape, total
from tests.support.stack import LocalStack
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "aptix-dashboard.json"
MODEL = "scripted-model"
ENTRY_STEPS = ("request_handler", "session_creator", "session_context_resolver", "context_provider_initializer")


@dataclass
class Metered:
    """The stack, its workers' and gateway's metrics URLs."""

    system: System
    workers: dict[str, ManagedProcess]
    worker_urls: list[str]
    gateway_metrics_url: str

    def worker_samples(self) -> Samples:
        """Both workers' pages, summed sample by sample."""
        summed: Samples = {}
        for url in self.worker_urls:
            for key, value in scrape(url).items():
                summed[key] = summed.get(key, 0.0) + value
        return summed

    def after(self, before: Samples, name: str, labels: dict[str, str], count: float) -> Samples:
        """The workers' samples once ``name{labels}`` moved by ``count`` since ``before``."""

        def moved() -> Samples | None:
            now = self.worker_samples()
            return now if total(changes(before, now), name, labels) >= count else None

        return wait_for(moved, what=f"{name}{labels} to move by {count}")


@pytest.fixture(scope="module")
def metered(services: None, scripted_llm: ScriptedServer, modes_file: Path) -> Iterator[Metered]:
    """Its own database, broker and state store; a group worker, a prefork worker, a gateway with a metrics port."""
    with redis_databases(2) as (state_url, broker_url), fresh_database("aptix_test_metrics") as database_url:
        env = system_env(
            database_url=database_url, redis_urls=(state_url, broker_url), llm=scripted_llm, modes_file=modes_file
        )
        env["APTIX_LLM_MAX_ATTEMPTS"] = "2"  # a failing model fails the turn after one retry
        stack = LocalStack(env)
        try:
            workers = {
                "group": stack.start_worker("mgroup", pool=None),
                "prefork": stack.start_worker("mfork", pool="prefork", concurrency=2),
            }
            port = free_port()
            _, url = stack.start_gateway(env={"APTIX_METRICS_PORT": str(port)})
            yield Metered(
                system=System(stack=stack, gateway_url=url, llm=scripted_llm, env=env),
                workers=workers,
                worker_urls=[stack.metrics_urls["mgroup"], stack.metrics_urls["mfork"]],
                gateway_metrics_url=f"http://127.0.0.1:{port}/metrics",
            )
        finally:
            stack.stop_all()


def test_a_completed_turn_moves_the_worker_metrics_by_its_steps_its_model_call_and_its_tokens(
    metered: Metered,
) -> None:
    # Given the workers' metrics
    before = metered.worker_samples()
    # When a turn completes
    turn = metered.system.run_turn({"input": "count this turn"})
    assert turn["status"] == "completed", turn
    moved = changes(before, metered.after(before, "aptix_turns_finished_total", {"status": "completed"}, 1))
    # Then the turn is counted once, each of its steps once (the reasoner twice), one model call and its tokens
    assert _by(moved, "aptix_turns_finished_total", "status", "code") == {("completed", ""): 1}
    expected_steps = {**dict.fromkeys(ENTRY_STEPS, 1), "reasoner": 2, "compose": 1, "llm_call": 1, "persist": 1}
    assert _by(moved, "aptix_step_seconds_count", "step") == {(step,): n for step, n in expected_steps.items()}
    assert _by(moved, "aptix_step_seconds_count", "layer")[("entry",)] == len(ENTRY_STEPS)
    assert _by(moved, "aptix_model_call_seconds_count", "model", "outcome") == {(MODEL, "ok"): 1}
    usage = turn["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] > 0, usage
    assert _by(moved, "aptix_model_tokens_total", "kind") == {
        ("input",): usage["input_tokens"],
        ("output",): usage["output_tokens"],
    }
    # And nothing was retried, redelivered or paused
    for name in ("aptix_step_retries_total", "aptix_steps_redelivered_total", "aptix_turns_paused_total"):
        assert not _by(moved, name), name


def test_a_turn_the_model_fails_is_counted_failed_by_code_with_its_retry_and_both_5xx_calls(
    metered: Metered,
) -> None:
    # Given a model that answers 500 to every call, and two calls allowed per step
    before = metered.worker_samples()
    # When a turn runs
    turn = metered.system.run_turn({"input": "[[fail:500]] count this failure"})
    assert turn["status"] == "failed" and turn["error"]["code"] == "llm_error", turn
    moved = changes(before, metered.after(before, "aptix_turns_finished_total", {"status": "failed"}, 1))
    # Then it is counted failed with its code, after two 5xx calls and one retry for the model
    assert _by(moved, "aptix_turns_finished_total", "status", "code") == {("failed", "llm_error"): 1}
    assert _by(moved, "aptix_model_call_seconds_count", "model", "outcome") == {(MODEL, "5xx"): 2}
    assert _by(moved, "aptix_step_retries_total", "reason", "step") == {("model", "llm_call"): 1}
    assert _by(moved, "aptix_step_seconds_count", "step")[("llm_call",)] == 2
    assert not _by(moved, "aptix_model_tokens_total")


def test_a_client_tool_pause_is_counted_as_a_pause_and_its_resumption_as_one_completed_turn(
    metered: Metered,
) -> None:
    system = metered.system
    # Given a turn that pauses for a client tool
    before = metered.worker_samples()
    turn = system.run_turn({"input": '[[call:open_file {"path": "a.txt"}]]', "tools": [OPEN_FILE]})
    assert turn["status"] == "requires_client_tools", turn
    paused = metered.after(before, "aptix_turns_paused_total", {}, 1)
    # Then the pause is counted, and no finished turn
    assert total(changes(before, paused), "aptix_turns_paused_total") == 1
    assert not _by(changes(before, paused), "aptix_turns_finished_total")
    # When its results are posted and it completes
    call_id = turn["pending_tool_calls"][0]["call_id"]
    resumed = system.resume(turn["turn_id"], [{"call_id": call_id, "output": "file body"}])
    assert resumed["status"] == "completed", resumed
    moved = changes(before, metered.after(before, "aptix_turns_finished_total", {"status": "completed"}, 1))
    # Then one pause and one completed turn in all, and the re-entry's steps
    assert total(moved, "aptix_turns_paused_total") == 1
    assert _by(moved, "aptix_turns_finished_total", "status", "code") == {("completed", ""): 1}
    steps = _by(moved, "aptix_step_seconds_count", "step")
    assert steps[("client_tool_session_restorer",)] == 1 and steps[("persist",)] == 2, steps


def test_the_gateway_serves_metrics_on_its_own_port_only_and_counts_the_turns_it_cancels(metered: Metered) -> None:
    system = metered.system
    # Given a turn paused for a client tool
    turn = system.run_turn({"input": '[[call:open_file {"path": "b.txt"}]]', "tools": [OPEN_FILE]})
    assert turn["status"] == "requires_client_tools", turn
    before = scrape(metered.gateway_metrics_url)
    workers_before = metered.worker_samples()
    # When its client cancels it
    response = system.http.post(f"/v1/turns/{turn['turn_id']}/cancel", headers=system.headers())
    assert response.status_code == 200 and response.json()["status"] == "cancelled", response.text
    # Then the gateway counts it cancelled, once, on its metrics port; the workers do not count it
    moved = changes(before, scrape(metered.gateway_metrics_url))
    assert _by(moved, "aptix_turns_finished_total", "status", "code") == {("cancelled", "cancelled"): 1}
    assert not _by(changes(workers_before, metered.worker_samples()), "aptix_turns_finished_total")
    # And the API port has no /metrics, while the metrics port has the request and turn counts
    assert system.http.get("/metrics").status_code == 404
    page = scrape(metered.gateway_metrics_url)
    assert total(page, "aptix_turns_accepted_total", {"kind": "single"}) >= 1
    assert total(page, "aptix_http_requests_total", {"route": "/v1/turns/{turn_id}/cancel", "status": "200"}) == 1


def test_a_killed_prefork_child_keeps_its_counts_in_the_sum_and_its_file_is_folded(metered: Metered) -> None:
    # Given a prefork child that ran steps (it has metric files of its own) and the worker's page
    parent = metered.workers["prefork"]
    directory = _metrics_directory(parent.pid)

    url = metered.worker_urls[1]

    def counting_child() -> int | None:
        # Turns until the prefork worker ran some steps (the other worker takes steps of the same
        # turns: which steps land here is up to the broker).
        metered.system.run_turn({"input": "make the children count"})
        if total(scrape(url), "aptix_step_seconds_count") == 0:
            return None
        return _counting_child(directory, parent.pid)

    child = wait_for(counting_child, what="a prefork child with metric files", seconds=90)
    before = scrape(url)
    # When the child is killed (Celery starts another in its place)
    os.kill(child, signal.SIGKILL)
    wait_for(lambda: not Path(f"/proc/{child}").exists() or _zombie(child), what=f"child {child} to die")
    # Then the next scrape folds its files into the dead processes' file and every count stays
    after = wait_for(lambda: (page := scrape(url)) and not list(directory.glob(f"*_{child}.db")) and page,
                     what="the dead child's files to be folded")  # fmt: skip
    assert (directory / "counter_dead.db").exists() and (directory / "histogram_dead.db").exists()
    # No count goes down (which steps the child ran, and so which counters it holds, is the broker's choice).
    for name in ("aptix_turns_finished_total", "aptix_step_seconds_count", "aptix_model_call_seconds_count"):
        assert total(after, name) >= total(before, name), name
    assert total(before, "aptix_step_seconds_count") > 0
    assert total(after, "aptix_step_seconds_sum") >= total(before, "aptix_step_seconds_sum")


def test_the_reconciler_apart_serves_its_own_metrics(metered: Metered) -> None:
    # Given `aptix reconciler` on the stack, with a metrics port of its own
    port = free_port()
    argv = [sys.executable, "-m", "aptix_cli", "reconciler"]
    reconciler = metered.system.stack.start("metrics-reconciler", argv, {"APTIX_WORKER_METRICS_PORT": str(port)})
    try:
        # Then its page answers, with the reconciler's counters
        url = f"http://127.0.0.1:{port}/metrics"
        page = wait_for(lambda: "ready." in reconciler.log() and scrape(url), what="the reconciler's metrics")
        assert ("aptix_reconciler_scans_total", frozenset()) in page
        assert total(page, "aptix_reconciler_redrives_total") == 0
    finally:
        metered.system.stack.stop([reconciler])


def test_a_worker_whose_metrics_port_is_taken_stops_and_says_which_setting_to_change(metered: Metered) -> None:
    # Given a port something else holds
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        # When `aptix worker` (a group: its parent serves the metrics) is told to serve there
        worker = metered.system.stack.start(
            "metrics-clash", [sys.executable, "-m", "aptix_cli", "worker"], {"APTIX_WORKER_METRICS_PORT": str(port)}
        )
        worker.popen.wait(timeout=60)
    # Then it stops at once, naming the setting, and started no Celery process
    assert worker.popen.returncode != 0
    log = worker.log()
    assert f"cannot serve metrics on 127.0.0.1:{port}" in log and "APTIX_WORKER_METRICS_PORT" in log, log
    assert "ready." not in log
    metered.system.stack.stop([worker])


def test_a_worker_on_a_host_whose_default_metrics_port_is_taken_starts_without_metrics(metered: Metered) -> None:
    # Given the default metrics port held (by this test, or already by another process on the host)
    default = Settings.model_fields["worker_metrics_port"].default
    with contextlib.ExitStack() as held:
        with contextlib.suppress(OSError):
            holder = held.enter_context(socket.socket())
            holder.bind(("127.0.0.1", default))
            holder.listen()
        # When `aptix worker` starts with no APTIX_WORKER_METRICS_PORT of its own (as a second worker on a
        # host would, docs/scaling.md)
        env = {key: value for key, value in metered.system.stack.env.items() if key != "APTIX_WORKER_METRICS_PORT"}
        worker = ManagedProcess("metrics-default-taken", [sys.executable, "-m", "aptix_cli", "worker"], env,
                                metered.system.stack.log_dir)  # fmt: skip
        try:
            # Then it says it serves no metrics, and starts all the same
            wait_for(lambda: worker.popen.poll() is not None or "ready." in worker.log(),
                     what="the worker to start", seconds=60)  # fmt: skip
            log = worker.log()
            assert worker.popen.poll() is None, log
            assert f"cannot serve metrics on 127.0.0.1:{default}" in log and "serving no metrics" in log, log
        finally:
            worker.stop()


def test_the_sample_dashboard_loads_and_uses_only_metrics_aptix_exports(metered: Metered) -> None:
    # Given the names every process exports after turns ran (the earlier tests, and one more here)
    metered.system.run_turn({"input": "one more for the dashboard"})
    exported = sample_names(metered.worker_samples()) | sample_names(scrape(metered.gateway_metrics_url))
    # When the dashboard is read
    dashboard = json.loads(DASHBOARD.read_text())
    # Then it is a dashboard Grafana loads: a schema version, a title, panels with a grid position and queries
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert dashboard["title"] and dashboard["uid"]
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert len(panels) >= 8
    expressions = []
    for panel in panels:
        assert panel["title"] and set(panel["gridPos"]) == {"x", "y", "w", "h"}, panel
        assert panel["targets"] and panel["datasource"]["type"] == "prometheus", panel["title"]
        expressions += [target["expr"] for target in panel["targets"]]
    for expr in expressions:
        assert _balanced(expr), f"unbalanced brackets or quotes: {expr}"
    # And every metric its queries name is one Aptix exports
    named = {name for expr in expressions for name in re.findall(r"\b(aptix_[a-z0-9_]+)", expr)}
    assert named, expressions
    assert not named - exported, f"not exported by any process: {sorted(named - exported)}"
    # And it shows the turns, steps, model calls, tokens, retries, re-drives and queue depth
    for wanted in ("aptix_turns_finished_total", "aptix_step_seconds_bucket", "aptix_model_call_seconds_bucket",
                   "aptix_model_tokens_total", "aptix_step_retries_total", "aptix_reconciler_redrives_total",
                   "aptix_queue_depth", "aptix_http_requests_total"):  # fmt: skip
        assert wanted in named, wanted


def _balanced(expr: str) -> bool:
    """Whether the brackets of a PromQL expression pair up (outside its quoted label values)."""
    closing = {")": "(", "]": "[", "}": "{"}
    stack: list[str] = []
    for char in re.sub(r'"[^"]*"', '""', expr):
        if char in "([{":
            stack.append(char)
        elif char in closing and (not stack or stack.pop() != closing[char]):
            return False
    return not stack and expr.count('"') % 2 == 0


def _by(samples: Samples, name: str, *labels: str) -> dict[tuple[str, ...], float]:
    """The ``name`` samples summed by the values of ``labels``."""
    out: dict[tuple[str, ...], float] = {}
    for (sample, pairs), value in samples.items():
        if sample == name:
            found = dict(pairs)
            key = tuple(found.get(label, "") for label in labels)
            out[key] = out.get(key, 0.0) + value
    return {key: value for key, value in out.items() if value}


def _metrics_directory(pid: int) -> Path:
    """The metrics directory ``aptix worker`` ``pid`` made (``aptix_cli.metrics_dir``)."""
    found = list(Path(tempfile.gettempdir()).glob(f"aptix-metrics-{pid}-*"))
    assert len(found) == 1, found
    return found[0]


def _counting_child(directory: Path, parent: int) -> int | None:
    """A live child of ``parent`` with a counter file in ``directory``."""
    for path in directory.glob("counter_*.db"):
        pid = path.stem.rpartition("_")[2]
        if pid.isdigit() and int(pid) != parent and _parent_of(int(pid)) == parent:
            return int(pid)
    return None


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
