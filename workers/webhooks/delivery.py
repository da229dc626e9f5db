"""WebhookDeliverer: one attempt at delivering one webhook (the task ``aptix.webhook.deliver``).

It claims the attempt (``shared.db.webhook_deliveries``: of several messages for one attempt, one
makes it), checks the endpoint again (its host may resolve elsewhere now: ``shared.webhooks.addresses``)
and POSTs the event, signed (``workers.webhooks.signing``), to the very address it checked, without
following redirects; then it records the answer and decides (``workers.webhooks.schedule``). A retry
due within the retry policy's parking threshold (``workers.retry.park_after``) is sent with a
countdown; a longer wait is parked in the database (``next_attempt_at``), never held by a worker, and
the reconciler's sweep sends it when due (``workers.webhooks.sweep``), as it sends an attempt whose
worker died.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import httpx

from shared.db.webhook_deliveries import Attempt, Claim, WebhookDeliveryRepository
from shared.models.webhook import DeliveryStatus
from shared.webhooks import WebhookConfig, WebhookUrlError, check_endpoint
from shared.webhooks.addresses import Resolver
from workers.webhooks.schedule import Verdict, decide
from workers.webhooks.signing import signed_headers

__all__ = ["TIMEOUT_SECONDS", "SendAttempt", "WebhookDeliverer", "http_client"]

logger = logging.getLogger(__name__)

SendAttempt = Callable[[str, int, float], None]
"""Sends attempt number ``attempt`` of delivery ``delivery_id`` after ``countdown`` seconds."""

TIMEOUT_SECONDS = 15.0
"""How long an endpoint has to answer (connect, send, first byte of the answer, each)."""
_LEASE_SECONDS = 4 * TIMEOUT_SECONDS + 30.0
"""An attempt not recorded this long after its claim is presumed lost (its worker died)."""
_MAX_ERROR_CHARS = 300


def http_client() -> httpx.Client:
    """The client of a worker process's deliveries.

    No connection is kept alive: an address may serve several host names, and a TLS session
    authenticated for one must not carry another's events. No proxy or ``.netrc`` from the environment.
    """
    return httpx.Client(
        timeout=TIMEOUT_SECONDS,
        limits=httpx.Limits(max_connections=100, max_keepalive_connections=0),
        follow_redirects=False,
        trust_env=False,
    )


class WebhookDeliverer:
    """Makes attempts at delivering webhooks; one per worker process."""

    def __init__(
        self,
        *,
        deliveries: WebhookDeliveryRepository,
        config: WebhookConfig,
        http: httpx.Client,
        send: SendAttempt,
        park_after: float,
        clock: Callable[[], datetime],
        random: Callable[[], float],
        resolve: Resolver | None = None,
    ) -> None:
        """Build the deliverer.

        Args:
            deliveries: the deliveries' repository.
            config: secrets, retry schedule, whether private addresses are allowed.
            http: the HTTP client (:func:`http_client`).
            send: sends a retry with a countdown.
            park_after: longer waits are left to the sweep (seconds).
            clock: the wall clock.
            random: jitter for the retry delays.
            resolve: the resolver of endpoint host names (default: the system's).
        """
        self._deliveries = deliveries
        self._config = config
        self._http = http
        self._send = send
        self._park_after = park_after
        self._clock = clock
        self._random = random
        self._resolve = resolve

    def deliver(self, delivery_id: str, attempt: int) -> Verdict | None:
        """Make attempt number ``attempt`` of the delivery, if it is still to be made.

        Returns:
            What became of the delivery; None when the attempt was not this message's to make (made
            already, delivered, given up) or its endpoint is disabled.
        """
        now = self._clock()
        claim = self._deliveries.claim(
            delivery_id, attempt=attempt, now=now, lease_until=now + timedelta(seconds=_LEASE_SECONDS)
        )
        if claim is None:
            logger.debug("webhook delivery %s: attempt %d is not to be made (made already, or finished)",
                         delivery_id, attempt)  # fmt: skip
            return None
        if claim.endpoint_disabled:
            logger.info("webhook delivery %s not sent: its endpoint answered 410 Gone before", delivery_id)
            return None
        status_code, error, duration_ms = self._post(claim)
        decision = decide(status_code, attempt=attempt, delays=self._config.retry_delays, rand=self._random())
        record = Attempt(attempt=attempt, at=now, status_code=status_code, error=error, duration_ms=duration_ms)
        if decision.verdict is Verdict.DELIVERED:
            self._deliveries.finish(claim, record, status=DeliveryStatus.DELIVERED)
        elif decision.verdict is Verdict.DISABLE_ENDPOINT:
            reason = f"answered 410 Gone to webhook delivery {delivery_id} at {now.isoformat()}"
            self._deliveries.finish(claim, record, status=DeliveryStatus.ENDPOINT_DISABLED, disable_reason=reason)
            logger.warning("webhook endpoint disabled for organisation %s: %s", claim.org_id, reason)
        elif decision.verdict is Verdict.GIVE_UP:
            self._deliveries.finish(claim, record, status=DeliveryStatus.FAILED)
            logger.warning("webhook delivery %s given up after %d attempts (last: %s)",
                           delivery_id, attempt, error or status_code)  # fmt: skip
        else:
            assert decision.delay is not None
            due = self._clock() + timedelta(seconds=decision.delay)
            self._deliveries.finish(claim, record, status=DeliveryStatus.PENDING, next_attempt_at=due)
            self._retry(delivery_id, attempt + 1, decision.delay)
        return decision.verdict

    def _post(self, claim: Claim) -> tuple[int | None, str | None, float | None]:
        """POST the event; the status code, or why there is none, and how long it took (ms)."""
        # None cached: perhaps one was added since the cache was read (the commit that recorded this saw it).
        keys = self._config.keys_for(claim.org_id) or self._config.keys_for(claim.org_id, fresh=True)
        if not keys:
            return (
                None,
                "not sent: the organisation has no webhook secret (APTIX_WEBHOOK_SECRETS, aptix webhooks secret)",
                None,
            )
        try:
            target = check_endpoint(claim.url, allow_private=self._config.allow_private, resolve=self._resolve)
        except WebhookUrlError as exc:
            return None, f"not sent: {exc}"[:_MAX_ERROR_CHARS], None
        headers = signed_headers(
            *keys, delivery_id=claim.delivery_id, timestamp=int(self._clock().timestamp()), body=claim.body
        )
        if target.host_header is not None:
            headers["host"] = target.host_header
        extensions = {"sni_hostname": target.sni_hostname} if target.sni_hostname is not None else None
        started = time.perf_counter()
        try:
            # Streamed and never read: the receiver's answer is its status code; its body could be anything.
            with self._http.stream(
                "POST", target.url, content=claim.body.encode(), headers=headers, extensions=extensions
            ) as response:
                status_code = response.status_code
        except httpx.TimeoutException:
            return None, f"no answer within {TIMEOUT_SECONDS:g}s", _since(started)
        except httpx.HTTPError as exc:
            return None, f"{type(exc).__name__}: {exc}"[:_MAX_ERROR_CHARS], _since(started)
        return status_code, None, _since(started)

    def _retry(self, delivery_id: str, attempt: int, delay: float) -> None:
        if delay > self._park_after:
            return  # parked: next_attempt_at is in the database, the sweep sends it when due
        try:
            self._send(delivery_id, attempt, delay)
        except Exception as exc:  # the broker: the delivery stays pending and the sweep sends it
            logger.warning("could not send the retry of webhook delivery %s (%s); the sweep sends it",
                           delivery_id, type(exc).__name__)  # fmt: skip


def _since(started: float) -> float:
    return round((time.perf_counter() - started) * 1000, 1)
