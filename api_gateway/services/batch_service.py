"""BatchService: many turns recorded at once, and a batch's progress.

A batch's turns run through the same pipeline as single turns, at a lower broker priority
(``shared.models.envelope``), so a batch never starves an interactive turn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime

from api_gateway.ids import is_batch_id, new_batch_id
from api_gateway.services.errors import Conflict, InvalidRequest, NotFound
from api_gateway.services.turn_service import TurnService
from api_gateway.services.webhook_service import WebhookService
from shared.db.batches import BatchRecord, BatchRepository
from shared.db.records import TurnRecord
from shared.db.turns import SessionBusy
from shared.models.batch import Batch, BatchRequest

__all__ = ["BatchService"]


class BatchService:
    """Record batches and read their progress; built once per gateway from its ports."""

    def __init__(
        self,
        *,
        turns: TurnService,
        batches: BatchRepository,
        max_requests: int,
        clock: Callable[[], datetime],
        webhooks: WebhookService | None = None,
    ) -> None:
        self._turns = turns
        self._webhooks = webhooks
        self._batches = batches
        self._max_requests = max_requests
        self._clock = clock

    def record(self, body: BatchRequest, *, org_id: str, user_id: str) -> Batch:
        """Record every request of the batch as its own queued turn and send their first steps, or nothing.

        Raises:
            InvalidRequest: more than ``APTIX_MAX_BATCH_REQUESTS`` requests, two requests continuing one
                session, a webhook URL refused (``WebhookService.check_url``), or a request
                :meth:`TurnService.admit` refuses (an idempotency key is refused by
                :class:`~shared.models.batch.BatchTurnRequest` already).
            NotFound: ``session_not_found``.
            Conflict: ``session_busy``.
            Unavailable: the broker or the state store refused; nothing was recorded.
        """
        if len(body.requests) > self._max_requests:
            raise InvalidRequest(
                f"a batch holds at most {self._max_requests} requests (APTIX_MAX_BATCH_REQUESTS); "
                f"this one has {len(body.requests)}",
                [{"loc": ["body", "requests"], "msg": "too many requests", "type": "too_long"}],
            )
        _check_distinct_sessions(body)
        self._check_webhook_urls(body, org_id=org_id)
        batch_id = new_batch_id()
        turns = [
            self._turns.admit(
                request,
                org_id=org_id,
                user_id=user_id,
                loc=("body", "requests", index),
                batch_id=batch_id,
                batch_index=index,
                check_webhook=False,
            )
            for index, request in enumerate(body.requests)
        ]
        now = self._clock()
        row = BatchRecord(
            batch_id=batch_id, org_id=org_id, user_id=user_id, total=len(turns), created_at=now,
            webhook_url=body.webhook_url,
        )  # fmt: skip
        try:
            self._batches.create(
                row,
                turns,
                now=now,
                deadline_at=self._turns.deadline(),
                before_commit=lambda: self._turns.publish_new(
                    [turn.turn_id for turn in turns], batch=True, refused="the batch was not accepted", org_id=org_id
                ),
            )
        except SessionBusy as exc:
            raise Conflict("session_busy", str(exc)) from exc
        return Batch(batch_id=batch_id, total=len(turns), counts=self._batches.counts(batch_id), created_at=now)

    def _check_webhook_urls(self, body: BatchRequest, *, org_id: str) -> None:
        """The batch's and its requests' webhook URLs, each distinct one checked once."""
        if self._webhooks is None:
            return
        self._webhooks.check_url(body.webhook_url, org_id=org_id)
        checked = {body.webhook_url}
        for index, request in enumerate(body.requests):
            if request.webhook_url not in checked:
                self._webhooks.check_url(request.webhook_url, org_id=org_id, loc=("body", "requests", index))
                checked.add(request.webhook_url)

    def require(self, batch_id: str, *, org_id: str) -> BatchRecord:
        """The caller's batch.

        Raises:
            NotFound: no batch ``batch_id`` belongs to ``org_id``.
        """
        row = self._batches.get(batch_id, org_id=org_id) if is_batch_id(batch_id) else None
        if row is None:
            raise NotFound("not_found", f"batch {batch_id!r} does not exist")
        return row

    def progress(self, batch_id: str, *, org_id: str) -> Batch:
        """The batch with its turns' counts by status.

        Raises:
            NotFound: no batch ``batch_id`` belongs to ``org_id``.
        """
        row = self.require(batch_id, org_id=org_id)
        counts = self._batches.counts(batch_id)
        return Batch(batch_id=row.batch_id, total=row.total, counts=counts, created_at=row.created_at)

    def turns(self, batch_id: str) -> Iterator[TurnRecord]:
        """The batch's turns in request order (check the caller with :meth:`require` first)."""
        return self._batches.turns(batch_id)


def _check_distinct_sessions(body: BatchRequest) -> None:
    seen: dict[str, int] = {}
    for index, request in enumerate(body.requests):
        if request.session_id is None:
            continue
        if request.session_id in seen:
            raise InvalidRequest(
                f"requests[{seen[request.session_id]}] and requests[{index}] continue the same session; "
                "a session runs one turn at a time",
                [{"loc": ["body", "requests", index, "session_id"], "msg": "repeated session", "type": "value_error"}],
            )
        seen[request.session_id] = index
