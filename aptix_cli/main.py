"""``aptix``: the command line: the process commands (:mod:`aptix_cli.process_commands`), the dev
stack, the demo, the bench, the API keys (:mod:`aptix_cli.key_commands`) and the HTTP client commands
(:mod:`aptix_cli.client_commands`).

Imports are deferred into each command: ``aptix worker --pool gevent`` must let gevent patch the
standard library before psycopg or httpx are imported (FIELD-NOTES, "I/O-bound work").
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from aptix_cli import process_commands as processes
from aptix_cli.worker_group import DEFAULT_QUEUES
from shared.task_names import DEFAULT_TASK_BOUNDARIES, TaskBoundaries

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``aptix`` command line."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        parser.print_help()
        return 2
    result: int = args.run(args)
    if args.command in _IN_PROCESS_STACK_COMMANDS:
        # The in-process Celery worker leaves non-daemon pool threads behind; the stack is already
        # stopped, so end now rather than let interpreter shutdown wait on them.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(result)
    return result


_IN_PROCESS_STACK_COMMANDS = frozenset({"dev", "demo", "bench"})


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aptix", description="Aptix agent workers")
    commands = parser.add_subparsers(dest="command")

    gateway = commands.add_parser("gateway", help="run the HTTP gateway")
    gateway.add_argument("--host", default="127.0.0.1")
    gateway.add_argument("--port", type=int, default=8000)
    gateway.set_defaults(run=processes.gateway)

    worker = commands.add_parser("worker", help="run a Celery worker for the pipeline steps")
    worker.add_argument("--queues", default=DEFAULT_QUEUES)
    worker.add_argument(
        "--pool",
        default=None,
        choices=["prefork", "threads", "gevent", "solo"],
        help="one pool for all the queues (default: one process per queue group, each on its own pool)",
    )
    worker.add_argument("--concurrency", type=int, default=None)
    worker.add_argument(
        "--processes", type=int, default=None, help="processes of the pipeline queue (default: one per core)"
    )
    worker.add_argument("--hostname", default=None)
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument(
        "--no-reconciler", action="store_true", help="do not run a copy of the reconciler in this worker"
    )
    worker.add_argument(
        "--no-scheduler",
        action="store_true",
        help="do not run a copy of the admission scheduler in this worker (run `aptix scheduler` instead)",
    )
    # Given by the parent of a group of worker processes: count metrics in its directory, serve none.
    worker.add_argument("--metrics-dir", default=None, help=argparse.SUPPRESS)
    # Set by `aptix worker` on each process it starts: the name of the process's heartbeat file.
    worker.add_argument("--heartbeat-name", default=None, help=argparse.SUPPRESS)
    worker.set_defaults(run=processes.worker)

    health = commands.add_parser(
        "worker-health",
        help="exit 0 if every process of this host's `aptix worker` is alive and making progress, else 1 "
        "(a liveness probe)",
    )
    health.set_defaults(run=processes.worker_health)

    reconciler = commands.add_parser(
        "reconciler", help="run the reconciler apart from the workers (re-drives turns that stopped moving)"
    )
    reconciler.add_argument("--loglevel", default="INFO")
    reconciler.set_defaults(run=processes.reconciler)

    scheduler = commands.add_parser(
        "scheduler",
        help="run the admission scheduler apart from the workers (releases batch turns round-robin across "
        "organisations)",
    )
    scheduler.add_argument("--loglevel", default="INFO")
    scheduler.set_defaults(run=processes.scheduler)

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="migrate the database to the newest schema")
    upgrade.add_argument("--revision", default="head")
    upgrade.set_defaults(run=processes.db_upgrade)
    wait = db_commands.add_parser(
        "wait", help="wait until the database is migrated to the schema this code needs (an init container)"
    )
    wait.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds (default 600)")
    wait.set_defaults(run=processes.db_wait)

    dev = commands.add_parser("dev", help="everything in one process with embedded defaults")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument("--workers", type=int, default=8, help="worker threads")
    dev.add_argument("--sqlite", default="aptix-dev.sqlite", help="the SQLite file of the durable store")
    dev.add_argument(
        "--key",
        default=None,
        help="the API key to accept (default: the one kept in aptix-dev.key beside the SQLite file, "
        "made on the first start)",
    )
    dev.set_defaults(run=_dev)

    demo = commands.add_parser("demo", help="tour the system on the embedded stack")
    demo.set_defaults(run=_demo)

    bench = commands.add_parser(
        "bench",
        help="print throughput, latency and CPU figures of the production shape (gateway and worker processes)",
        description="Starts the scripted model, one gateway and --workers worker processes on a scratch "
        "PostgreSQL database and two scratch Redis databases, runs a batch per scenario, then a bare Celery "
        "chain of the same hops, and prints the figures. Everything it creates is removed at the end.",
    )
    bench.add_argument(
        "--turns",
        type=int,
        default=None,
        help="turns per scenario (default 1000; 300 with --embedded, --recovery-costs)",
    )
    bench.add_argument("--llm-latency-ms", type=float, default=0.0, help="latency the scripted model adds (default 0)")
    bench.add_argument(
        "--scenario", choices=["plain", "server-tool", "client-tool", "all"], default="all", help="default: all"
    )
    bench.add_argument("--workers", type=int, default=2, help="aptix worker processes (default 2)")
    bench.add_argument(
        "--worker-args", default="", help='extra flags for each aptix worker, e.g. "--pool threads --concurrency 8"'
    )
    bench.add_argument("--redis-url", default=None, help="the Redis server (default redis://127.0.0.1:6379)")
    bench.add_argument(
        "--state-url",
        default=None,
        help="the state store on a Redis server of its own (redis://HOST:PORT) or a Redis Cluster used whole "
        "(redis+cluster://HOST:PORT[,...]); default: beside the broker on --redis-url",
    )
    bench.add_argument(
        "--database-url",
        default=None,
        help="a PostgreSQL database to create the scratch database from "
        "(default postgresql+psycopg://postgres@127.0.0.1:5432/postgres)",
    )
    bench.add_argument(
        "--interactive",
        action="store_true",
        help="instead of the scenarios: p95 latency of single turns, idle and under a batch of --turns turns",
    )
    bench.add_argument(
        "--two-orgs",
        action="store_true",
        help="instead of the scenarios: two organisations' batches of --turns turns side by side (fair admission)",
    )
    bench.add_argument(
        "--openai-batch",
        action="store_true",
        help="instead of the scenarios: a file of --turns requests through OpenAI's Files and Batch API, end to end "
        "(with --two-orgs: two organisations' OpenAI batches side by side)",
    )
    bench.add_argument(
        "--rss", action="store_true", help="print the workers' summed RSS after the warm-up and each batch"
    )
    bench.add_argument(
        "--task-events", action="store_true", help="turn the workers' task events on, as Flower does when it watches"
    )
    bench.add_argument(
        "--task-boundaries",
        choices=[boundaries.value for boundaries in TaskBoundaries],
        default=DEFAULT_TASK_BOUNDARIES.value,
        help="where the workers end a step task (APTIX_TASK_BOUNDARIES): at every layer, only where the queue "
        f"changes, or only before a model or tool call (default {DEFAULT_TASK_BOUNDARIES.value})",
    )
    bench.add_argument(
        "--peers",
        action="store_true",
        help="also run the server-tool turn in the durable peers (DBOS Transact, LangGraph), each in a virtualenv "
        "of its own, and compare",
    )
    bench.add_argument(
        "--peers-dir",
        default=None,
        help="the cache folder of the peers' virtualenvs (default: .venv-peers in the checkout)",
    )
    bench.add_argument(
        "--embedded", action="store_true", help="the old in-process measurement, for machines without the services"
    )
    bench.add_argument("--threads", type=int, default=8, help="worker threads of --embedded (default 8)")
    bench.add_argument(
        "--recovery-costs", action="store_true", help="print what checkpoints, tool records and reconciler scans cost"
    )
    bench.set_defaults(run=_bench)

    # API keys in the database (aptix keys create|list|revoke); SQLAlchemy is imported only when one runs.
    from aptix_cli.key_commands import add_key_commands

    add_key_commands(commands)

    # HTTP client commands (turn, tool-results, trace, session, batch); they import httpx only when run.
    from aptix_cli.client_commands import add_client_commands

    add_client_commands(commands)

    # Operator commands on the database (orgs, webhooks); they import SQLAlchemy only when run.
    from aptix_cli.org_commands import add_org_commands
    from aptix_cli.webhook_commands import add_webhook_commands

    add_org_commands(commands)
    add_webhook_commands(commands)
    return parser


def _dev(args: argparse.Namespace) -> int:
    from aptix_cli.dev import DevStack
    from shared.logging import configure_logging

    configure_logging("WARNING")
    stack = DevStack(
        host=args.host, port=args.port, worker_threads=args.workers, sqlite_path=args.sqlite, api_key=args.key
    )
    info = stack.start()
    out = sys.stdout
    out.write(f"Aptix dev stack on {info.url}\n")
    out.write(f"  API key:   {info.api_key}{_key_origin(args)}\n")
    out.write(f"  embedded:  {', '.join(info.embedded) or 'nothing (every APTIX_* URL was set)'}\n")
    out.write(f"  database:  {info.database_url}\n")
    out.write(f"  model:     {info.llm_base_url}\n")
    out.write(f"  try:       APTIX_URL={info.url} APTIX_KEY={info.api_key} aptix turn 'hello'\n")
    out.write("  stop:      Ctrl-C\n")
    out.flush()
    try:
        stack.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stack.stop()
    return 0


def _key_origin(args: argparse.Namespace) -> str:
    from aptix_cli.dev import key_file

    if os.environ.get("APTIX_API_KEYS"):
        return " (the first of APTIX_API_KEYS)"
    if args.key:
        return " (--key)"
    return f" (kept in {key_file(args.sqlite)}: the same on every start; --key to choose one)"


def _bench(args: argparse.Namespace) -> int:
    other_run = args.interactive or args.two_orgs or args.openai_batch or args.embedded or args.recovery_costs
    if args.peers and (args.scenario not in ("server-tool", "all") or other_run):
        sys.stderr.write("aptix bench: --peers runs beside the server-tool scenario (--scenario server-tool or all)\n")
        return 2
    if args.recovery_costs:
        from aptix_cli.recovery_costs import run_recovery_costs

        return run_recovery_costs(turns=args.turns or 300)
    if args.embedded:
        from aptix_cli.bench import run_embedded

        return run_embedded(turns=args.turns or 300, llm_latency_ms=args.llm_latency_ms, worker_threads=args.threads)
    import shlex

    from aptix_cli.bench import BenchOptions, run_bench
    from aptix_cli.bench.options import DEFAULT_DATABASE_URL, DEFAULT_REDIS_URL, SCENARIO_NAMES

    if (args.turns is not None and args.turns < 1) or args.workers < 1:
        sys.stderr.write("aptix bench: --turns and --workers must be at least 1\n")
        return 2
    options = BenchOptions(
        turns=args.turns or 1000,
        llm_latency_ms=args.llm_latency_ms,
        scenarios=SCENARIO_NAMES if args.scenario == "all" else (args.scenario,),
        workers=args.workers,
        worker_args=tuple(shlex.split(args.worker_args)),
        redis_url=args.redis_url or DEFAULT_REDIS_URL,
        state_url=args.state_url,
        database_url=args.database_url or DEFAULT_DATABASE_URL,
        interactive=args.interactive,
        two_orgs=args.two_orgs,
        openai_batch=args.openai_batch,
        rss=args.rss,
        task_events=args.task_events,
        task_boundaries=TaskBoundaries(args.task_boundaries),
        peers=args.peers,
        peers_dir=args.peers_dir,
    )
    return run_bench(options)


def _demo(_args: argparse.Namespace) -> int:
    from aptix_cli.demo import run_demo

    return run_demo()


if __name__ == "__main__":
    raise SystemExit(main())
