"""``aptix``: the process commands of API.md (gateway, worker, db upgrade) and the demo.

Imports are deferred into each command: ``aptix worker --pool gevent`` must let gevent patch the
standard library before psycopg or httpx are imported (FIELD-NOTES, "I/O-bound work").
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aptix_cli.metrics_export import MultiProcessListener

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


def _warn_unknown_variables(command: str) -> None:
    # Settings ignore what they do not know; say so at start, so a misspelled setting is seen.
    from shared.settings import unknown_variables

    for message in unknown_variables(os.environ):
        sys.stderr.write(f"aptix {command}: warning: {message}\n")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="aptix", description="Aptix agent workers")
    commands = parser.add_subparsers(dest="command")

    gateway = commands.add_parser("gateway", help="run the HTTP gateway")
    gateway.add_argument("--host", default="127.0.0.1")
    gateway.add_argument("--port", type=int, default=8000)
    gateway.set_defaults(run=_gateway)

    worker = commands.add_parser("worker", help="run a Celery worker for the pipeline steps")
    worker.add_argument("--queues", default="pipeline,llm,tools")
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
    # Given by the parent of a group of worker processes: count metrics in its directory, serve none.
    worker.add_argument("--metrics-dir", default=None, help=argparse.SUPPRESS)
    worker.set_defaults(run=_worker)

    reconciler = commands.add_parser(
        "reconciler", help="run the reconciler apart from the workers (re-drives turns that stopped moving)"
    )
    reconciler.add_argument("--loglevel", default="INFO")
    reconciler.set_defaults(run=_reconciler)

    db = commands.add_parser("db", help="database schema")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    upgrade = db_commands.add_parser("upgrade", help="migrate the database to the newest schema")
    upgrade.add_argument("--revision", default="head")
    upgrade.set_defaults(run=_db_upgrade)
    wait = db_commands.add_parser(
        "wait", help="wait until the database is migrated to the schema this code needs (an init container)"
    )
    wait.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds (default 600)")
    wait.set_defaults(run=_db_wait)

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
        "--rss", action="store_true", help="print the workers' summed RSS after the warm-up and each batch"
    )
    bench.add_argument(
        "--task-events", action="store_true", help="turn the workers' task events on, as Flower does when it watches"
    )
    bench.add_argument(
        "--embedded", action="store_true", help="the old in-process measurement, for machines without the services"
    )
    bench.add_argument("--threads", type=int, default=8, help="worker threads of --embedded (default 8)")
    bench.add_argument(
        "--recovery-costs", action="store_true", help="print what checkpoints, tool records and reconciler scans cost"
    )
    bench.set_defaults(run=_bench)

    # HTTP client commands (turn, tool-results, trace, session, batch); they import httpx only when run.
    from aptix_cli.client_commands import add_client_commands

    add_client_commands(commands)
    return parser


def _gateway(args: argparse.Namespace) -> int:
    from api_gateway.app import create_app
    from api_gateway.server import serve
    from shared.logging import configure_logging
    from shared.redaction import secrets_in
    from shared.settings import get_settings, placeholder_api_keys

    _warn_unknown_variables("gateway")
    placeholders = placeholder_api_keys(get_settings())
    if placeholders:
        sys.stderr.write(
            f"aptix gateway: APTIX_API_KEYS holds {len(placeholders)} published default or placeholder key(s) "
            "(dev-key, CHANGE-ME...), which anyone who read the docs can use; set your own keys, "
            "e.g. APTIX_API_KEYS=\"$(openssl rand -hex 24):my-org:me\" (`aptix dev` makes one for you)\n"
        )
        return 2
    settings = get_settings()
    configure_logging(secrets=secrets_in(settings))
    # + a Redis connection per event stream, + database, Redis, broker
    _allow_open_files(settings.http_max_connections + settings.events_max_streams + 256, command="gateway")
    serve(create_app(settings), settings, host=args.host, port=args.port)
    return 0


def _worker(args: argparse.Namespace) -> int:
    from aptix_cli.worker_group import plan, run_group

    try:
        specs = plan(args.queues, args.pool, args.concurrency, args.processes)
    except ValueError as exc:
        sys.stderr.write(f"aptix worker: {exc}\n")
        return 2
    if len(specs) > 1:
        listener = _worker_metrics_listener("worker")
        try:
            return run_group(
                specs,
                hostname=args.hostname,
                loglevel=args.loglevel,
                reconciler=not args.no_reconciler,
                metrics_dir=None if listener is None else listener.directory,
            )
        finally:
            if listener is not None:
                listener.stop()
    spec = specs[0]
    _allow_open_files(spec.concurrency + 512, command="worker")
    if spec.pool == "gevent":
        from gevent import monkey

        monkey.patch_all()  # before psycopg and httpx are imported (FIELD-NOTES: the import-order trap)
    if args.metrics_dir:  # one process of a group: the group's parent serves the metrics
        from aptix_cli.metrics_dir import MULTIPROC_ENV

        os.environ[MULTIPROC_ENV] = args.metrics_dir
        listener = None
    else:
        listener = _worker_metrics_listener("worker")
    import logging

    from shared.logging import configure_logging
    from shared.redaction import secrets_in
    from shared.settings import get_settings
    from workers.app import create_celery

    _warn_unknown_variables("worker")
    configure_logging(args.loglevel, secrets=secrets_in(get_settings()))
    if args.loglevel.upper() != "DEBUG":
        # Celery logs two INFO lines per task ("received", "succeeded"): ~4 % of a worker's CPU and
        # 22 lines per turn. Flower and the turn's trace show every task; DEBUG brings them back.
        for name in ("celery.worker.strategy", "celery.app.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)
    app = create_celery(get_settings(), reconciler=not args.no_reconciler)
    argv = ["worker", "-Q", spec.queues, "-P", spec.pool, "-c", str(spec.concurrency)]
    argv += ["--loglevel", args.loglevel, "--without-gossip"]
    if args.hostname:
        argv += ["-n", args.hostname]
    try:
        app.worker_main(argv)
    finally:
        if listener is not None:
            listener.stop()
    return 0


def _worker_metrics_listener(command: str) -> MultiProcessListener | None:
    """Count metrics in a fresh directory and serve them on ``APTIX_WORKER_METRICS_PORT`` (None when 0).

    Runs before anything imports prometheus_client (``aptix_cli.metrics_dir``). A port that cannot be
    bound stops the command with a message when ``APTIX_WORKER_METRICS_PORT`` chose it; the default
    port taken (a second ``aptix worker``, or ``aptix reconciler``, on the same host) only costs this
    process its metrics page, with a warning, so that following the README never fails to start.
    """
    from aptix_cli.metrics_dir import prepare_directory
    from shared.settings import get_settings

    settings = get_settings()
    host, port = settings.worker_metrics_host, settings.worker_metrics_port
    if port == 0:
        return None
    directory = prepare_directory()
    from aptix_cli.metrics_export import MultiProcessListener

    listener = MultiProcessListener(directory, host=host, port=port)
    try:
        listener.start()
    except OSError as exc:
        listener.stop()
        problem = f"aptix {command}: cannot serve metrics on {host}:{port} ({exc.strerror or exc})"
        if "worker_metrics_port" in settings.model_fields_set:
            raise SystemExit(
                f"{problem}; give each worker on this host its own APTIX_WORKER_METRICS_PORT, or 0 to serve none"
            ) from exc
        sys.stderr.write(
            f"{problem}: serving no metrics (the default port is taken on this host; set "
            "APTIX_WORKER_METRICS_PORT to give this process a port of its own)\n"
        )
        return None
    sys.stderr.write(f"aptix {command}: metrics on http://{host}:{port}/metrics\n")
    return listener


def _allow_open_files(needed: int, *, command: str) -> None:
    """Raise the soft limit on open files towards ``needed`` (each model call in flight, each client
    connection is a socket; processes often start with a soft limit of 1,024 under a far higher hard limit)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        if target < needed:
            sys.stderr.write(f"aptix {command}: at most {target} open files (hard limit); {needed} wanted\n")


def _reconciler(args: argparse.Namespace) -> int:
    import signal
    import socket
    import threading

    listener = _worker_metrics_listener("reconciler")  # before prometheus_client is imported
    from shared.broker import create_producer, send_step
    from shared.db import create_db_engine, session_factory
    from shared.db.turns import TurnRepository
    from shared.logging import configure_logging
    from shared.models.envelope import TurnEnvelope
    from shared.redaction import secrets_in
    from shared.settings import get_settings
    from shared.state import RedisStateStore
    from workers.dispatcher import Dispatcher
    from workers.metrics import WorkerMetrics
    from workers.runtime import build_reconciler

    _warn_unknown_variables("reconciler")
    settings = get_settings()
    configure_logging(args.loglevel, secrets=secrets_in(settings))
    producer = create_producer(settings)

    def send(envelope: TurnEnvelope, countdown: float) -> None:
        send_step(producer, envelope, countdown=countdown)

    store = RedisStateStore.from_url(settings.redis_url)
    reconciler = build_reconciler(
        settings,
        turns=TurnRepository(session_factory(create_db_engine(settings.database_url, pool_size=2))),
        store=store,
        dispatcher=Dispatcher.for_settings(send, store, settings),
        owner=f"reconciler@{socket.gethostname()}:{os.getpid()}",
        metrics=WorkerMetrics(),
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sys.stderr.write(f"aptix reconciler running (scan every {settings.reconciler_interval_seconds:g}s); ready.\n")
    sys.stderr.flush()
    try:
        reconciler.run(stop)
    finally:
        if listener is not None:
            listener.stop()
    return 0


def _db_wait(args: argparse.Namespace) -> int:
    import time

    from shared.db import create_db_engine
    from shared.db.migrate import head_revision, schema_revision
    from shared.settings import get_settings

    _warn_unknown_variables("db wait")
    engine = create_db_engine(get_settings().database_url, pool_size=1)
    required = head_revision()
    deadline = time.monotonic() + args.timeout
    revision: str | None = None
    while True:
        try:
            revision = schema_revision(engine)
            if revision == required:
                sys.stdout.write(f"database schema at {required}\n")
                return 0
            reason = f"schema at {revision or 'nothing (never migrated)'}, {required} needed"
        except Exception as exc:  # the database is not up yet: keep waiting
            reason = f"database not answering ({type(exc).__name__})"
        if time.monotonic() >= deadline:
            sys.stderr.write(f"aptix db wait: gave up after {args.timeout:g}s: {reason}; run `aptix db upgrade`\n")
            return 1
        time.sleep(1.0)


def _db_upgrade(args: argparse.Namespace) -> int:
    from shared.db.migrate import upgrade
    from shared.settings import get_settings

    _warn_unknown_variables("db upgrade")
    upgrade(get_settings().database_url, args.revision)
    sys.stdout.write(f"database migrated to {args.revision}\n")
    return 0


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
        database_url=args.database_url or DEFAULT_DATABASE_URL,
        interactive=args.interactive,
        rss=args.rss,
        task_events=args.task_events,
    )
    return run_bench(options)


def _demo(_args: argparse.Namespace) -> int:
    from aptix_cli.demo import run_demo

    return run_demo()


if __name__ == "__main__":
    raise SystemExit(main())
