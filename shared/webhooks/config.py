"""Webhook configuration: each organisation's signing secret, its default endpoint, the retry schedule.

Parsed from ``APTIX_WEBHOOK_SECRETS`` (``org_id:whsec_…`` pairs), ``APTIX_WEBHOOK_DEFAULT_URLS``
(``org_id:url`` pairs) and ``APTIX_WEBHOOK_RETRY_SCHEDULE`` (seconds), each comma-separated. An
organisation without a secret gets no webhooks. An event goes to the URL its request named, else to
its organisation's default, else nowhere.
"""

from __future__ import annotations

import base64
import binascii
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from shared.webhooks.addresses import check_syntax

if TYPE_CHECKING:
    from shared.settings import Settings

__all__ = [
    "SECRET_PREFIX",
    "WebhookConfig",
    "parse_default_urls",
    "parse_retry_schedule",
    "parse_secrets",
]

SECRET_PREFIX = "whsec_"
"""What a Standard Webhooks secret starts with; the rest is the key, base64-encoded."""

_MIN_SECRET_BYTES = 16


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


def parse_secrets(raw: str) -> dict[str, bytes]:
    """Parse ``org_id:whsec_<base64>`` pairs separated by commas.

    Args:
        raw: the value of ``APTIX_WEBHOOK_SECRETS``.

    Returns:
        Each organisation's key bytes.

    Raises:
        ValueError: an entry that is not such a pair, a key that is not base64 or shorter than 16
            bytes, or an organisation named twice. The message never shows a secret.
    """
    secrets: dict[str, bytes] = {}
    for index, (org_id, value) in enumerate(_pairs(raw, "APTIX_WEBHOOK_SECRETS", "org_id:whsec_…")):
        where = f"APTIX_WEBHOOK_SECRETS entry {index + 1} (organisation {org_id!r})"
        if not value.startswith(SECRET_PREFIX):
            raise ValueError(f"{where}: the secret must start with {SECRET_PREFIX!r}")
        try:
            key = base64.b64decode(value[len(SECRET_PREFIX) :], validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"{where}: the part after {SECRET_PREFIX!r} must be base64") from None
        if len(key) < _MIN_SECRET_BYTES:
            raise ValueError(f"{where}: the key must be at least {_MIN_SECRET_BYTES} bytes (it has {len(key)})")
        if org_id in secrets:
            raise ValueError(f"{where}: the organisation already has a secret")
        secrets[org_id] = key
    return secrets


def parse_default_urls(raw: str) -> dict[str, str]:
    """Parse ``org_id:url`` pairs separated by commas (a URL may hold colons, not commas).

    Args:
        raw: the value of ``APTIX_WEBHOOK_DEFAULT_URLS``.

    Returns:
        Each organisation's default endpoint.

    Raises:
        ValueError: an entry that is not such a pair, a URL that is not http(s), or an organisation
            named twice.
    """
    urls: dict[str, str] = {}
    for org_id, url in _pairs(raw, "APTIX_WEBHOOK_DEFAULT_URLS", "org_id:url"):
        problem = check_syntax(url)
        if problem is not None:
            raise ValueError(f"APTIX_WEBHOOK_DEFAULT_URLS: the URL of organisation {org_id!r} {problem}")
        if org_id in urls:
            raise ValueError(f"APTIX_WEBHOOK_DEFAULT_URLS: organisation {org_id!r} is named twice")
        urls[org_id] = url
    return urls


def parse_retry_schedule(raw: str) -> tuple[float, ...]:
    """Parse the retry delays, in seconds, separated by commas (empty: no retry).

    Args:
        raw: the value of ``APTIX_WEBHOOK_RETRY_SCHEDULE``.

    Returns:
        The delays in order.

    Raises:
        ValueError: a value that is not a positive, finite number of seconds.
    """
    delays = []
    for part in (item.strip() for item in raw.split(",")):
        if not part:
            continue
        try:
            seconds = float(part)
        except ValueError:
            raise ValueError(f"APTIX_WEBHOOK_RETRY_SCHEDULE: {part!r} is not a number of seconds") from None
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"APTIX_WEBHOOK_RETRY_SCHEDULE: {part!r} must be a positive number of seconds")
        delays.append(seconds)
    return tuple(delays)


def _pairs(raw: str, variable: str, shape: str) -> list[tuple[str, str]]:
    pairs = []
    for entry in (part.strip() for part in raw.split(",")):
        if not entry:
            continue
        org_id, separator, value = entry.partition(":")
        if not separator or not org_id.strip() or not value.strip():
            raise ValueError(f"{variable} entries must be {shape} pairs separated by commas")
        pairs.append((org_id.strip(), value.strip()))
    return pairs
