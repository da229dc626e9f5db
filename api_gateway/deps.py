"""Route dependencies: the gateway state and the authenticated caller, as Annotated aliases."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from api_gateway.errors import ApiError
from api_gateway.state import GatewayState
from shared.settings import ApiKey

__all__ = ["Caller", "Gateway"]


def _gateway(request: Request) -> GatewayState:
    state: GatewayState = request.app.state.gateway
    return state


def _caller(request: Request, gateway: Annotated[GatewayState, Depends(_gateway)]) -> ApiKey:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "missing bearer API key (Authorization: Bearer <key>)")
    token = token.strip()
    for key, identity in gateway.api_keys.items():
        if hmac.compare_digest(key.encode(), token.encode()):
            return identity
    raise ApiError(401, "unauthorized", "the API key is not valid")


Gateway = Annotated[GatewayState, Depends(_gateway)]
Caller = Annotated[ApiKey, Depends(_caller)]
