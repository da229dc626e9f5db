"""What the ``aptix`` commands that manage the database share (``aptix orgs``, ``aptix webhooks``): their
settings, their engine, ``--json``, and how they fail.

They read ``APTIX_DATABASE_URL`` (and ``APTIX_REDIS_URL``) from the environment as the gateway does
(``shared.settings``) and talk to the database directly, not through a gateway: they are the
operator's, not a client's. Exit codes: 0 done; 1 the database did not answer or is not migrated
(``aptix db upgrade``), or what the command names does not exist; 2 bad input (a value out of range,
settings that do not validate). Every message goes to standard error as ``error: <message>``.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from typing import Any

from aptix_cli.command_support import UsageError, fail

__all__ = ["NotFound", "StoreContext", "json_flag", "print_json", "store_command"]


class NotFound(Exception):
    """What the command names does not exist (an unknown secret id): ``error: <message>``, exit code 1."""


class StoreContext:
    """The settings and the database engine of one command run; the engine is disposed of at the end."""

    def __init__(self) -> None:
        from pydantic import ValidationError

        from shared.db.engine import ProcessKind, engine_for
        from shared.settings import Settings

        try:
            self.settings = Settings()
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'settings'}: {e['msg']}" for e in exc.errors()
            )
            raise UsageError(f"the APTIX_* settings are not valid: {problems}") from None
        self.engine = engine_for(self.settings, ProcessKind.MIGRATION, name="aptix admin")

    def sessions(self) -> Any:
        """A session factory on the engine."""
        from shared.db import session_factory

        return session_factory(self.engine)

    def close(self) -> None:
        """Dispose of the engine."""
        self.engine.dispose()


def json_flag() -> argparse.ArgumentParser:
    """A parent parser with ``--json``: print JSON instead of text."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--json", action="store_true", help="print JSON instead of text")
    return parent


def print_json(value: Any) -> None:
    """Write ``value`` as one line of JSON to standard output."""
    sys.stdout.write(json.dumps(value, default=str) + "\n")


def store_command(command: Callable[[StoreContext, argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: build its :class:`StoreContext`, turn each expected trouble into a message and an exit code."""

    def run(args: argparse.Namespace) -> int:
        from sqlalchemy.exc import InterfaceError, OperationalError, ProgrammingError

        from shared.db.migrate import head_revision

        context: StoreContext | None = None
        try:
            context = StoreContext()
            return command(context, args)
        except UsageError as exc:
            return fail(str(exc), code=2)
        except NotFound as exc:
            return fail(str(exc), code=1)
        except (OperationalError, InterfaceError) as exc:
            reason = str(exc.orig if exc.orig is not None else exc).strip().splitlines()[0][:200]
            if "no such table" in reason:
                return fail(
                    f"the database is not migrated ({reason}): run `aptix db upgrade` (to {head_revision()})", code=1
                )
            return fail(f"the database (APTIX_DATABASE_URL) did not answer: {reason}", code=1)
        except ProgrammingError as exc:
            reason = str(exc.orig).strip().splitlines()[0][:200]
            return fail(
                f"the database is not migrated ({reason}): run `aptix db upgrade` (to {head_revision()})", code=1
            )
        finally:
            if context is not None:
                context.close()

    return run
