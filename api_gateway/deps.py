"""Route dependencies: the gateway wiring, the authenticated caller, ids, the long-poll and the stream flag,
as Annotated aliases.

``AuthenticatedRoute`` is the route class of every router whose routes take a ``Caller``: it checks
the key before FastAPI reads the body, so a request without a valid key is a 401 whatever its body.
``Caller`` also carries the HTTP bearer security scheme, so the OpenAPI document (and ``/docs``'
*Authorize*) shows how to authenticate.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any

from fastapi import Depends, Path, Query, Request, Response, Security
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from api_gateway.access_log import note_caller
from api_gateway.errors import ApiError
from api_gateway.parameters import check_parameters
from api_gateway.uploads import grant_upload_time, is_upload
from api_gateway.wiring import GatewayWiring
from shared import strict_json
from shared.settings import ApiKey

__all__ = ["AuthenticatedRoute", "BatchId", "Caller", "Gateway", "SessionId", "StreamFlag", "TurnId", "WaitSeconds"]

_BEARER = HTTPBearer(
    scheme_name="bearerAuth",
    description=(
        "An API key (`aptix keys create`, or one of `APTIX_API_KEYS`): `Authorization: Bearer <key>`. It stands for "
        "an organisation and a user."
    ),
    auto_error=False,
)


_CALLER = "aptix.caller"
"""Where the request's scope keeps its authenticated caller."""


def _gateway(request: Request) -> GatewayWiring:
    gateway: GatewayWiring = request.app.state.gateway
    return gateway


async def _authenticate(gateway: GatewayWiring, request: Request) -> ApiKey:
    """The caller of ``request`` (``api_gateway.authenticator``); kept in its scope for :func:`_caller`."""
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "unauthorized", "missing bearer API key (Authorization: Bearer <key>)")
    identity = await gateway.authenticator.authenticate(token.strip())
    note_caller(request, org_id=identity.org_id, key_id=identity.key_id)
    request.scope[_CALLER] = identity
    return identity


async def _caller(
    request: Request,
    gateway: Annotated[GatewayWiring, Depends(_gateway)],
    _bearer: Annotated[HTTPAuthorizationCredentials | None, Security(_BEARER)],
) -> ApiKey:
    # _bearer only declares the security scheme; AuthenticatedRoute has authenticated the request already.
    identity = request.scope.get(_CALLER)
    if isinstance(identity, ApiKey):
        return identity
    return await _authenticate(gateway, request)


class _StrictJsonRequest(Request):
    """A request whose JSON body is parsed as RFC 8259 says: ``NaN``, ``Infinity``, ``1e999`` are 422."""

    async def json(self) -> Any:
        if not hasattr(self, "_json"):
            self._json = strict_json.loads(await self.body())
        return self._json


class AuthenticatedRoute(APIRoute):
    """An APIRoute that answers 401 before the body is read, then 429 ``rate_limited`` for an organisation
    over its requests per minute (``api_gateway.services.limits``), 422 for a query parameter or header
    holding NUL (``api_gateway.parameters``), and 422 for a body that is not JSON.

    Once the key is good, a JSON Lines upload is granted its longer body deadline (``api_gateway.uploads``).

    FastAPI parses a JSON body before it solves dependencies, so without this a request with no key and
    a malformed body would get 422, and a body it cannot decode (invalid UTF-8, nesting too deep,
    numbers too long) a bare 400 instead of the contract's 422 ``invalid_request``. A client that goes
    away while its body arrives is not a body FastAPI could not parse: its ``ClientDisconnect`` goes on
    (``api_gateway.errors`` logs it quietly).
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def authenticated_handler(request: Request) -> Response:
            gateway = _gateway(request)
            caller = await _authenticate(gateway, request)
            await gateway.limits.admit(caller.org_id)  # 429 rate_limited before anything is read or recorded
            check_parameters(request)
            if is_upload(request.scope):
                grant_upload_time(request.scope)  # the server's long upload deadline, now that the key is good
            try:
                return await handler(_StrictJsonRequest(request.scope, request.receive))
            except HTTPException as exc:
                # FastAPI raises a 400 "from" the decoding error when it cannot parse the body.
                if isinstance(exc.__cause__, ClientDisconnect):
                    raise exc.__cause__ from None
                if exc.status_code != 400 or exc.__cause__ is None:
                    raise
                reason = f"{type(exc.__cause__).__name__}: {exc.__cause__}"
                raise ApiError(
                    422,
                    "invalid_request",
                    "the request body is not valid JSON",
                    [{"loc": ["body"], "msg": reason, "type": "json_invalid"}],
                ) from exc

        return authenticated_handler


Gateway = Annotated[GatewayWiring, Depends(_gateway)]
Caller = Annotated[ApiKey, Depends(_caller)]
WaitSeconds = Annotated[
    float | None,
    Query(
        ge=0,
        le=60,
        description=(
            "Long-poll: answer 200 with the `Turn` once it leaves `queued`/`running`, or as it stands after this "
            "many seconds. Absent or 0: answer at once."
        ),
    ),
]
TurnId = Annotated[str, Path(description="The turn's id (`turn_…`); another organisation's turn is 404.")]
SessionId = Annotated[str, Path(description="The session's id (`sess_…`); another organisation's session is 404.")]
BatchId = Annotated[str, Path(description="The batch's id (`batch_…`); another organisation's batch is 404.")]
StreamFlag = Annotated[
    bool,
    Query(
        description=(
            "Answer 200 with the turn's events as they happen (`text/event-stream`, as "
            "`GET /v1/turns/{turn_id}/events`) instead; not with `wait`."
        )
    ),
]
