"""ResponseRepository: the responses of the OpenAI face, one per round of a turn (``shared.openai.ids``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from shared.db.tables import ResponseRow

__all__ = ["ResponseRecord", "ResponseRepository"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResponseRecord:
    """A response as recorded: which round of which turn it is, and what its request said."""

    response_id: str
    turn_id: str
    round: int
    org_id: str
    previous_response_id: str | None
    conversation_id: str | None
    params: dict[str, Any]
    """The request's fields a ``Response`` echoes."""
    input_items: list[dict[str, Any]]
    """The request's input items, as the model got them."""
    idempotency_key: str | None
    request_hash: str
    created_at: datetime


class ResponseRepository:
    """Reads and writes of responses."""

    def __init__(self, db: sessionmaker[Session]) -> None:
        self._db = db

    def add(self, record: ResponseRecord) -> ResponseRecord:
        """Record ``record`` unless its round (or its idempotency key) is recorded already.

        Returns:
            ``record``, or the response recorded before for the same round or key (a retried create
            that raced the first one finds that one).
        """
        try:
            with self._db.begin() as orm:
                orm.add(ResponseRow(**asdict(record)))
            return record
        except IntegrityError:
            earlier = self.by_round(record.turn_id, record.round)
            if earlier is None and record.idempotency_key is not None:
                earlier = self.by_idempotency_key(record.org_id, record.idempotency_key)
            if earlier is None:
                raise
            return earlier

    def get(self, response_id: str, *, org_id: str) -> ResponseRecord | None:
        """The response, if it belongs to ``org_id``."""
        with self._db() as orm:
            row = orm.get(ResponseRow, response_id)
        return None if row is None or row.org_id != org_id else _record(row)

    def by_round(self, turn_id: str, round_: int) -> ResponseRecord | None:
        """The response that is round ``round_`` of ``turn_id``."""
        with self._db() as orm:
            row = orm.scalar(select(ResponseRow).where(ResponseRow.turn_id == turn_id, ResponseRow.round == round_))
        return None if row is None else _record(row)

    def by_idempotency_key(self, org_id: str, key: str) -> ResponseRecord | None:
        """The organisation's response created with ``key``."""
        with self._db() as orm:
            query = select(ResponseRow).where(ResponseRow.org_id == org_id, ResponseRow.idempotency_key == key)
            row = orm.scalar(query)
        return None if row is None else _record(row)


_FIELDS = tuple(field.name for field in fields(ResponseRecord))


def _record(row: ResponseRow) -> ResponseRecord:
    return ResponseRecord(**{name: getattr(row, name) for name in _FIELDS})
