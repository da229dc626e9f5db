"""Webhook configuration: each organisation's signing secret, its default endpoint, the retry schedule.

Parsed from ``APTIX_WEBHOOK_SECRETS`` (``org_id:whsec_…`` pairs), ``APTIX_WEBHOOK_DEFAULT_URLS``
(``org_id:url`` pairs) and ``APTIX_WEBHOOK_RETRY_SCHEDULE`` (seconds), each comma-separated. An
organisation without a secret gets no webhooks. An event goes to the URL its request named, else to
its organisation's default, else nowhere.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.webhooks.parsing import parse_default_urls, parse_retry_schedule, parse_secrets

if TYPE_CHECKING:
    from shared.settings import Settings

__all__ = ["WebhookConfig"]


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """Who gets webhooks, where, signed with what, and how often a failed delivery is tried again."""

    secrets: dict[str, bytes] = field(default_factory=dict, repr=False)
    """Each organisation's signing key (the bytes after ``whsec_``, base64-decoded)."""
    default_urls: dict[str, str] = field(default_factory=dict)
    """Each organisation's default endpoint, for events whose request named none."""
    retry_delays: tuple[float, ...] = ()
    """Seconds to wait before each retry of a failed delivery, in order; then it is given up."""
    allow_private: bool = False
    """Whether endpoints may be private, loopback or link-local addresses (tests, development)."""

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookConfig:
        """The webhook configuration of ``settings`` (already validated when they were read)."""
        return cls(
            secrets=parse_secrets(settings.webhook_secrets.get_secret_value()),
            default_urls=parse_default_urls(settings.webhook_default_urls),
            retry_delays=parse_retry_schedule(settings.webhook_retry_schedule),
            allow_private=settings.webhook_allow_private,
        )

    @property
    def enabled(self) -> bool:
        """Whether any organisation gets webhooks."""
        return bool(self.secrets)

    def secret_for(self, org_id: str) -> bytes | None:
        """The organisation's signing key; None when it gets no webhooks."""
        return self.secrets.get(org_id)

    def url_for(self, org_id: str, requested: str | None) -> str | None:
        """Where an event of ``org_id`` goes: the URL its request named, else the default, else None.

        Args:
            org_id: the organisation the event belongs to.
            requested: the ``webhook_url`` of the turn's or batch's request, if any.

        Returns:
            The endpoint; None when the organisation has no secret or no endpoint applies.
        """
        if org_id not in self.secrets:
            return None
        return requested or self.default_urls.get(org_id)
