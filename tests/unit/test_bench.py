"""The pure helpers of ``aptix bench``: percentiles, /proc parsing, CPU sums, hops, worker plans, report cells."""

from __future__ import annotations

import math
import os
import socket
from pathlib import Path

import pytest

from aptix_cli.bench.cpu import ProcStat, cpu_seconds, descendants, parse_stat, queues_arg
from aptix_cli.bench.hops import TurnHops, hop_tasks
from aptix_cli.bench.interactive import InteractiveSample, interactive_latencies
from aptix_cli.bench.machine import cpu_model
from aptix_cli.bench.processes import worker_plan
from aptix_cli.bench.report import cpu_cells, latency_cell, ratio, statuses_cell
from aptix_cli.bench.rss import RssSampler
from aptix_cli.bench.scenarios import CLIENT_TOOL, SCENARIOS
from aptix_cli.bench.services import redis_db_url
from aptix_cli.bench.stats import RunFigures, percentile, run_figures, turn_latency
from aptix_cli.launcher import free_port
from benchmarks import peer_turn
from scripted_llm.script import ScriptState
from shared.task_names import TaskBoundaries
from tests.support.waiting import wait_for

PLAIN_STEPS = [
    "0:0:request_handler:0",
    "0:1:session_creator:0",
    "0:2:session_context_resolver:0",
    "0:3:context_provider_initializer:0",
    "0:4:reasoner:0",
    "0:5:compose:1",
    "0:6:llm_call:1",
    "0:7:reasoner:1",
    "0:8:persist:1",
]


def _stat_line(pid: int, comm: str, *, ppid: int = 1, utime: int = 0, stime: int = 0, cutime: int = 0) -> str:
    # Fields 3.. of proc(5): state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt
    # utime stime cutime cstime priority nice threads itreal starttime vsize rss ...
    rest = ["S", ppid, 1, 1, 0, -1, 0, 0, 0, 0, 0, utime, stime, cutime, 0, 20, 0, 1, 0, 777, 1000, 55, 0]
    return f"{pid} ({comm}) " + " ".join(str(field) for field in rest)


def test_percentile_interpolates_between_ranks() -> None:
    values = [4.0, 1.0, 3.0, 2.0]
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 4.0
    assert percentile(values, 0.5) == pytest.approx(2.5)
    assert percentile(list(map(float, range(101))), 0.95) == pytest.approx(95.0)


def test_percentile_is_nan_for_no_values_and_refuses_a_bad_fraction() -> None:
    assert math.isnan(percentile([], 0.5))
    with pytest.raises(ValueError):
        percentile([1.0], 1.5)


def test_run_figures_counts_from_the_submission_to_the_last_finish() -> None:
    figures = run_figures([1.0, 2.0, 3.0, 4.0], started=100.0, finished=[101.0, 104.0, 102.0, 103.0])
    assert figures.elapsed == 4.0
    assert figures.rate == 1.0
    assert figures.p50 == pytest.approx(2.5)


def test_parse_stat_reads_a_command_name_with_spaces_and_parentheses() -> None:
    stat = parse_stat(_stat_line(42, "celery (worker) x", ppid=7, utime=11, stime=5, cutime=3))
    assert stat == ProcStat(
        pid=42, comm="celery (worker) x", ppid=7, utime=11, stime=5, cutime=3, cstime=0, starttime=777, rss_pages=55
    )
    assert stat.ticks(with_children=False) == 16
    assert stat.ticks(with_children=True) == 19


def test_parse_stat_refuses_other_text() -> None:
    with pytest.raises(ValueError):
        parse_stat("not a stat line")


def test_descendants_finds_the_whole_tree_and_nothing_else() -> None:
    table = {
        pid: parse_stat(_stat_line(pid, "p", ppid=ppid))
        for pid, ppid in {10: 1, 11: 10, 12: 11, 13: 11, 20: 1, 21: 20}.items()
    }
    assert descendants(table, [10]) == {10, 11, 12, 13}
    assert descendants(table, [10, 99]) == {10, 11, 12, 13}


def test_cpu_seconds_of_a_tree_is_the_difference_of_its_sums() -> None:
    # Given a tree whose child (pid 3) ended and was reaped by pid 2 between the samples
    before = {"workers": {(2, 1): 100, (3, 1): 40}}
    after = {"workers": {(2, 1): 100 + 40 + 60 + 20}}  # cutime took the child's 40 + 60; pid 2 ran 20 more
    # Then the tree used the child's 60 and pid 2's 20 ticks
    assert cpu_seconds(before, after, trees={"workers"}, ticks_per_second=100) == {"workers": 0.8}


def test_cpu_seconds_of_other_groups_counts_each_process_from_its_first_sample_or_zero() -> None:
    before = {"postgres": {(5, 1): 300, (6, 1): 50}}
    after = {"postgres": {(5, 1): 310, (7, 9): 4, (6, 2): 3}}  # pid 6 is a new process (new start time)
    assert cpu_seconds(before, after, ticks_per_second=100) == {"postgres": pytest.approx(0.17)}


def test_queues_arg_reads_the_queues_of_aptix_and_celery_command_lines() -> None:
    assert queues_arg(["python", "-m", "aptix_cli", "worker", "--queues", "llm", "--pool", "gevent"]) == "llm"
    assert (
        queues_arg(["python", "-m", "celery", "-A", "x:app", "worker", "-Q", "pipeline", "-P", "prefork"]) == "pipeline"
    )
    assert queues_arg(["python", "-m", "aptix_cli", "worker", "--queues=tools"]) == "tools"
    assert queues_arg(["python", "-m", "aptix_cli", "worker"]) is None


def test_hop_tasks_of_a_plain_turn_are_six_tasks() -> None:
    tasks = hop_tasks(reversed(PLAIN_STEPS))
    assert TurnHops(tasks).describe() == "entry > reasoner > compose > llm_call > reasoner > persist"
    assert TurnHops(tasks).queues == ("pipeline", "pipeline", "pipeline", "llm", "pipeline", "pipeline")


def test_hop_tasks_start_a_new_chain_for_each_round() -> None:
    reentry = [
        "1:0:request_handler:0",
        "1:1:client_tool_session_restorer:0",
        "1:2:session_context_resolver:0",
        "1:3:context_provider_initializer:0",
        "1:4:client_tool_continuation_resolver:0",
        "1:5:reasoner:0",
        "1:6:compose:2",
        "1:7:llm_call:2",
        "1:8:reasoner:2",
        "1:9:persist:2",
    ]
    assert len(hop_tasks(PLAIN_STEPS + reentry)) == 12


def test_hop_tasks_with_queue_boundaries_collapse_each_run_on_one_queue_into_the_task_of_its_first_step() -> None:
    tasks = hop_tasks(reversed(PLAIN_STEPS), TaskBoundaries.QUEUE)
    assert TurnHops(tasks).describe() == "entry > llm_call > reasoner"
    assert TurnHops(tasks).queues == ("pipeline", "llm", "pipeline")
    reentry = ["1:0:request_handler:0", "1:1:reasoner:0", "1:2:compose:2", "1:3:llm_call:2", "1:4:reasoner:2"]
    assert len(hop_tasks(PLAIN_STEPS + reentry, TaskBoundaries.QUEUE)) == 6  # a round starts a chain of its own


def test_hop_tasks_with_call_boundaries_are_the_entry_and_a_task_per_call() -> None:
    tasks = hop_tasks(reversed(PLAIN_STEPS), TaskBoundaries.CALL)
    assert TurnHops(tasks, TaskBoundaries.CALL).describe() == "entry"
    assert TurnHops(tasks, TaskBoundaries.CALL).queues == ("llm",)
    server_tool = [*PLAIN_STEPS[:7], "0:7:reasoner:1", "0:8:execute_server_tools:1", "0:9:reasoner:1",
                   "0:10:compose:2", "0:11:llm_call:2", "0:12:reasoner:2", "0:13:persist:2"]  # fmt: skip
    hops = TurnHops(hop_tasks(server_tool, TaskBoundaries.CALL), TaskBoundaries.CALL)
    assert hops.describe() == "entry > execute_server_tools > llm_call"  # the entry's task made the first call only
    assert hops.queues == ("llm", "tools", "llm")
    reentry = ["1:0:request_handler:0", "1:1:reasoner:0", "1:2:compose:2", "1:3:llm_call:2", "1:4:reasoner:2"]
    assert hop_tasks(PLAIN_STEPS + reentry, TaskBoundaries.CALL) == ("aptix.step.entry", "aptix.step.entry")


def test_hop_tasks_refuses_a_key_that_is_not_a_step_key() -> None:
    with pytest.raises(ValueError):
        hop_tasks(["0:reasoner"])


def test_worker_plan_without_flags_is_the_worker_groups_plan() -> None:
    plan = worker_plan(["--processes", "1"])
    assert [(spec.queues, spec.pool) for spec in plan.specs] == [
        ("pipeline,tools", "threads"),
        ("llm,webhooks", "gevent"),
    ]
    assert plan.loglevel == "INFO"


def test_worker_plan_with_one_pool_is_one_celery_worker() -> None:
    plan = worker_plan(["--pool", "threads", "--concurrency", "8", "--loglevel", "WARNING"])
    assert [(spec.queues, spec.pool, spec.concurrency) for spec in plan.specs] == [
        ("pipeline,llm,tools,webhooks", "threads", 8)
    ]
    assert plan.loglevel == "WARNING"


def test_worker_plan_refuses_an_unknown_queue() -> None:
    with pytest.raises(ValueError):
        worker_plan(["--queues", "nope"])


def test_cpu_model_is_the_first_model_name() -> None:
    assert cpu_model("processor\t: 0\nmodel name\t: AMD EPYC 7B13\n\nmodel name\t: other\n") == "AMD EPYC 7B13"
    assert cpu_model("processor\t: 0\n") == "unknown CPU"


def test_redis_db_url_replaces_the_database_index() -> None:
    assert redis_db_url("redis://127.0.0.1:6379", 8) == "redis://127.0.0.1:6379/8"
    assert redis_db_url("redis://:secret@host:6380/0", 9) == "redis://:secret@host:6380/9"


def test_scenarios_ask_the_scripted_model_for_their_calls() -> None:
    assert SCENARIOS["plain"].request(3) == {"input": "bench turn 3"}
    assert "[[call:get_current_time {}]]" in SCENARIOS["server-tool"].request(0)["input"]
    client = SCENARIOS["client-tool"].request(0)
    assert client["tools"] == [CLIENT_TOOL]
    assert f"[[call:{CLIENT_TOOL['name']} " in client["input"]


def test_peer_turn_is_the_server_tool_turn_the_scripted_model_answers() -> None:
    # Given the scripted model and the server-tool scenario's user text, as a peer sends it
    model = ScriptState()
    asked = peer_turn.user(peer_turn.user_text(4, SCENARIOS["server-tool"].directive))

    # When the peer calls the model, runs the tool it asks for, and calls it again with the output
    call = peer_turn.function_call(model.answer(peer_turn.request([asked]), seq=1).body)
    output = peer_turn.tool_output(call, peer_turn.get_current_time())
    answer = model.answer(peer_turn.request([asked, call, output]), seq=2).body

    # Then the first answer was the tool call and the second the text with the tool's output
    assert call["name"] == "get_current_time"
    assert peer_turn.answer_text(answer).startswith("Tool results: get_current_time=")
    with pytest.raises(ValueError, match="no function call"):
        peer_turn.function_call(answer)


def test_report_cells() -> None:
    cells = cpu_cells(
        {"gateway": 1.0, "workers": 2.5, "redis": None}, total_of=("gateway", "workers", "redis"), apart=()
    )
    assert cells == "gateway 1.00 | workers 2.50 | redis n/a | total 3.50"
    assert latency_cell(RunFigures(count=1, elapsed=1.0, p50=0.1, p95=0.2, p99=0.3)) == "100 / 200 / 300 ms"
    assert statuses_cell({"queued": 1, "completed": 2}) == "completed 2, queued 1"
    assert ratio(3.0, 2.0) == "1.50x"
    assert ratio(1.0, 0.0) == "n/a"


def test_rss_along_a_run_is_the_first_sample_at_or_past_each_quarter() -> None:
    sampler = RssSampler([], lambda: 0)
    sampler.samples = [(0, 100), (1, 101), (30, 105), (49, 106), (50, 107), (80, 108), (100, 110), (100, 111)]
    assert sampler.along(100) == [(0, 100), (30, 105), (50, 107), (80, 108), (100, 110)]
    sampler.samples = [(0, 100), (20, 120)]  # a run shorter than the sampling period
    assert sampler.along(20) == [(0, 100), (20, 120)]


def test_rss_sampler_samples_this_process_before_during_and_after() -> None:
    finished = iter(range(1000))
    with RssSampler([os.getpid()], lambda: next(finished), every_s=0.01) as sampler:
        wait_for(lambda: len(sampler.samples) >= 2, what="a sample taken during the block", seconds=5, interval=0.01)
    assert len(sampler.samples) >= 3
    assert [done for done, _ in sampler.samples] == list(range(len(sampler.samples)))
    assert all(rss > 1_000_000 for _, rss in sampler.samples)  # a Python process has more than a megabyte resident


def test_free_port_is_free_below_the_ephemeral_range_and_never_handed_out_twice() -> None:
    ports = [free_port() for _ in range(50)]
    assert len(set(ports)) == 50
    low, high = 20000, int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0]) - 1
    assert all(low <= port <= high for port in ports)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", ports[0]))  # nobody holds it


def test_turn_latency_is_created_to_completed_and_none_while_unfinished() -> None:
    turn = {"created_at": "2026-11-23T10:00:00.250000Z", "completed_at": "2026-11-23T10:00:01.000000Z"}
    assert turn_latency(turn) == 0.75
    assert turn_latency({"created_at": "2026-11-23T10:00:00Z", "completed_at": None}) is None


class _TurnsApi:
    """A gateway that answers each interactive turn's create with it queued, then ``outcomes`` in turn."""

    def __init__(self, outcomes: list[str]) -> None:
        self.outcomes = outcomes
        self.created = 0

    def create_turn(self, body: dict[str, object], *, wait: float) -> dict[str, object]:
        self.created += 1
        return {"turn_id": f"t{self.created}", "status": "queued", "created_at": "2026-11-28T10:00:00Z"}

    def get_turn(self, turn_id: str, *, wait: float) -> dict[str, object]:
        status = self.outcomes[int(turn_id[1:]) - 1]
        completed = "2026-11-28T10:00:00.020000Z" if status == "completed" else None
        return {"turn_id": turn_id, "status": status, "created_at": "2026-11-28T10:00:00Z", "completed_at": completed}


def test_interactive_latencies_run_until_stopped_and_keep_when_each_turn_started() -> None:
    # Given a gateway whose second turn fails and the others complete in 20 ms
    api = _TurnsApi(["completed", "failed", "completed", "completed"])
    # When turns are started (as fast as they end) until four have
    sample = interactive_latencies(api, seconds=60, per_second=1000, stop=lambda: api.created >= 4)  # type: ignore[arg-type]
    # Then four started, in order, and three completed with their latency and start
    assert sample.started == 4 and not sample.all_completed
    assert sample.offsets == sorted(sample.offsets) and len(sample.offsets) == 4
    assert sample.latencies == [0.02, 0.02, 0.02]
    assert sample.completed_offsets == [sample.offsets[0], sample.offsets[2], sample.offsets[3]]


def test_the_first_seconds_of_an_interactive_sample_are_the_turns_started_in_them() -> None:
    sample = InteractiveSample(
        started=4, latencies=[0.01, 0.03, 0.04], offsets=[0.0, 0.5, 1.0, 1.5], completed_offsets=[0.0, 1.0, 1.5]
    )
    first = sample.first(1.0)
    assert (first.started, first.latencies, first.offsets, first.completed_offsets) == (2, [0.01], [0.0, 0.5], [0.0])
    assert not first.all_completed
    assert sample.first(10.0) == sample
