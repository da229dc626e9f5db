"""The gateway's services: what it does to turns, batches and sessions, apart from how HTTP asks for it."""

from api_gateway.services.batch_service import BatchService
from api_gateway.services.errors import Conflict, InvalidRequest, Limited, NotFound, ServiceError, Unavailable
from api_gateway.services.event_stream import EventStreams
from api_gateway.services.limits import OrgLimitsService
from api_gateway.services.session_service import SessionService
from api_gateway.services.turn_service import TurnService
from api_gateway.services.webhook_service import WebhookService

__all__ = [
    "BatchService",
    "Conflict",
    "EventStreams",
    "InvalidRequest",
    "Limited",
    "NotFound",
    "OrgLimitsService",
    "ServiceError",
    "SessionService",
    "TurnService",
    "Unavailable",
    "WebhookService",
]
