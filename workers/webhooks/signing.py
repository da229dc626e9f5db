"""Standard Webhooks signatures (https://www.standardwebhooks.com): the headers that let a receiver
check that an event comes from Aptix, unchanged, and recently.

``webhook-signature`` is ``v1,`` and the base64 of HMAC-SHA256, keyed with the organisation's secret
(the bytes of the base64 after ``whsec_``), of ``"{webhook-id}.{webhook-timestamp}.{body}"``; an
organisation with several active secrets (a rotation under way) gets one such signature per secret,
separated by spaces (``v1,sig1 v1,sig2``), and a receiver accepts the delivery if any matches. The
timestamp is that of the attempt (receivers refuse old ones); the id and the body are the event's,
the same on every attempt.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

__all__ = ["sign", "signed_headers"]


def sign(secret: bytes, *, delivery_id: str, timestamp: int, body: str) -> str:
    """The ``webhook-signature`` value of one attempt.

    Args:
        secret: the organisation's key (decoded from ``whsec_…``).
        delivery_id: the ``webhook-id``.
        timestamp: the ``webhook-timestamp``, Unix seconds.
        body: the exact body sent.

    Returns:
        ``v1,<base64 signature>``.
    """
    content = f"{delivery_id}.{timestamp}.{body}".encode()
    digest = hmac.new(secret, content, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode("ascii")


def signed_headers(*secrets: bytes, delivery_id: str, timestamp: int, body: str) -> dict[str, str]:
    """Every header of one attempt: content type, user agent and the three Standard Webhooks headers, the
    signature one signature per key of ``secrets`` (at least one)."""
    if not secrets:
        raise ValueError("a delivery is signed with at least one secret")
    return {
        "content-type": "application/json",
        "user-agent": "Aptix-Webhooks/1",
        "webhook-id": delivery_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(
            sign(secret, delivery_id=delivery_id, timestamp=timestamp, body=body) for secret in secrets
        ),
    }
