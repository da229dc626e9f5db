"""``aptix``: the process commands of API.md (gateway, worker, db upgrade) and the demo.

Imports are deferred into each command: ``aptix worker --pool gevent`` must let gevent patch the
standard library before psycopg or httpx are imported (FIELD-NOTES, "I/O-bound work").
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

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
    gateway.set_defaults(run=_gateway)

    worker = commands.add_parser("worker", help="run a Celery worker for the pipeline steps")
    worker.add_argument("--queues", default="pipeline,llm,tools")
    worker.add_argument("--pool", default="prefork", choices=["prefork", "threads", "gevent", "solo"])
    worker.add_argument("--concurrency", type=int, default=None)
    worker.add_argument("--hostname", default=None)
    worker.add_argument("--loglevel", default="INFO")
    worker.add_argument(
        "--no-reconciler", action="store_true", help="do not run a copy of the reconciler in this worker"
    )
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

    dev = commands.add_parser("dev", help="everything in one process with embedded defaults")
    dev.add_argument("--host", default="127.0.0.1")
    dev.add_argument("--port", type=int, default=8000)
    dev.add_argument("--workers", type=int, default=8, help="worker threads")
    dev.add_argument("--sqlite", default="aptix-dev.sqlite", help="the SQLite file of the durable store")
    dev.set_defaults(run=_dev)

    demo = commands.add_parser("demo", help="tour the system on the embedded stack")
    demo.set_defaults(run=_demo)

    bench = commands.add_parser("bench", help="print throughput and latency figures of the pipeline")
    bench.add_argument("--turns", type=int, default=300)
    bench.add_argument("--llm-latency-ms", type=float, default=0.0)
    bench.add_argument("--workers", type=int, default=8, help="worker threads")
    bench.add_argument(
        "--recovery-costs", action="store_true", help="print what checkpoints, tool records and reconciler scans cost"
    )
    bench.set_defaults(run=_bench)

    # HTTP client commands (turn, tool-results, trace, session, batch); they import httpx only when run.
    from aptix_cli.client_commands import add_client_commands

    add_client_commands(commands)
    return parser


def _gateway(args: argparse.Namespace) -> int:
    import uvicorn

    from api_gateway.app import create_app
    from shared.logging import configure_logging

    configure_logging()
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")
    return 0


def _worker(args: argparse.Namespace) -> int:
    if args.pool == "gevent":
        try:
            from gevent import monkey
        except ImportError:
            sys.stderr.write("--pool gevent needs gevent: pip install 'aptix-agent-workers[gevent]'\n")
            return 2
        monkey.patch_all()  # before psycopg and httpx are imported (FIELD-NOTES: the import-order trap)
    from shared.logging import configure_logging
    from shared.settings import get_settings
    from workers.app import create_celery

    configure_logging(args.loglevel)
    app = create_celery(get_settings(), reconciler=not args.no_reconciler)
    argv = ["worker", "-Q", args.queues, "-P", args.pool, "-E", "--loglevel", args.loglevel, "--without-gossip"]
    if args.concurrency:
        argv += ["-c", str(args.concurrency)]
    if args.hostname:
        argv += ["-n", args.hostname]
    app.worker_main(argv)
    return 0


def _reconciler(args: argparse.Namespace) -> int:
    import signal
    import socket
    import threading

    from shared.broker import create_producer, send_step
    from shared.db import create_db_engine, session_factory
    from shared.db.turns import TurnRepository
    from shared.logging import configure_logging
    from shared.models.envelope import TurnEnvelope
    from shared.settings import get_settings
    from shared.state import RedisStateStore
    from workers.dispatcher import Dispatcher
    from workers.runtime import build_reconciler

    configure_logging(args.loglevel)
    settings = get_settings()
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
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    sys.stderr.write(f"aptix reconciler running (scan every {settings.reconciler_interval_seconds:g}s); ready.\n")
    sys.stderr.flush()
    reconciler.run(stop)
    return 0


def _db_upgrade(args: argparse.Namespace) -> int:
    from shared.db.migrate import upgrade
    from shared.settings import get_settings

    upgrade(get_settings().database_url, args.revision)
    sys.stdout.write(f"database migrated to {args.revision}\n")
    return 0


def _dev(args: argparse.Namespace) -> int:
    from aptix_cli.dev import DevStack
    from shared.logging import configure_logging

    configure_logging("WARNING")
    stack = DevStack(host=args.host, port=args.port, worker_threads=args.workers, sqlite_path=args.sqlite)
    info = stack.start()
    out = sys.stdout
    out.write(f"Aptix dev stack on {info.url}\n")
    out.write(f"  API key:   {info.api_key}\n")
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


def _bench(args: argparse.Namespace) -> int:
    if args.recovery_costs:
        from aptix_cli.recovery_costs import run_recovery_costs

        return run_recovery_costs(turns=args.turns)
    from aptix_cli.bench import run_bench

    return run_bench(turns=args.turns, llm_latency_ms=args.llm_latency_ms, worker_threads=args.workers)


def _demo(_args: argparse.Namespace) -> int:
    from aptix_cli.demo import run_demo

    return run_demo()


if __name__ == "__main__":
    raise SystemExit(main())
