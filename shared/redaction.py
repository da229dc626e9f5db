"""Redaction: configured secrets never reach a client-visible error, a trace record or a log line.

Foreign text enters Aptix at one place that matters: a model provider's error message, which
becomes the turn's error, a trace record and a batch result. Some providers echo the key they
received (``Incorrect API key provided: sk-…``). Such text goes through :func:`redact` before it
is stored; every log record goes through :class:`RedactingFilter`.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from urllib.parse import urlsplit, urlunsplit

from shared.settings import Settings

__all__ = ["REDACTED", "RedactingFilter", "redact", "secrets_in", "without_password"]

REDACTED = "[REDACTED]"
"""What a secret is replaced with."""

_MIN_SECRET_LENGTH = 4
"""Shorter values (an empty key, "x") would redact ordinary words."""

# Keys in the OpenAI style (sk-…, sk-proj-…) are secrets whoever they belong to; a provider's
# message may name a key we were never configured with (an old one, a proxy's). Aptix's own database
# keys (aptix_ and 48 hex digits, shared.api_keys) are in no setting: their shape gives them away.
_KEY_PATTERN = re.compile(r"\b(?:(?:sk|rk|pk)-[A-Za-z0-9_\-*.]{6,}|aptix_[0-9a-f]{16,})")


def secrets_in(settings: Settings) -> tuple[str, ...]:
    """Every secret ``settings`` holds: the model key, the gateway's API keys, webhook secrets, passwords in URLs.

    Args:
        settings: the process settings.

    Returns:
        The secrets, longest first (so a secret containing another is redacted whole).
    """
    found = {settings.llm_api_key.get_secret_value(), *settings.accepted_api_keys}
    for entry in settings.webhook_secrets.get_secret_value().split(","):
        secret = entry.partition(":")[2].strip()
        found.update((secret, secret.removeprefix("whsec_")))
    for url in (settings.database_url, settings.redis_url, settings.broker_url or ""):
        password = urlsplit(url).password if "://" in url else None
        if password:
            found.add(password)
    return tuple(sorted((s for s in found if len(s) >= _MIN_SECRET_LENGTH), key=len, reverse=True))


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret, and anything shaped like an OpenAI key, replaced by ``[REDACTED]``.

    Args:
        text: foreign or formatted text.
        secrets: the values to hide, longest first (see :func:`secrets_in`).

    Returns:
        The text, unchanged when it holds no secret.
    """
    for secret in secrets:
        if len(secret) >= _MIN_SECRET_LENGTH and secret in text:
            text = text.replace(secret, REDACTED)
    return _KEY_PATTERN.sub(REDACTED, text)


def without_password(url: str) -> str:
    """``url`` with the password of its user part shown as ``***`` (for start-up lines)."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    userinfo, _, host = parts.netloc.rpartition("@")
    return urlunsplit(parts._replace(netloc=f"{userinfo.split(':', 1)[0]}:***@{host}"))


class RedactingFilter(logging.Filter):
    """Redacts the formatted message (and exception text) of every record that passes a handler."""

    def __init__(self, secrets: Iterable[str]) -> None:
        super().__init__()
        self._secrets = tuple(secrets)

    def filter(self, record: logging.LogRecord) -> bool:
        """Replace the record's message by its redacted form; never drops a record."""
        message = record.getMessage()
        clean = redact(message, self._secrets)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self._secrets)
        return True
