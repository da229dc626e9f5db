"""WebhookService: the gateway's side of webhooks — a request's ``webhook_url`` checked when it is
submitted, and the deliveries of a turn or a batch listed with their attempts.

A ``webhook_url`` is refused (422) when the caller's organisation has no webhook secret
(``webhook_not_configured``: it would never be sent) or when the URL is not one Aptix will call
(``webhook_url_not_allowed``: not http(s), credentials in it, a host that does not resolve or
resolves to a private, loopback or link-local address, or an IPv6 address carrying one;
``shared.webhooks.addresses``).
"""

from __future__ import annotations

from api_gateway.ids import is_batch_id, is_turn_id
from api_gateway.services.errors import InvalidRequest, NotFound
from shared.db.batches import BatchRepository
from shared.db.turns import TurnRepository
from shared.db.webhook_deliveries import WebhookDeliveryRepository
from shared.db.webhook_endpoints import WebhookEndpointRepository
from shared.models.webhook import WebhookDeliveryList, WebhookEndpoint, WebhookEndpointList
from shared.webhooks import WebhookConfig, WebhookUrlError, check_endpoint
from shared.webhooks.addresses import Resolver

__all__ = ["WebhookService"]


class WebhookService:
    """Check webhook URLs and list deliveries; built once per gateway from its ports."""

    def __init__(
        self,
        *,
        config: WebhookConfig,
        deliveries: WebhookDeliveryRepository,
        turns: TurnRepository,
        batches: BatchRepository,
        endpoints: WebhookEndpointRepository | None = None,
        resolve: Resolver | None = None,
    ) -> None:
        self._endpoints = endpoints
        self._config = config
        self._deliveries = deliveries
        self._turns = turns
        self._batches = batches
        self._resolve = resolve

    def check_url(self, url: str | None, *, org_id: str, loc: tuple[str | int, ...] = ("body",)) -> None:
        """Refuse a ``webhook_url`` that would never be sent.

        Args:
            url: the request's ``webhook_url`` (None: nothing to check).
            org_id: the caller's organisation.
            loc: where the request sits in the HTTP body, for the ``loc`` of error details.

        Raises:
            InvalidRequest: ``webhook_not_configured`` or ``webhook_url_not_allowed``.
        """
        if url is None:
            return
        where = [*loc, "webhook_url"]
        if not self._config.keys_for(org_id):
            raise InvalidRequest(
                f"webhook_url: organisation {org_id!r} has no webhook secret, so it gets no webhooks "
                "(the operator sets one in APTIX_WEBHOOK_SECRETS as org_id:whsec_…, or adds one with "
                "`aptix webhooks secret add`)",
                [{"loc": where, "msg": "no webhook secret for this organisation", "type": "webhook_not_configured"}],
                code="webhook_not_configured",
            )
        try:
            check_endpoint(url, allow_private=self._config.allow_private, resolve=self._resolve)
        except WebhookUrlError as exc:
            raise InvalidRequest(
                f"webhook_url: {exc}",
                [{"loc": where, "msg": str(exc), "type": "webhook_url_not_allowed"}],
                code="webhook_url_not_allowed",
            ) from exc

    def deliveries(self, *, org_id: str, turn_id: str | None, batch_id: str | None, limit: int) -> WebhookDeliveryList:
        """The deliveries of the caller's turn, or batch (its own event and its turns'), with their attempts.

        Raises:
            InvalidRequest: neither or both of ``turn_id`` and ``batch_id``.
            NotFound: the turn or batch does not belong to ``org_id``.
        """
        if (turn_id is None) == (batch_id is None):
            raise InvalidRequest(
                "give exactly one of turn_id and batch_id",
                [{"loc": ["query"], "msg": "exactly one of turn_id and batch_id", "type": "value_error"}],
            )
        if turn_id is not None and (not is_turn_id(turn_id) or self._turns.get(turn_id, org_id=org_id) is None):
            raise NotFound("not_found", f"turn {turn_id!r} does not exist")
        if batch_id is not None and (not is_batch_id(batch_id) or self._batches.get(batch_id, org_id=org_id) is None):
            raise NotFound("not_found", f"batch {batch_id!r} does not exist")
        found, more = self._deliveries.listing(org_id=org_id, turn_id=turn_id, batch_id=batch_id, limit=limit)
        return WebhookDeliveryList(deliveries=found, has_more=more)

    def endpoints(self, *, org_id: str) -> WebhookEndpointList:
        """The caller's organisation's endpoints (those its deliveries named, the disabled ones, its default),
        each ``enabled`` or ``disabled`` (it answered 410 Gone; ``aptix webhooks enable`` enables it again)."""
        if self._endpoints is None:
            return WebhookEndpointList(endpoints=[], signed=bool(self._config.keys_for(org_id)))
        default = self._config.default_urls.get(org_id)
        found = self._endpoints.listing(org_id, also=(default,) if default else ())
        return WebhookEndpointList(
            endpoints=[
                WebhookEndpoint(
                    url=record.url,
                    state="disabled" if record.disabled_at is not None else "enabled",
                    disabled_at=record.disabled_at,
                    disabled_reason=record.reason,
                    default=record.url == default,
                    deliveries=record.deliveries,
                    last_event_at=record.last_event_at,
                )
                for record in found
            ],
            signed=bool(self._config.keys_for(org_id)),
        )
