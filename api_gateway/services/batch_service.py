"""BatchService: many turns recorded at once, a batch's progress, its cancel and the organisation's list.

A batch's turns run through the same pipeline as single turns, at a lower broker priority
(``shared.models.envelope``), so a batch never starves an interactive turn. Its requests are staged
first (``batch_staging``; a JSON Lines upload through ``batch_upload``), then recorded together: all
of them or none.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime

from api_gateway.ids import is_batch_id, new_batch_id
from api_gateway.services.batch_staging import Loc, StagedBatch, describe_loc
from api_gateway.services.errors import Conflict, InvalidRequest, NotFound
from api_gateway.services.turn_service import TurnService
from api_gateway.services.webhook_service import WebhookService
from shared.db.batches import BatchKeyTaken, BatchRecord, BatchRepository, ReusedTurn, TurnKeyTaken, UnknownCursor
from shared.db.records import NewTurn, TurnRecord
from shared.db.turns import SessionBusy
from shared.models.batch import Batch, BatchList, BatchRequest, BatchStatus, RunningPolicy
from shared.models.turn import TurnRequest, TurnStatus
from shared.openai.extras import TurnExtras

__all__ = ["BatchService", "batch_status"]


class BatchService:
    """Record batches, read their progress, cancel and list them; built once per gateway from its ports."""

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

        With an ``idempotency_key`` already used by the organisation, the earlier batch is returned
        (same body) and nothing is recorded.

        Raises:
            InvalidRequest: more than ``APTIX_MAX_BATCH_REQUESTS`` requests, two requests continuing one
                session or sharing an idempotency key, a webhook URL refused, or a request
                :meth:`TurnService.check_request` refuses.
            NotFound: ``session_not_found``.
            Conflict: ``session_busy`` or ``idempotency_key_reused`` (the batch's key, or a request's).
            Unavailable: the broker or the state store refused; nothing was recorded.
        """
        if len(body.requests) > self._max_requests:
            raise InvalidRequest(
                f"a batch holds at most {self._max_requests} requests (APTIX_MAX_BATCH_REQUESTS); "
                f"this one has {len(body.requests)} (send more as a JSON Lines upload)",
                [{"loc": ["body", "requests"], "msg": "too many requests", "type": "too_long"}],
            )
        batch_id = new_batch_id()
        with self.stage(batch_id, org_id=org_id, user_id=user_id, webhook_url=body.webhook_url) as staged:
            for index, request in enumerate(body.requests):
                staged.add(request, loc=("body", "requests", index))
            return self.commit(staged, batch_id=batch_id, org_id=org_id, user_id=user_id,
                               webhook_url=body.webhook_url, idempotency_key=body.idempotency_key)  # fmt: skip

    def stage(self, batch_id: str, *, org_id: str, user_id: str, webhook_url: str | None) -> StagedBatch:
        """An empty staged batch whose requests are checked as turns of ``batch_id``.

        Raises:
            Limited: ``quota_exceeded``: the organisation's turns used its tokens for today.
            InvalidRequest: the batch's ``webhook_url`` is refused.
        """
        self._turns.check_quota(org_id)

        def check_request(request: TurnRequest, loc: Loc, index: int, extras: TurnExtras | None) -> NewTurn:
            return self._turns.check_request(
                request, org_id=org_id, user_id=user_id, loc=loc, batch_id=batch_id, batch_index=index,
                check_webhook=False, extras=extras,
            )  # fmt: skip

        def check_url(url: str | None, loc: Loc) -> None:
            if self._webhooks is not None:
                self._webhooks.check_url(url, org_id=org_id, loc=loc)

        return StagedBatch(check_request=check_request, check_url=check_url, webhook_url=webhook_url)

    def check_webhook_url(self, url: str | None, *, org_id: str) -> None:
        """Refuse a batch's ``webhook_url`` the organisation may not use, as staging the batch would.

        Raises:
            InvalidRequest: the URL is refused.
        """
        if self._webhooks is not None:
            self._webhooks.check_url(url, org_id=org_id, loc=("body",))

    def commit(
        self,
        staged: StagedBatch,
        *,
        batch_id: str,
        org_id: str,
        user_id: str,
        webhook_url: str | None,
        idempotency_key: str | None,
    ) -> Batch:
        """Record a staged batch: its new turns (in one transaction, their first steps sent) and the earlier
        turns its requests' keys name; or the earlier batch of ``idempotency_key``.

        Raises:
            Conflict: ``idempotency_key_reused``, ``session_busy``.
            Unavailable: the broker or the state store refused; nothing was recorded.
        """
        request_hash = staged.request_hash()
        if idempotency_key is not None:
            earlier = self._batches.by_idempotency_key(org_id, idempotency_key)
            if earlier is not None:
                return self._replay(earlier, request_hash)
        reused = self._reused(staged, org_id=org_id)
        now = self._clock()
        row = BatchRecord(
            batch_id=batch_id, org_id=org_id, user_id=user_id, total=staged.count, created_at=now,
            webhook_url=webhook_url, idempotency_key=idempotency_key, request_hash=request_hash, reused=len(reused),
        )  # fmt: skip
        try:
            with self._batches.creating(
                row,
                staged.turns(skip={turn.batch_index for turn in reused}),
                reused=reused,
                now=now,
                deadline_at=self._turns.deadline(),
            ) as turn_ids:
                self._turns.sender.send_new(turn_ids, batch=True, refused="the batch was not accepted", org_id=org_id)
        except BatchKeyTaken as exc:
            winner = self._batches.by_idempotency_key(org_id, str(idempotency_key))
            if winner is None:  # the winner's transaction rolled back after all: the client may retry
                raise Conflict(
                    "idempotency_key_reused", "a concurrent request with this idempotency_key failed; retry"
                ) from exc
            return self._replay(winner, request_hash)
        except TurnKeyTaken as exc:
            raise Conflict(
                "idempotency_key_reused", "a request's idempotency_key was used by another turn meanwhile; retry"
            ) from exc
        except SessionBusy as exc:
            raise Conflict("session_busy", str(exc)) from exc
        return self._view(row)

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
        return self._view(self.require(batch_id, org_id=org_id))

    def turns(self, batch_id: str) -> Iterator[TurnRecord]:
        """The batch's turns in request order, reused ones included (check the caller with :meth:`require` first)."""
        return self._batches.turns(batch_id)

    def cancel(self, batch_id: str, *, org_id: str, running: RunningPolicy = "finish") -> Batch:
        """Cancel the batch: its turns not started at once; its running and paused ones per ``running``.

        Idempotent while the batch is cancelling (a later ``cancel`` also cancels what a ``finish`` let
        run). Turns the batch reuses from earlier requests are not its own: they are left alone.

        Raises:
            NotFound: no batch ``batch_id`` belongs to ``org_id``.
            Conflict: ``batch_finished``: none of its turns is unfinished.
        """
        row = self.require(batch_id, org_id=org_id)
        counts = self._batches.counts(batch_id)
        if not any(counts[status] for status in TurnStatus.unfinished()):
            raise Conflict("batch_finished", f"batch {batch_id!r} has no unfinished turn ({batch_status(row, counts)})")
        self._batches.request_cancel(batch_id, mode=running, now=self._clock())
        queued = self._batches.turn_ids(batch_id, statuses=(TurnStatus.QUEUED,))
        self._turns.cancel_queued(queued, org_id=org_id)
        if running == "cancel":
            started = (TurnStatus.RUNNING, TurnStatus.REQUIRES_CLIENT_TOOLS)
            for turn_id in self._batches.turn_ids(batch_id, statuses=started):
                try:
                    self._turns.cancel(turn_id, org_id=org_id)
                except Conflict:
                    continue  # it ended meanwhile
        return self.progress(batch_id, org_id=org_id)

    def page(self, *, org_id: str, limit: int, after: str | None) -> BatchList:
        """A page of the organisation's batches, newest first.

        Raises:
            InvalidRequest: ``after`` names no batch of the organisation.
        """
        try:
            rows, has_more = self._batches.page(org_id, limit=limit, after=after)
        except UnknownCursor as exc:
            raise InvalidRequest(
                f"after: batch {after!r} is not one of this organisation's",
                [{"loc": ["query", "after"], "msg": "unknown batch", "type": "value_error"}],
            ) from exc
        counts = self._batches.counts_of([row.batch_id for row in rows])
        data = [_batch(row, counts[row.batch_id]) for row in rows]
        return BatchList(
            data=data,
            first_id=data[0].batch_id if data else None,
            last_id=data[-1].batch_id if data else None,
            has_more=has_more,
        )

    def _replay(self, earlier: BatchRecord, request_hash: str) -> Batch:
        if earlier.request_hash != request_hash:
            raise Conflict("idempotency_key_reused", "this idempotency_key was used before with a different batch")
        return self._view(earlier)

    def _reused(self, staged: StagedBatch, *, org_id: str) -> list[ReusedTurn]:
        """The requests whose idempotency key names an earlier turn of the same request.

        Raises:
            Conflict: ``idempotency_key_reused``: an earlier turn has a request's key and another request.
        """
        if not staged.keys:
            return []
        earlier = self._turns.records.by_idempotency_keys(org_id, staged.keys.keys())
        reused = []
        for key, turn in sorted(earlier.items(), key=lambda item: staged.keys[item[0]].index):
            keyed = staged.keys[key]
            if turn.request_hash != keyed.request_hash:
                where = describe_loc(keyed.loc)
                raise Conflict(
                    "idempotency_key_reused",
                    f"{where}: this idempotency_key was used before with a different request",
                    [{"loc": [*keyed.loc, "idempotency_key"], "msg": "idempotency_key reused", "type": "conflict"}],
                )
            reused.append(ReusedTurn(keyed.index, turn.turn_id))
        return reused

    def _view(self, row: BatchRecord) -> Batch:
        return _batch(row, self._batches.counts(row.batch_id))


def batch_status(row: BatchRecord, counts: dict[TurnStatus, int]) -> BatchStatus:
    """Where the batch stands: in flight (queued or running turns) or not, and whether a cancel was asked."""
    moving = any(counts[status] for status in TurnStatus.in_flight())
    if row.cancel_requested_at is None:
        return BatchStatus.IN_PROGRESS if moving else BatchStatus.COMPLETED
    return BatchStatus.CANCELLING if moving else BatchStatus.CANCELLED


def _batch(row: BatchRecord, counts: dict[TurnStatus, int]) -> Batch:
    return Batch(
        batch_id=row.batch_id, status=batch_status(row, counts), total=row.total, reused=row.reused, counts=counts,
        created_at=row.created_at, cancel_requested_at=row.cancel_requested_at,
    )  # fmt: skip
