"""create_app: the FastAPI gateway — auth, validation, id assignment, enqueue, reads, health.

The gateway sends tasks by name (``shared.broker``) and never imports ``workers``.
"""

from __future__ import annotations

from fastapi import FastAPI

from api_gateway.body_limit import BodyLimitMiddleware
from api_gateway.errors import install_error_handlers
from api_gateway.routes import health, sessions, turns
from api_gateway.state import build_state
from shared.settings import Settings, get_settings

__all__ = ["create_app"]


def create_app(settings: Settings | None = None) -> FastAPI:
    """The gateway app for ``settings`` (read from the environment when None)."""
    settings = settings or get_settings()
    app = FastAPI(title="Aptix agent workers", version="0.1.0")
    app.state.gateway = build_state(settings)
    install_error_handlers(app)
    app.include_router(health.router)
    app.include_router(turns.router)
    app.include_router(sessions.router)
    app.add_middleware(BodyLimitMiddleware, max_bytes=settings.max_body_bytes)
    return app
