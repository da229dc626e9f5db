"""What a PostgreSQL client sent, as libpq's trace records it: for counting a write's round trips.

The engine must hold one connection (``StaticPool``), so that every statement the code under test
sends goes through the traced one.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import Engine

__all__ = ["Sent", "traced"]


@dataclass
class Sent:
    """The messages the client sent while traced: ``(type, contents)`` each (``Parse``, ``Sync``, ``Query``...)."""

    messages: list[tuple[str, str]] = field(default_factory=list)

    @property
    def round_trips(self) -> int:
        """Times the client waited for the server: each ``Sync`` (extended protocol) and simple ``Query``."""
        return sum(1 for kind, _ in self.messages if kind in ("Sync", "Query"))

    @property
    def transactions(self) -> int:
        """Transactions the client opened itself (psycopg sends ``BEGIN`` as a simple query)."""
        return sum(1 for kind, text in self.messages if kind == "Query" and "BEGIN" in text)

    @property
    def queries(self) -> list[str]:
        """The simple queries' texts (``BEGIN``, ``COMMIT``...)."""
        return [text for kind, text in self.messages if kind == "Query"]


@contextmanager
def traced(engine: Engine) -> Iterator[Sent]:
    """Trace the engine's one connection for the block; the yielded ``Sent`` fills in when the block ends."""
    raw = engine.raw_connection()
    pgconn = raw.driver_connection.pgconn  # type: ignore[union-attr]  # psycopg's connection
    raw.close()
    sent = Sent()
    with tempfile.TemporaryFile("w+") as trace:
        pgconn.trace(trace.fileno())
        try:
            yield sent
        finally:
            pgconn.untrace()
        trace.seek(0)
        for line in trace.read().splitlines():
            fields = line.split("\t")  # time, F (client) or B (server), length, type, contents
            if fields[1:2] == ["F"]:
                sent.messages.append((fields[3], "\t".join(fields[4:])))
