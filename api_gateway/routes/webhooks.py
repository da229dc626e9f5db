"""``/v1/webhook-deliveries``: the webhook deliveries of a turn or a batch, with each attempt's status code;
``/v1/webhook-endpoints``: the organisation's endpoints and whether each is enabled."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.openapi import error_responses
from shared.models.webhook import WebhookDeliveryList, WebhookEndpointList

__all__ = ["router"]

router = APIRouter(prefix="/v1", tags=["webhooks"], route_class=AuthenticatedRoute)


@router.get(
    "/webhook-endpoints",
    response_model=WebhookEndpointList,
    operation_id="listWebhookEndpoints",
    summary="List the organisation's webhook endpoints",
    response_description="Each endpoint, enabled or disabled (after a 410 Gone), by URL.",
    responses=error_responses(401, 503),
)
async def list_endpoints(caller: Caller, gateway: Gateway) -> WebhookEndpointList:
    """The endpoints of the caller's organisation: those its deliveries named, the disabled ones, its default."""
    return await run_in_threadpool(gateway.webhook_service.endpoints, org_id=caller.org_id)


@router.get(
    "/webhook-deliveries",
    response_model=WebhookDeliveryList,
    operation_id="listWebhookDeliveries",
    summary="List a turn's or a batch's webhook deliveries",
    response_description="The deliveries, oldest first, each with its attempts and their status codes.",
    responses=error_responses(
        401,
        503,
        specific={
            404: "`not_found`: no such turn or batch in the caller's organisation.",
            422: "`invalid_request`: neither `turn_id` nor `batch_id`, or a parameter out of range.",
        },
    ),
)
async def list_deliveries(
    caller: Caller,
    gateway: Gateway,
    turn_id: Annotated[str | None, Query(max_length=128, description="The turn's deliveries.")] = None,
    batch_id: Annotated[
        str | None, Query(max_length=128, description="The batch's deliveries: its own event and its turns'.")
    ] = None,
    limit: Annotated[int, Query(ge=1, le=1000, description="At most this many deliveries, oldest first.")] = 100,
) -> WebhookDeliveryList:
    """The deliveries of one turn (``turn_id``) or batch (``batch_id``) of the caller's organisation."""
    return await run_in_threadpool(
        gateway.webhook_service.deliveries, org_id=caller.org_id, turn_id=turn_id, batch_id=batch_id, limit=limit
    )
