"""``aptix bench``: the production shape, measured on real services, then a bare Celery chain on the same hops.

A run, all on a scratch PostgreSQL database and two scratch Redis databases (:mod:`.services`):

1. start the scripted model, one ``aptix gateway`` and ``--workers`` ``aptix worker`` processes
   (:mod:`.processes`); warm up with up to 100 turns, not measured;
2. per scenario, one batch of ``--turns`` turns: hops per turn, turns/s, latency percentiles and
   CPU per turn of every process group (:mod:`.measure`, :mod:`.cpu`);
3. stop the Aptix processes, start bare-chain Celery workers with the same pool plan, and run as
   many chains as turns over each scenario's hops, queue for queue (:mod:`.bare_chain`);
4. print the comparison; with ``--peers``, run the same server-tool turns in each durable peer
   (DBOS Transact, LangGraph: :mod:`.peers`) against the same scripted model and print them beside
   Aptix and the bare chain. With ``--interactive``, steps 2-4 are replaced by the p95 latency of
   single turns on the idle system and under a batch of ``--turns`` turns; with ``--two-orgs``, by
   two organisations' batches side by side (:mod:`.two_orgs`); with ``--openai-batch``, by a file of
   ``--turns`` requests through OpenAI's Files and Batch API (:mod:`.openai_batch`).

Every process is stopped by its pid and the scratch data is removed at the end, also after Ctrl-C,
SIGTERM or a failure (the processes' logs are kept then, and their folder is printed).
"""

from __future__ import annotations

import functools
import secrets
import shutil
import signal
import sys
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import FrameType

import psycopg
import redis

from aptix_cli import batch_progress
from aptix_cli.bench import bare_chain, turn_runs
from aptix_cli.bench.cpu import CpuMeter, Group, ProcessTable, descendants, read_processes, rss_bytes, serving
from aptix_cli.bench.interactive import InteractiveSample, interactive_latencies
from aptix_cli.bench.machine import describe_machine
from aptix_cli.bench.measure import ChainResult, TurnResult, measure_chains, measure_turns
from aptix_cli.bench.openai_batch import run_openai_batch, run_openai_two_orgs
from aptix_cli.bench.options import BenchOptions
from aptix_cli.bench.peers import CONCURRENCY as PEER_CONCURRENCY
from aptix_cli.bench.peers import PEERS, Peer, PeerResult, peer_python, repo_root, run_peer
from aptix_cli.bench.processes import BenchProcesses, WorkerPlan, worker_plan
from aptix_cli.bench.report import (
    Report,
    chain_lines,
    comparison_table,
    peer_lines,
    peers_table,
    ratio,
    turn_lines,
)
from aptix_cli.bench.rss import RssSampler
from aptix_cli.bench.scenarios import SCENARIOS
from aptix_cli.bench.server_stats import RedisServer, ServerStats, pg_commits
from aptix_cli.bench.services import Scratch, ScratchServices
from aptix_cli.bench.stats import percentile
from aptix_cli.bench.two_orgs import run_two_orgs
from aptix_cli.client import ApiClient, ClientError
from aptix_cli.launcher import ManagedProcess, free_port
from shared.models.turn import TurnStatus
from shared.redis_clients import redis_client
from shared.settings import Settings

__all__ = ["run_production_bench"]

TOTAL_OF = ("gateway", "workers", "redis", "postgres")
"""The process groups whose CPU makes a turn's total."""
BARE_TOTAL_OF = ("workers", "redis")
_WARM_UP_TURNS = 100
_INTERACTIVE_PER_SECOND = 2.0
_IDLE_SECONDS = 40.0
"""How long interactive turns are measured on the idle system (80 turns: a p95 that is not the slowest few)."""
_LOADED_MAX_SECONDS = 900.0
"""The longest the batch's measurement goes on: it ends with the batch, whose whole run it covers."""
_FIRST_SECONDS = 20.0
"""The part of the batch's run that the measurement covered until 2026-11-28 (printed beside, to compare)."""
_BODY_LIMIT = 256 * 1024 * 1024


def run_production_bench(options: BenchOptions) -> int:
    """Measure and print; 0 when every turn and chain completed, 1 otherwise, 2 for bad options."""
    from shared.logging import configure_logging

    try:
        worker = worker_plan(options.worker_args)
    except ValueError as exc:
        sys.stderr.write(f"aptix bench: --worker-args: {exc}\n")
        return 2
    configure_logging("ERROR")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    services = ScratchServices(
        database_url=options.database_url, redis_url=options.redis_url, state_url=options.state_url
    )
    processes: BenchProcesses | None = None
    ok = False
    try:
        scratch = services.__enter__()
        api_key = f"bench-{secrets.token_urlsafe(12)}"
        model_port = free_port()
        processes = BenchProcesses(_environment(options, scratch, api_key, model_port))
        run = _Run(options, worker, services, scratch, processes, Report(sys.stdout))
        ok = run.run(api_key, model_port)
    except KeyboardInterrupt:
        sys.stderr.write("aptix bench: interrupted\n")
    except (ClientError, RuntimeError, OSError, redis.RedisError, psycopg.Error) as exc:
        sys.stderr.write(f"aptix bench: failed: {exc}\n")
    finally:
        with _signals_ignored():
            if processes is not None:
                processes.stop_all()
                if ok:
                    shutil.rmtree(processes.log_dir, ignore_errors=True)
                else:
                    sys.stderr.write(f"aptix bench: the processes' logs are in {processes.log_dir}\n")
            services.cleanup()
        signal.signal(signal.SIGTERM, previous)
    return 0 if ok else 1


class _Run:
    """The phases of one run, sharing its processes, services and report."""

    def __init__(
        self,
        options: BenchOptions,
        worker: WorkerPlan,
        services: ScratchServices,
        scratch: Scratch,
        processes: BenchProcesses,
        report: Report,
    ) -> None:
        self.options = options
        self.worker = worker
        self.services = services
        self.scratch = scratch
        self.processes = processes
        self.report = report
        self.control = bare_chain.create_app(Settings(redis_url=scratch.state_url, broker_url=scratch.broker_url))
        self.state = redis_client(scratch.state_url, max_connections=8)
        self.servers = ServerStats(
            [RedisServer(role, client) for role, client in services.redis_servers()],
            pg_commits(scratch.dsn, scratch.database_name),
        )
        self.ok = True

    def run(self, api_key: str, model_port: int) -> bool:
        """Every phase; whether every turn and chain completed."""
        self._header()
        pythons = self._peer_pythons() if self.options.peers else {}
        model = self.processes.start_model(port=model_port, latency_ms=self.options.llm_latency_ms)
        gateway, url = self.processes.start_gateway()
        workers = self.processes.start_workers(self.options.workers, self.worker, self.control)
        self._task_events()
        meter = self._aptix_meter(gateway, workers, model)
        with ApiClient(url, key=api_key, timeout=900) as api:
            self._warm_up(api, meter, workers)
            if self.options.interactive:
                self._interactive(api)
                return self.ok
            if self.options.openai_batch:
                self.ok = self._openai_batch(url, api_key, gateway) and self.ok
                return self.ok
            if self.options.two_orgs:
                with ApiClient(url, key=f"{api_key}-b", timeout=900) as api_b:
                    self.ok = run_two_orgs(api, api_b, turns=self.options.turns, dsn=self.scratch.dsn,
                                           report=self.report) and self.ok  # fmt: skip
                return self.ok
            results = [(name, self._scenario(api, name, meter, workers)) for name in self.options.scenarios]
        self.processes.stop([*workers, gateway])
        rows = self._bare_chains(results)
        if self.options.peers:
            self._peers(rows, pythons, f"http://127.0.0.1:{model_port}")
        return self.ok

    def _openai_batch(self, url: str, api_key: str, gateway: ManagedProcess) -> bool:
        if self.options.two_orgs:
            return run_openai_two_orgs(url, api_key, f"{api_key}-b", turns=self.options.turns, dsn=self.scratch.dsn,
                                       report=self.report)  # fmt: skip
        return run_openai_batch(url, api_key, turns=self.options.turns, gateway_pid=gateway.pid, dsn=self.scratch.dsn,
                                report=self.report)  # fmt: skip

    def _header(self) -> None:
        options = self.options
        what = "interactive latency" if options.interactive else f"{options.turns} turns per scenario"
        if options.two_orgs:
            what = f"two organisations' batches of {options.turns} turns"
        if options.openai_batch:
            what = (
                f"an OpenAI batch of {options.turns} requests"
                if not options.two_orgs
                else (f"two organisations' OpenAI batches of {options.turns} requests")
            )
        args = " " + " ".join(self.worker.args) if self.worker.args else " (no flags)"
        self.report.line(f"aptix bench: the production shape, {what}, model latency {options.llm_latency_ms:g} ms")
        self.report.field("machine", describe_machine())
        self.report.field("services", self.services.describe())
        self.report.field("processes", f"1 aptix gateway, {options.workers} x aptix worker{args}, the scripted model")
        self.report.field("each aptix worker", self.worker.describe())
        events = "on (as when Flower watches)" if options.task_events else "off (until Flower asks for them)"
        self.report.field("task events", events)
        self.report.field("task boundaries", f"{options.task_boundaries.value} (APTIX_TASK_BOUNDARIES)")
        if options.peers:
            each = "; ".join(f"{peer.title} ({', '.join(peer.requirements)})" for peer in PEERS)
            self.report.field(
                "durable peers",
                f"{each}; each in one process of its own virtualenv on a scratch database of its own, at most "
                f"{PEER_CONCURRENCY} turns at a time, after a warm-up of up to {_WARM_UP_TURNS} turns",
            )
        self.report.field(
            "CPU counted",
            "gateway; workers (every aptix worker with all its descendants); redis (redis-server); "
            "postgres (server processes + the scratch database's backends); from /proc/<pid>/stat",
        )
        self.report.field(
            "servers counted",
            "Redis: INFO commandstats (commands, those scripts call included; evalsha = script runs) and INFO "
            "cpu, per server (state and broker apart when apart; a cluster summed over its nodes); PostgreSQL: "
            "pg_stat_database xact_commit of the scratch database (its statistics lag up to a second or so)",
        )

    def _task_events(self) -> None:
        """Turn the running workers' task events on, with the broadcast Flower sends, if asked."""
        if self.options.task_events:
            self.control.control.enable_events()

    def _aptix_meter(
        self, gateway: ManagedProcess, workers: Sequence[ManagedProcess], model: ManagedProcess
    ) -> CpuMeter:
        worker_pids = [process.pid for process in workers]
        return CpuMeter(
            [
                Group("gateway", lambda table: descendants(table, [gateway.pid]), tree=True),
                Group("workers", lambda table: descendants(table, worker_pids), tree=True),
                Group("redis", self.services.redis_members, tree=False),
                Group("postgres", self.services.postgres_members, tree=True),
                Group("model", lambda table: descendants(table, [model.pid]), tree=True),
                *self._by_queues(worker_pids),
            ]
        )

    def _by_queues(self, roots: Sequence[int]) -> list[Group]:
        """One group per queue group of the worker plan (when it has several): its Celery workers and children."""
        if len(self.worker.specs) < 2:
            return []
        return [
            Group(spec.queues, functools.partial(_serving, roots, spec.queues), tree=True) for spec in self.worker.specs
        ]

    @property
    def _queue_groups(self) -> tuple[str, ...]:
        return tuple(spec.queues for spec in self.worker.specs) if len(self.worker.specs) > 1 else ()

    def _warm_up(self, api: ApiClient, meter: CpuMeter, workers: Sequence[ManagedProcess]) -> None:
        names = ["plain"] if self.options.interactive else list(self.options.scenarios)
        each = max(1, min(_WARM_UP_TURNS, self.options.turns) // len(names))
        for name in names:
            result = self._measure(api, name, each, meter)
            if not result.run.all_completed:
                self.ok = False
                self.report.field("warm-up", f"{name}: {result.run.statuses}")
        self.report.field("warm-up", f"{each * len(names)} turns ({', '.join(names)}), not measured")
        self._rss(workers, "after the warm-up")

    def _scenario(self, api: ApiClient, name: str, meter: CpuMeter, workers: Sequence[ManagedProcess]) -> TurnResult:
        if not self.options.rss:
            result = self._measure(api, name, self.options.turns, meter)
        else:
            with psycopg.connect(self.scratch.dsn, autocommit=True) as db:
                already = _finished_turns(db)
                with RssSampler([w.pid for w in workers], lambda: _finished_turns(db) - already) as sampler:
                    result = self._measure(api, name, self.options.turns, meter)
        self.report.line()
        self.report.lines(turn_lines(result, total_of=TOTAL_OF, apart=("model",), by_queues=self._queue_groups))
        self._rss(workers, f"after {self.options.turns} more turns")
        if self.options.rss:
            points = ", ".join(f"{done:,}: {rss / 2**20:.0f}" for done, rss in sampler.along(self.options.turns))
            self.report.field("workers' RSS along", f"{points} (turns finished: MB)")
        self.ok = self.ok and result.run.all_completed
        return result

    def _measure(self, api: ApiClient, name: str, turns: int, meter: CpuMeter) -> TurnResult:
        dsn = self.scratch.dsn
        return measure_turns(
            api,
            SCENARIOS[name],
            turns,
            meter=meter,
            state=self.state,
            poster=lambda: turn_runs.ToolResultPoster(api, dsn),
            progress=sys.stderr,
            servers=self.servers,
            boundaries=self.options.task_boundaries,
        )

    def _rss(self, workers: Sequence[ManagedProcess], when: str) -> None:
        if self.options.rss:
            table = read_processes()
            total = rss_bytes(table, descendants(table, [process.pid for process in workers]))
            self.report.field("workers' RSS", f"{total / 2**20:.0f} MB {when} (summed over every worker process)")

    def _interactive(self, api: ApiClient) -> None:
        turns = self.options.turns
        idle = interactive_latencies(api, seconds=_IDLE_SECONDS, per_second=_INTERACTIVE_PER_SECOND)
        submitted = turn_runs.submit(api, SCENARIOS["plain"], turns)

        def batch_done() -> bool:
            counts = api.get_batch(submitted.batch_id)["counts"]
            return batch_progress.finished(counts) >= turns

        loaded = interactive_latencies(
            api, seconds=_LOADED_MAX_SECONDS, per_second=_INTERACTIVE_PER_SECOND, stop=batch_done
        )
        turn_runs.wait(api, submitted, poster=None, progress=None)
        batch = turn_runs.collect(api, SCENARIOS["plain"], submitted)
        first = loaded.first(_FIRST_SECONDS)
        self.report.line()
        self.report.line(
            f"interactive plain turns, one at a time, {_INTERACTIVE_PER_SECOND:g}/s: {_IDLE_SECONDS:g} s idle, then "
            f"for as long as the batch runs (latency created to completed)"
        )
        self.report.field("idle", _interactive_cell(idle))
        self.report.field(f"under a batch of {turns}", _interactive_cell(loaded))
        self.report.field("p95 ratio", f"{_p95_ratio(loaded, idle)} (under the batch / idle)")
        self.report.field(
            f"its first {_FIRST_SECONDS:g} s", f"{_interactive_cell(first)}; p95 ratio {_p95_ratio(first, idle)}"
        )
        self.report.field(
            "the batch", f"{batch.figures.rate:.1f} turns/s; {', '.join(f'{s} {n}' for s, n in batch.statuses.items())}"
        )
        self.ok = self.ok and idle.all_completed and loaded.all_completed and batch.all_completed

    def _bare_chains(self, results: Sequence[tuple[str, TurnResult]]) -> list[tuple[str, TurnResult, ChainResult]]:
        workers = self.processes.start_bare_workers(self.options.workers, self.worker, self.control)
        self._task_events()
        pids = [process.pid for process in workers]
        meter = CpuMeter(
            [
                Group("workers", lambda table: descendants(table, pids), tree=True),
                Group("redis", self.services.redis_members, tree=False),
                *self._by_queues(pids),
            ]
        )
        self.report.line()
        self.report.line(
            "bare Celery chain: no-op tasks, each sending the next on the queue the turn's next hop used; "
            "same broker options, same worker processes and pools; as many chains as turns, sent at once"
        )
        measurable = [(name, result) for name, result in results if result.hops.common is not None]
        if measurable:
            first = measurable[0][1].hops.common
            assert first is not None
            measure_chains(
                self.control, self.state, first, min(_WARM_UP_TURNS, self.options.turns), meter=meter, prefix="warm"
            )
        rows: list[tuple[str, TurnResult, ChainResult]] = []
        for name, result in measurable:
            hops = result.hops.common
            assert hops is not None
            chains = measure_chains(self.control, self.state, hops, self.options.turns, meter=meter, prefix=name)
            self.report.lines(chain_lines(name, chains, total_of=BARE_TOTAL_OF, by_queues=self._queue_groups))
            self.ok = self.ok and chains.all_finished
            rows.append((name, result, chains))
        self.processes.stop(workers)
        self.report.line()
        self.report.line(
            "Aptix against the bare chain (speed: turns/s / chains/s; CPU ratio: CPU per turn / CPU per chain; "
            "w/o gateway: the same without the gateway's CPU, which the bare chain has no part for)"
        )
        self.report.lines(comparison_table(rows, total_of=TOTAL_OF, bare_total_of=BARE_TOTAL_OF))
        return rows

    def _peer_pythons(self) -> dict[str, Path]:
        """Each peer's virtualenv's interpreter, made first where it is missing (before anything is measured)."""
        cache = Path(self.options.peers_dir) if self.options.peers_dir else repo_root() / ".venv-peers"
        return {peer.name: peer_python(peer, cache, progress=sys.stderr) for peer in PEERS}

    def _peers(self, rows: Sequence[tuple[str, TurnResult, ChainResult]], pythons: dict[str, Path], model: str) -> None:
        """The server-tool turns in each peer, on the same scripted model, then the table of all of them."""
        server_tool = [(turns, chains) for name, turns, chains in rows if name == "server-tool"]
        results = [self._peer(peer, pythons[peer.name], model) for peer in PEERS]
        self.report.line()
        self.report.line(
            "Aptix, the bare chain and the durable peers, the server-tool turn (CPU per turn: every process of the "
            "system, PostgreSQL's server processes and the system's backends included; vs: CPU per turn / that of "
            "Aptix, of the bare chain)"
        )
        if server_tool:
            aptix, chains = server_tool[0]
            self.report.lines(peers_table(aptix, chains, results, total_of=TOTAL_OF, bare_total_of=BARE_TOTAL_OF))
        else:
            self.ok = False
            self.report.field("not compared", "the server-tool turns' hops were not found, so no bare chain ran")

    def _peer(self, peer: Peer, python: Path, model: str) -> PeerResult:
        database, dsn = self.services.peer_database(peer.name)
        self.report.line()
        sys.stderr.write(f"aptix bench: running {peer.name}\n")
        result = run_peer(
            peer,
            python,
            self.processes.group,
            model_url=model,
            dsn=dsn,
            postgres=lambda table: self.services.database_members(table, database),
            turns=self.options.turns,
            warm_up=min(_WARM_UP_TURNS, self.options.turns),
            directive=SCENARIOS["server-tool"].directive,
        )
        self.report.lines(peer_lines(result))
        self.ok = self.ok and result.all_completed
        return result


def _environment(options: BenchOptions, scratch: Scratch, api_key: str, model_port: int) -> dict[str, str]:
    """The ``APTIX_*`` settings of every process (``shared.settings.Settings``)."""
    return {
        "APTIX_DATABASE_URL": scratch.database_url,
        "APTIX_REDIS_URL": scratch.state_url,
        "APTIX_BROKER_URL": scratch.broker_url,
        "APTIX_LLM_BASE_URL": f"http://127.0.0.1:{model_port}/v1",
        "APTIX_LLM_API_KEY": "bench",
        "APTIX_LLM_MODEL": "scripted-model",
        "APTIX_API_KEYS": f"{api_key}:bench-org:bench-user,{api_key}-b:bench-org-b:bench-user",
        # A batch of --turns turns is one request: let the gateway take it.
        "APTIX_MAX_BATCH_REQUESTS": str(max(options.turns, 1000)),
        "APTIX_MAX_BODY_BYTES": str(_BODY_LIMIT),
        "APTIX_TASK_BOUNDARIES": options.task_boundaries.value,
    }


def _serving(roots: Sequence[int], queues: str, table: ProcessTable) -> Collection[int]:
    return serving(table, roots, queues)


def _finished_turns(db: psycopg.Connection[tuple[int]]) -> int:
    terminal = [status.value for status in TurnStatus.terminal()]
    row = db.execute("SELECT count(*) FROM turns WHERE status = ANY(%s)", (terminal,)).fetchone()
    return int(row[0]) if row else 0


def _p95_ratio(sample: InteractiveSample, base: InteractiveSample) -> str:
    return ratio(percentile(sample.latencies, 0.95), percentile(base.latencies, 0.95))


def _interactive_cell(sample: InteractiveSample) -> str:
    p50, p95 = percentile(sample.latencies, 0.5), percentile(sample.latencies, 0.95)
    completed = f"{len(sample.latencies)} of {sample.started} turns completed"
    return f"p95 {p95 * 1000:.0f} ms, p50 {p50 * 1000:.0f} ms ({completed})"


def _interrupt(signum: int, _frame: FrameType | None) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@contextmanager
def _signals_ignored() -> Iterator[None]:
    """Let cleanup finish even if Ctrl-C is pressed again."""
    saved = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, saved[0])
        signal.signal(signal.SIGTERM, saved[1])
