"""Webhook configuration: each organisation's signing secrets, its default endpoint, the retry schedule.

Parsed from ``APTIX_WEBHOOK_SECRETS`` (``org_id:whsec_…`` pairs), ``APTIX_WEBHOOK_DEFAULT_URLS``
(``org_id:url`` pairs) and ``APTIX_WEBHOOK_RETRY_SCHEDULE`` (seconds), each comma-separated; and the
secrets kept in the database (``aptix webhooks secret add``, ``shared.db.webhook_secrets``), which
``stored`` answers from a short cache. An organisation's signing keys are its ``APTIX_WEBHOOK_SECRETS``
one and its active stored ones: every one signs each delivery (Standard Webhooks carries several
signatures), so a receiver can move from one to the next without missing a delivery. An organisation
without any gets no webhooks. An event goes to the URL its request named, else to its organisation's
default, else nowhere.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.ttl_cache import Cached
from shared.webhooks.parsing import parse_default_urls, parse_retry_schedule, parse_secrets

if TYPE_CHECKING:
    from shared.settings import Settings

__all__ = ["StoredSecrets", "WebhookConfig"]

StoredSecrets = Cached[Mapping[str, Sequence[bytes]]]
"""Every organisation's active signing keys kept in the database, oldest first, read every few seconds."""


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
    stored: StoredSecrets | None = field(default=None, repr=False, compare=False)
    """The active secrets kept in the database, by organisation (None: none are read)."""

    @classmethod
    def from_settings(cls, settings: Settings, *, stored: StoredSecrets | None = None) -> WebhookConfig:
        """The webhook configuration of ``settings`` (already validated when they were read), with ``stored``."""
        return cls(
            secrets=parse_secrets(settings.webhook_secrets.get_secret_value()),
            default_urls=parse_default_urls(settings.webhook_default_urls),
            retry_delays=parse_retry_schedule(settings.webhook_retry_schedule),
            allow_private=settings.webhook_allow_private,
            stored=stored,
        )

    @property
    def enabled(self) -> bool:
        """Whether any organisation may get webhooks (one has a secret, or secrets are read from the database)."""
        return bool(self.secrets) or self.stored is not None

    def keys_for(self, org_id: str, *, fresh: bool = False) -> list[bytes]:
        """Every key that signs the organisation's deliveries: its ``APTIX_WEBHOOK_SECRETS`` one, then its
        active stored ones (oldest first); empty when it gets no webhooks. ``fresh``: read the stored ones
        now rather than take them from the cache (a signer that found none: one just added)."""
        keys = [self.secrets[org_id]] if org_id in self.secrets else []
        if self.stored is not None:
            if fresh:
                self.stored.forget()
            keys += [key for key in self.stored.get().get(org_id, ()) if key not in keys]
        return keys

    def secret_for(self, org_id: str) -> bytes | None:
        """The organisation's first signing key (:meth:`keys_for`); None when it gets no webhooks."""
        keys = self.keys_for(org_id)
        return keys[0] if keys else None

    def url_for(self, org_id: str, requested: str | None) -> str | None:
        """Where an event of ``org_id`` goes: the URL its request named, else the default, else None.

        Args:
            org_id: the organisation the event belongs to.
            requested: the ``webhook_url`` of the turn's or batch's request, if any.

        Returns:
            The endpoint; None when the organisation has no secret or no endpoint applies.
        """
        if not self.keys_for(org_id):
            return None
        return requested or self.default_urls.get(org_id)
