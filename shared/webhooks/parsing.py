"""The webhook settings' text: ``APTIX_WEBHOOK_SECRETS`` (``org_id:whsec_…`` pairs),
``APTIX_WEBHOOK_DEFAULT_URLS`` (``org_id:url`` pairs) and ``APTIX_WEBHOOK_RETRY_SCHEDULE`` (seconds),
each comma-separated.

``shared.settings`` validates the variables with these at start-up and ``shared.webhooks.config``
builds the configuration from them; neither imports the other.
"""

from __future__ import annotations

import base64
import binascii
import math

from shared.webhooks.addresses import check_syntax

__all__ = ["SECRET_PREFIX", "parse_default_urls", "parse_retry_schedule", "parse_secrets"]

SECRET_PREFIX = "whsec_"
"""What a Standard Webhooks secret starts with; the rest is the key, base64-encoded."""

_MIN_SECRET_BYTES = 16


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
