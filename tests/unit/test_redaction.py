"""Secrets stay out of errors and logs: what ``shared.redaction`` finds and hides."""

from __future__ import annotations

import io
import logging

from pydantic import SecretStr

from shared.logging import configure_logging
from shared.redaction import REDACTED, RedactingFilter, redact, secrets_in
from shared.settings import Settings


def _settings() -> Settings:
    return Settings(
        llm_api_key=SecretStr("provider-key-0123456789"),
        api_keys="client-key-aaaa:org:user,x:org2:user2",
        database_url="postgresql+psycopg://aptix:db-password-1@db:5432/aptix",
        redis_url="redis://:redis-password-2@redis:6379/0",
    )


def test_secrets_in_finds_the_model_key_client_keys_and_url_passwords() -> None:
    found = secrets_in(_settings())
    assert set(found) == {"provider-key-0123456789", "client-key-aaaa", "db-password-1", "redis-password-2"}
    assert list(found) == sorted(found, key=len, reverse=True)  # "x" is too short to redact safely


def test_redact_hides_each_secret_and_any_openai_style_key() -> None:
    text = "bad key provider-key-0123456789 (db db-password-1); also sk-proj-ZZZZZZZZ9 and sk-1"
    clean = redact(text, secrets_in(_settings()))
    assert clean == f"bad key {REDACTED} (db {REDACTED}); also {REDACTED} and sk-1"
    assert redact("nothing secret here", secrets_in(_settings())) == "nothing secret here"


def test_redacting_filter_cleans_messages_arguments_and_tracebacks() -> None:
    stream = io.StringIO()
    logger = logging.getLogger("test_redaction")
    handler = logging.StreamHandler(stream)
    handler.addFilter(RedactingFilter(secrets_in(_settings())))
    logger.addHandler(handler)
    try:
        logger.warning("model said %s", "Incorrect API key provided: provider-key-0123456789")
        try:
            raise RuntimeError("connect to postgresql://aptix:db-password-1@db failed")
        except RuntimeError:
            logger.exception("database")
    finally:
        logger.removeHandler(handler)
    output = stream.getvalue()
    assert "provider-key-0123456789" not in output and "db-password-1" not in output, output
    assert output.count(REDACTED) >= 2 and "RuntimeError" in output


def test_configure_logging_redacts_on_the_root_handler(capsys: object) -> None:
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    try:
        configure_logging("INFO", secrets=["provider-key-0123456789"])
        logging.getLogger("aptix.test").warning("echo provider-key-0123456789")
        for handler in root.handlers:
            handler.flush()
    finally:
        root.handlers[:], _ = saved[0], root.setLevel(saved[1])
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    assert "echo [REDACTED]" in err and "provider-key-0123456789" not in err
