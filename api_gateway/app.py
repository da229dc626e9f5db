"""create_app: the FastAPI gateway — auth, validation, id assignment, enqueue, reads, health.

The gateway sends tasks by name (``shared.broker``) and never imports ``workers``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from api_gateway.access_log import AccessLogMiddleware
from api_gateway.body_limit import BodyLimitMiddleware
from api_gateway.docs import install_docs
from api_gateway.errors import install_error_handlers
from api_gateway.metrics import MetricsListener, QueueDepthCollector, install_metrics
from api_gateway.openai import batches as openai_batches
from api_gateway.openai import conversations
from api_gateway.openai import files as openai_files
from api_gateway.openai import routes as openai_routes
from api_gateway.openai.batch_sweep import run_batch_jobs_forever, sweep_batches_forever
from api_gateway.openapi import install_openapi
from api_gateway.routes import batches, health, sessions, turn_actions, turn_events, turns, usage, webhooks
from api_gateway.security_headers import SecurityHeadersMiddleware
from api_gateway.services.expiry_sweep import sweep_forever
from api_gateway.wiring import connect_gateway
from shared.redis_clients import is_redis_url, redis_client
from shared.settings import Settings, get_settings

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The gateway app for ``settings`` (read from the environment when None)."""
    settings = settings or get_settings()
    gateway = connect_gateway(settings)
    listener = None
    if settings.metrics_port is not None:
        listener = MetricsListener(gateway.metrics.registry, host=settings.metrics_host, port=settings.metrics_port)

    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        if listener is not None:
            listener.start()
        sweepers = [
            asyncio.create_task(gateway.authenticator.refresh_forever()),
            asyncio.create_task(
                sweep_forever(gateway.turn_service, timeout_seconds=settings.client_tool_timeout_seconds)
            ),
            asyncio.create_task(
                sweep_batches_forever(
                    gateway.openai_batch_service,
                    gateway.file_service,
                    window_seconds=settings.openai_batch_window_seconds,
                )
            ),
            asyncio.create_task(run_batch_jobs_forever(gateway.openai_batch_service, gateway.openai_batch_jobs)),
        ]
        try:
            yield
        finally:
            for sweeper in sweepers:
                sweeper.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await sweeper
            if listener is not None:
                listener.stop()
            await gateway.event_streams.close()

    # redirect_slashes=False: Starlette builds the redirect for "/v1/turns/" from the Host header,
    # before authentication (an open redirect); a wrong path is a 404 like any other.
    # docs_url=None, redoc_url=None: FastAPI's pages load their scripts from a CDN; install_docs serves
    # Swagger UI from the installed package instead.
    app = FastAPI(
        title="Aptix agent workers",
        version="0.1.0",
        lifespan=lifespan,
        redirect_slashes=False,
        docs_url=None,
        redoc_url=None,
    )
    app.state.gateway = gateway
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(turns.router)
    app.include_router(turn_actions.router)
    app.include_router(turn_events.router)
    app.include_router(sessions.router)
    app.include_router(batches.router)
    app.include_router(webhooks.router)
    app.include_router(usage.router)
    app.include_router(openai_routes.router)
    app.include_router(conversations.router)
    app.include_router(openai_files.router)
    app.include_router(openai_batches.router)
    install_docs(app)
    install_openapi(app, settings)
    install_metrics(app, gateway.metrics, on_api_port=listener is None)
    if is_redis_url(settings.effective_broker_url):
        broker = redis_client(
            settings.effective_broker_url,
            sentinel_password=settings.sentinel_password,
            socket_timeout=2,
            socket_connect_timeout=2,
        )
        gateway.metrics.registry.register(QueueDepthCollector(broker))
    app.add_middleware(
        BodyLimitMiddleware, max_bytes=settings.max_body_bytes, max_upload_bytes=settings.max_upload_bytes
    )
    app.add_middleware(SecurityHeadersMiddleware)  # outside the routes: also on 413s and errors
    app.add_middleware(AccessLogMiddleware)  # around all of it: one line per request, with its final status
    if settings.otel_enabled:  # imported only when on: OpenTelemetry costs every process its import
        from api_gateway.telemetry import instrument_gateway
        from shared.telemetry import start_telemetry

        start_telemetry(settings, service_name="aptix-gateway")
        instrument_gateway(app)
    return app
