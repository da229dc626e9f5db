"""StagedBatch: a batch's requests checked one by one and kept aside until the batch is recorded.

Both ways of submitting a batch (a JSON body, a JSON Lines upload) feed their requests here, in order.
Each request is checked as ``POST /v1/turns`` would (``TurnService.check_request``) and the turn it describes is
written to a spool (memory while small, then a temporary file): 100,000 turns never sit in memory at
once. What the batch as a whole must satisfy is checked on the way: no two requests continue one
session, no two share an idempotency key, each distinct webhook URL is allowed. The staged batch also
computes the hash its idempotency key stands for, the same for either way of submitting it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import tempfile
from collections.abc import Callable, Iterator
from typing import IO

from api_gateway.services.errors import InvalidRequest
from shared.db.records import NewTurn
from shared.models.turn import TurnRequest
from shared.openai.extras import TurnExtras

__all__ = ["SPOOL_MEMORY_BYTES", "Loc", "StagedBatch", "describe_loc"]

SPOOL_MEMORY_BYTES = 4 * 1024 * 1024
"""Staged turns are kept in memory up to this size, then in a temporary file."""

_NEW_TURN_FIELDS = tuple(field.name for field in dataclasses.fields(NewTurn))

Loc = tuple[str | int, ...]
"""Where a request sits in the HTTP body, for the ``loc`` of error details (``("body", "requests", 3)``)."""

CheckRequest = Callable[[TurnRequest, Loc, int, TurnExtras | None], NewTurn]
"""Checks one request at ``loc`` as the batch's ``index``-th turn, with its extras (``TurnService.check_request``
bound to the batch)."""
CheckUrl = Callable[[str | None, Loc], None]
"""Refuses a webhook URL the organisation may not use (``WebhookService.check_url``)."""


@dataclasses.dataclass(frozen=True, slots=True)
class _Keyed:
    index: int
    request_hash: str
    loc: Loc


class StagedBatch:
    """A batch's checked turns, in request order, with what the batch as a whole needs to know.

    Use as a context manager: the spool is removed on exit.
    """

    def __init__(self, *, check_request: CheckRequest, check_url: CheckUrl, webhook_url: str | None) -> None:
        """Start an empty batch.

        Args:
            check_request: checks one request (raises the ``ServiceError`` that refuses it).
            check_url: refuses a webhook URL (the batch's own is checked here).
            webhook_url: the batch's ``webhook_url``.
        """
        self._check_request = check_request
        self._check_url = check_url
        self._spool: IO[bytes] = tempfile.SpooledTemporaryFile(max_size=SPOOL_MEMORY_BYTES)  # noqa: SIM115  # closed in __exit__
        self._hash = hashlib.sha256()
        self._sessions: dict[str, Loc] = {}
        self._urls: set[str | None] = {None, webhook_url}
        self._webhook_url = webhook_url
        self.count = 0
        """How many requests were staged."""
        self.keys: dict[str, _Keyed] = {}
        """The requests' own idempotency keys: key -> (index, request hash, loc)."""
        check_url(webhook_url, ("body",))

    def __enter__(self) -> StagedBatch:
        return self

    def __exit__(self, *_exc: object) -> None:
        self._spool.close()

    def add(self, request: TurnRequest, *, loc: Loc, extras: TurnExtras | None = None) -> None:
        """Check the next request and stage its turn (with ``extras``: a line of an OpenAI face's batch).

        Raises:
            InvalidRequest: a repeated session or idempotency key, a webhook URL refused, or what
                ``check_request`` refuses.
            ServiceError: what ``check_request`` refuses otherwise (``session_not_found``).
        """
        index = self.count
        if request.session_id is not None:
            earlier = self._sessions.get(request.session_id)
            if earlier is not None:
                raise InvalidRequest(
                    f"{describe_loc(earlier)} and {describe_loc(loc)} continue the same session; "
                    "a session runs one turn at a time",
                    [{"loc": [*loc, "session_id"], "msg": "repeated session", "type": "value_error"}],
                )
        if request.idempotency_key is not None and request.idempotency_key in self.keys:
            earlier = self.keys[request.idempotency_key].loc
            raise InvalidRequest(
                f"{describe_loc(earlier)} and {describe_loc(loc)} carry the same idempotency_key",
                [{"loc": [*loc, "idempotency_key"], "msg": "repeated idempotency_key", "type": "value_error"}],
            )
        if request.webhook_url not in self._urls:
            self._check_url(request.webhook_url, loc)
            self._urls.add(request.webhook_url)
        turn = self._check_request(request, loc, index, extras)
        if request.session_id is not None:
            self._sessions[request.session_id] = loc
        if turn.idempotency_key is not None:
            self.keys[turn.idempotency_key] = _Keyed(index, turn.request_hash, loc)
        self._hash.update(_canonical(request) + b"\n")
        row = {name: getattr(turn, name) for name in _NEW_TURN_FIELDS}  # asdict() deep-copies: 3x the cost
        self._spool.write(json.dumps(row, separators=(",", ":")).encode() + b"\n")
        self.count += 1

    def request_hash(self) -> str:
        """The hash a batch idempotency key stands for: every request, in order, and the batch's webhook URL."""
        final = self._hash.copy()
        final.update(json.dumps({"webhook_url": self._webhook_url}, sort_keys=True).encode())
        return final.hexdigest()

    def turns(self, *, skip: set[int]) -> Iterator[NewTurn]:
        """The staged turns in order, but those at the indexes of ``skip`` (read from the spool, once)."""
        self._spool.seek(0)
        for index, line in enumerate(self._spool):
            if index not in skip:
                yield NewTurn(**json.loads(line))

    def loc_of(self, key: str) -> Loc:
        """Where the request with idempotency key ``key`` sits."""
        return self.keys[key].loc


def _canonical(request: TurnRequest) -> bytes:
    # Every field, defaults included, in one key order: the same request hashes the same however it was sent.
    return json.dumps(request.model_dump(mode="json"), sort_keys=True, separators=(",", ":")).encode()


def describe_loc(loc: Loc) -> str:
    """A request's place as a client reads it: ``requests[3]`` or ``line 4``."""
    if len(loc) >= 2 and loc[0] == "line":
        return f"line {loc[1]}"
    return f"requests[{loc[-1]}]"
