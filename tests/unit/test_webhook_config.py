"""Webhook settings: secrets, default endpoints and which endpoint an event goes to; secrets never shown."""

from __future__ import annotations

import base64

import pytest
from pydantic import ValidationError

from shared.redaction import secrets_in
from shared.settings import Settings
from shared.webhooks.config import WebhookConfig
from shared.webhooks.parsing import parse_default_urls, parse_secrets

KEY = b"k" * 24
SECRET = "whsec_" + base64.b64encode(KEY).decode()


def test_secrets_are_parsed_to_key_bytes_per_organisation() -> None:
    other = "whsec_" + base64.b64encode(b"o" * 32).decode()
    assert parse_secrets(f" org-a:{SECRET} , org-b:{other},") == {"org-a": KEY, "org-b": b"o" * 32}


@pytest.mark.parametrize(
    ("raw", "problem"),
    [
        ("org-a", "org_id:whsec_"),
        (f"org-a:{SECRET.removeprefix('whsec_')}", "must start with 'whsec_'"),
        ("org-a:whsec_not*base64", "must be base64"),
        ("org-a:whsec_" + base64.b64encode(b"short").decode(), "at least 16 bytes"),
        (f"org-a:{SECRET},org-a:{SECRET}", "already has a secret"),
    ],
)
def test_a_malformed_secret_is_refused_at_start_without_showing_it(raw: str, problem: str) -> None:
    with pytest.raises(ValidationError, match=problem) as refused:
        Settings(webhook_secrets=raw)
    for entry in raw.split(","):
        secret = entry.partition(":")[2]
        assert not secret or secret not in str(refused.value)


def test_a_default_url_needs_a_secret_and_an_http_url() -> None:
    with pytest.raises(ValidationError, match="without a secret in APTIX_WEBHOOK_SECRETS: org-b"):
        Settings(webhook_secrets=f"org-a:{SECRET}", webhook_default_urls="org-b:https://example.com/h")
    with pytest.raises(ValueError, match="must be http or https"):
        parse_default_urls("org-a:ftp://example.com/h")
    assert parse_default_urls("org-a:https://example.com:8443/h?x=1") == {"org-a": "https://example.com:8443/h?x=1"}


def test_an_event_goes_to_its_requests_url_else_the_default_and_never_without_a_secret() -> None:
    settings = Settings(
        webhook_secrets=f"org-a:{SECRET},org-c:{SECRET}", webhook_default_urls="org-a:https://default.example.com/h"
    )
    config = WebhookConfig.from_settings(settings)
    assert config.url_for("org-a", "https://mine.example.com/h") == "https://mine.example.com/h"
    assert config.url_for("org-a", None) == "https://default.example.com/h"
    assert config.url_for("org-c", None) is None
    assert config.url_for("org-b", "https://mine.example.com/h") is None
    assert config.secret_for("org-a") == KEY and config.secret_for("org-b") is None
    assert not WebhookConfig.from_settings(Settings()).enabled


def test_webhook_secrets_are_redacted_from_logs_and_reprs() -> None:
    settings = Settings(webhook_secrets=f"org-a:{SECRET}")
    assert SECRET in secrets_in(settings)
    assert SECRET not in repr(settings) and SECRET not in repr(WebhookConfig.from_settings(settings))
