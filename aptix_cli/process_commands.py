"""The process commands of the public contract: ``aptix gateway``, ``worker``, ``worker-health``,
``reconciler``, ``scheduler`` and ``db upgrade|wait`` (``aptix_cli.main`` parses their arguments).

Imports are deferred into each command: ``aptix worker --pool gevent`` must let gevent patch the
standard library before psycopg or httpx are imported (FIELD-NOTES, "I/O-bound work").
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aptix_cli.metrics_export import MultiProcessListener

__all__ = [
    "db_upgrade", "db_wait", "gateway", "reconciler", "scheduler", "warn_unknown_variables", "worker", "worker_health",
]  # fmt: skip

logger = logging.getLogger(__name__)


def warn_unknown_variables(command: str) -> None:
    """Warn about each ``APTIX_*`` variable nothing reads: Settings ignore them, so a misspelling is silent."""
    # Before logging is configured (db commands), Python's last-resort handler prints the bare message.
    from shared.settings import unknown_variables

    for message in unknown_variables(os.environ):
        logger.warning("aptix %s: warning: %s", command, message)


def _start_logging(level: str, command: str, *, warn: bool = True) -> None:
    """Configure this process's logging as ``APTIX_LOG_FORMAT`` says, then warn about unknown variables."""
    from shared.logging import configure_logging
    from shared.redaction import secrets_in
    from shared.settings import get_settings

    settings = get_settings()
    configure_logging(level, secrets=secrets_in(settings), log_format=settings.log_format)
    if warn:
        warn_unknown_variables(command)


def gateway(args: argparse.Namespace) -> int:
    from api_gateway.access_log import log_start
    from api_gateway.app import create_app
    from api_gateway.server import serve
    from shared.settings import get_settings, placeholder_api_keys

    _start_logging("INFO", "gateway")
    settings = get_settings()
    placeholders = placeholder_api_keys(settings)
    if placeholders:
        logger.error(
            "aptix gateway: APTIX_API_KEYS holds %d published default or placeholder key(s) (dev-key, CHANGE-ME...), "
            "which anyone who read the docs can use; set your own keys, "
            'e.g. APTIX_API_KEYS="$(openssl rand -hex 24):my-org:me" (`aptix dev` makes one for you)',
            len(placeholders),
        )
        return 2
    # + a Redis connection per event stream, + database, Redis, broker
    _allow_open_files(settings.http_max_connections + settings.events_max_streams + 256, command="gateway")
    app = create_app(settings)
    host = f"[{args.host}]" if ":" in args.host else args.host
    log_start(settings, f"http://{host}:{args.port}")
    serve(app, settings, host=args.host, port=args.port)
    return 0


def worker(args: argparse.Namespace) -> int:
    from aptix_cli.worker_group import node_name, plan, run_group

    try:
        specs = plan(args.queues, args.pool, args.concurrency, args.processes)
    except ValueError as exc:
        sys.stderr.write(f"aptix worker: {exc}\n")
        return 2
    from aptix_cli.worker_health import prepare_heartbeats

    if len(specs) > 1:
        _start_logging(args.loglevel, "worker", warn=False)  # each worker process it starts warns
        if not prepare_heartbeats([spec.group for spec in specs]):
            return 2
        listener = _worker_metrics_listener("worker")
        from shared.settings import get_settings

        try:
            return run_group(
                specs,
                hostname=args.hostname,
                loglevel=args.loglevel,
                reconciler=not args.no_reconciler,
                scheduler=not args.no_scheduler,
                metrics_dir=None if listener is None else listener.directory,
                stop_seconds=get_settings().worker_stop_seconds,
            )
        finally:
            if listener is not None:
                listener.stop()
    spec = specs[0]
    if spec.pool == "gevent":
        from gevent import monkey

        monkey.patch_all()  # before psycopg and httpx are imported (FIELD-NOTES: the import-order trap)
    _start_logging(args.loglevel, "worker")
    _allow_open_files(spec.concurrency + 512, command="worker")
    if args.metrics_dir:  # one process of a group: the group's parent serves the metrics
        from aptix_cli.metrics_dir import MULTIPROC_ENV

        os.environ[MULTIPROC_ENV] = args.metrics_dir
        listener = None
    else:
        listener = _worker_metrics_listener("worker")
    from shared.settings import get_settings
    from workers.app import create_celery
    from workers.liveness import limit_warnings

    settings = get_settings()
    for message in limit_warnings(settings):
        logger.warning("aptix worker: warning: %s", message)
    if args.heartbeat_name is None and not prepare_heartbeats([spec.group]):  # else `aptix worker` did
        return 2
    if args.loglevel.upper() != "DEBUG":
        # Celery logs two INFO lines per task ("received", "succeeded"): ~4 % of a worker's CPU and
        # 22 lines per turn. Flower and the turn's trace show every task; DEBUG brings them back.
        for name in ("celery.worker.strategy", "celery.app.trace"):
            logging.getLogger(name).setLevel(logging.WARNING)
    app = create_celery(
        settings,
        reconciler=not args.no_reconciler,
        scheduler=not args.no_scheduler,
        heartbeat=args.heartbeat_name or spec.group,
    )
    # Celery's shutdown has no bound of its own (with the broker gone it never ends): this one's is
    # APTIX_WORKER_STOP_SECONDS.
    from aptix_cli.worker_stop import arm_on_shutdown

    arm_on_shutdown(settings.worker_stop_seconds)
    # --quiet (before the sub-command): in JSON, no start-up banner, which is many lines of text, not a record.
    argv = ["--quiet"] if settings.log_format == "json" else []
    argv += ["worker", "-Q", spec.queues, "-P", spec.pool, "-c", str(spec.concurrency)]
    argv += ["--loglevel", args.loglevel, "--without-gossip"]
    argv += ["-n", node_name(spec, args.hostname, pid=os.getpid(), grouped=False)]
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
    process its metrics page, with a warning, so that following the guides never fails to start.
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
        problem = f"aptix {command}: cannot serve metrics on {host}:{port} ({exc.strerror or exc})"
        if "worker_metrics_port" in settings.model_fields_set:
            listener.stop()
            raise SystemExit(
                f"{problem}; give each worker on this host its own APTIX_WORKER_METRICS_PORT, or 0 to serve none"
            ) from exc
        # prometheus_client already counts in the directory: keep it (the next start of a worker on
        # this host removes it once this process is gone), and serve nothing.
        logger.warning(
            "%s: serving no metrics (the default port is taken on this host; set "
            "APTIX_WORKER_METRICS_PORT to give this process a port of its own)",
            problem,
        )
        return None
    logger.info("aptix %s: metrics on http://%s:%d/metrics", command, host, port)
    return listener


def worker_health(_args: argparse.Namespace) -> int:
    from aptix_cli.worker_health import check_this_host

    return check_this_host()


def _allow_open_files(needed: int, *, command: str) -> None:
    """Raise the open-files limit towards ``needed``; warn when the hard limit keeps it lower."""
    from aptix_cli.open_files import allow_open_files

    allowed = allow_open_files(needed)
    if allowed < needed:
        logger.warning("aptix %s: at most %d open files (hard limit); %d wanted", command, allowed, needed)


def reconciler(args: argparse.Namespace) -> int:
    import signal
    import socket
    import threading

    _start_logging(args.loglevel, "reconciler")
    listener = _worker_metrics_listener("reconciler")  # before prometheus_client is imported
    from shared.broker import create_producer, send_webhook
    from shared.db import session_factory
    from shared.db.engine import ProcessKind, engine_for
    from shared.db.turns import TurnRepository
    from shared.db.webhook_deliveries import WebhookDeliveryRepository
    from shared.db.webhook_secrets import stored_secrets
    from shared.settings import get_settings
    from shared.state import RedisStateStore
    from shared.step_sender import CeleryBroker
    from workers.context import state_client
    from workers.metrics import WorkerMetrics
    from workers.runtime import LeaderPorts, build_reconciler, build_step_sender, webhook_outbox, webhook_sender
    from workers.webhooks import WebhookSweeper

    settings = get_settings()
    if settings.otel_enabled:  # its re-drives join each turn's trace
        from shared.telemetry import start_telemetry

        start_telemetry(settings, service_name="aptix-reconciler")
    producer = create_producer(settings)

    def send_attempt(delivery_id: str, attempt: int, countdown: float) -> None:
        send_webhook(producer, delivery_id, attempt=attempt, countdown=countdown)

    client = state_client(settings)
    owner = f"reconciler@{socket.gethostname()}:{os.getpid()}"
    db = session_factory(engine_for(settings, ProcessKind.RECONCILER, name=owner))
    stored = stored_secrets(db)
    outbox = webhook_outbox(settings, send_attempt, stored)
    steps = build_step_sender(
        CeleryBroker(producer, retry=True, boundaries=settings.task_boundaries), RedisStateStore(client), settings
    )
    reconciler = build_reconciler(
        settings,
        LeaderPorts(
            client=client, turns=TurnRepository(db, webhooks=outbox), steps=steps, owner=owner, metrics=WorkerMetrics()
        ),
        webhooks=None if outbox is None else WebhookSweeper(WebhookDeliveryRepository(db), send_attempt),
        webhook_sender=webhook_sender(settings, send_attempt, stored),
    )
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logger.info("aptix reconciler running (scan every %gs); ready.", settings.reconciler_interval_seconds)
    try:
        reconciler.run(stop)
    finally:
        if listener is not None:
            listener.stop()
    return 0


def scheduler(args: argparse.Namespace) -> int:
    import signal
    import socket
    import threading

    _start_logging(args.loglevel, "scheduler")
    listener = _worker_metrics_listener("scheduler")  # before prometheus_client is imported
    from shared.broker import create_producer
    from shared.db import session_factory
    from shared.db.engine import ProcessKind, engine_for
    from shared.db.org_settings import OrgSettingsRepository
    from shared.db.turns import TurnRepository
    from shared.settings import get_settings
    from shared.state import RedisStateStore
    from shared.state.redis_store import connect
    from shared.step_sender import CeleryBroker
    from workers.metrics import WorkerMetrics
    from workers.runtime import LeaderPorts, build_scheduler, build_step_sender

    settings = get_settings()
    producer = create_producer(settings)
    client = connect(settings.redis_url, max_connections=8, sentinel_password=settings.sentinel_password)
    steps = build_step_sender(
        CeleryBroker(producer, retry=True, boundaries=settings.task_boundaries), RedisStateStore(client), settings
    )
    owner = f"scheduler@{socket.gethostname()}:{os.getpid()}"
    db = session_factory(engine_for(settings, ProcessKind.RECONCILER, name=owner))
    ports = LeaderPorts(client=client, turns=TurnRepository(db), steps=steps, owner=owner, metrics=WorkerMetrics())
    scheduler = build_scheduler(settings, ports, org_settings=OrgSettingsRepository(db))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    logger.info("aptix scheduler running; ready.")
    try:
        scheduler.run(stop)
    finally:
        if listener is not None:
            listener.stop()
    return 0


def db_wait(args: argparse.Namespace) -> int:
    import time

    from shared.db.engine import ProcessKind, engine_for
    from shared.db.migrate import head_revision, schema_revision
    from shared.settings import get_settings

    warn_unknown_variables("db wait")
    engine = engine_for(get_settings(), ProcessKind.MIGRATION)
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


def db_upgrade(args: argparse.Namespace) -> int:
    from shared.db.migrate import upgrade
    from shared.settings import get_settings

    warn_unknown_variables("db upgrade")
    upgrade(get_settings().database_url, args.revision)
    sys.stdout.write(f"database migrated to {args.revision}\n")
    return 0
