"""Standard Webhooks signatures: what Aptix signs, the reference implementation (``standardwebhooks``) verifies."""

from __future__ import annotations

import base64
import time

import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from workers.webhooks.signing import sign, signed_headers

SECRET = "whsec_" + base64.b64encode(b"a sixteen+ byte key for tests").decode()
KEY = base64.b64decode(SECRET.removeprefix("whsec_"))
BODY = '{"id":"msg_1","type":"turn.completed","data":{"output_text":"h\\u00e9llo"}}'


def test_the_signature_is_the_one_the_reference_implementation_computes() -> None:
    from datetime import UTC, datetime

    at = datetime.fromtimestamp(1_700_000_000, UTC)
    assert sign(KEY, delivery_id="msg_1", timestamp=1_700_000_000, body=BODY) == Webhook(SECRET).sign("msg_1", at, BODY)


def test_signed_headers_verify_with_standardwebhooks() -> None:
    headers = signed_headers(KEY, delivery_id="msg_1", timestamp=int(time.time()), body=BODY)
    assert headers["content-type"] == "application/json"
    assert Webhook(SECRET).verify(BODY.encode(), headers)["id"] == "msg_1"


@pytest.mark.parametrize(
    ("key", "delivery_id", "body"),
    [
        (KEY, "msg_1", BODY.replace("llo", "LLO")),
        (KEY, "msg_2", BODY),
        (b"another key of sixteen bytes", "msg_1", BODY),
    ],
    ids=["body", "id", "key"],
)
def test_a_changed_body_id_or_key_fails_verification(key: bytes, delivery_id: str, body: str) -> None:
    headers = signed_headers(key, delivery_id=delivery_id, timestamp=int(time.time()), body=body)
    headers["webhook-id"] = "msg_1"
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY.encode(), headers)


def test_an_old_timestamp_fails_verification() -> None:
    # Receivers refuse a signature older than five minutes: each attempt is signed when it is made
    headers = signed_headers(KEY, delivery_id="msg_1", timestamp=int(time.time()) - 3600, body=BODY)
    with pytest.raises(WebhookVerificationError):
        Webhook(SECRET).verify(BODY.encode(), headers)


def test_with_two_secrets_each_receiver_verifies_with_its_own_and_a_third_does_not() -> None:
    # A rotation under way: the old and the new secret both sign (v1,sig1 v1,sig2)
    new_secret = "whsec_" + base64.b64encode(b"the new key, sixteen bytes or more").decode()
    new_key = base64.b64decode(new_secret.removeprefix("whsec_"))
    headers = signed_headers(KEY, new_key, delivery_id="msg_1", timestamp=int(time.time()), body=BODY)
    assert len(headers["webhook-signature"].split(" ")) == 2
    assert Webhook(SECRET).verify(BODY.encode(), headers)["id"] == "msg_1"
    assert Webhook(new_secret).verify(BODY.encode(), headers)["id"] == "msg_1"
    stranger = "whsec_" + base64.b64encode(b"nobody's key of sixteen bytes").decode()
    with pytest.raises(WebhookVerificationError):
        Webhook(stranger).verify(BODY.encode(), headers)
