"""``aptix keys create|list|revoke``: the organisations' API keys, in the database the gateways read.

The commands talk to the database of ``APTIX_DATABASE_URL`` (the gateways' own), never to a
gateway: every gateway polls the database for created and revoked keys (``api_gateway.authenticator``),
so nothing else needs telling. An organisation exists once a key names it. Each command takes
``--json``; bad input (an organisation name, an expiry, an unknown key id) is an ``error: …`` line
on stderr and a non-zero exit: 2 for a value that cannot be right, 1 for a key id no key has or a
database that does not answer.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from aptix_cli.command_support import UsageError, fail, out

if TYPE_CHECKING:
    from shared.db.api_keys import ApiKeyRecord, ApiKeyRepository

__all__ = ["add_key_commands", "check_org", "parse_expiry"]

_DURATION = re.compile(r"(\d{1,6})([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_MAX_ORG = 128
_MAX_NAME = 255


def add_key_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``keys create|list|revoke`` on ``aptix``'s subparsers."""
    raw = argparse.ArgumentParser(add_help=False)
    raw.add_argument("--json", action="store_true", help="print JSON")
    keys = commands.add_parser(
        "keys", help="create, list and revoke API keys (in the database of APTIX_DATABASE_URL)"
    ).add_subparsers(dest="keys_command", required=True)

    create = keys.add_parser(
        "create", parents=[raw], help="make a key of an organisation and print it (once: only its hash is stored)"
    )
    create.add_argument("--org", required=True, help="the organisation the key stands for (made by its first key)")
    create.add_argument("--name", default=None, help="what the key is for, to tell keys apart")
    create.add_argument(
        "--expires", default=None, metavar="WHEN",
        help="when the key stops working: a duration from now (90d, 12h, 30m, 2w) or an ISO 8601 time with a "
        "zone (2027-01-01T00:00:00Z) or date (2027-01-01, midnight UTC); default: never",
    )  # fmt: skip
    create.set_defaults(run=_with_keys(_create))

    listing = keys.add_parser("list", parents=[raw], help="list the keys (never the keys themselves), oldest first")
    listing.add_argument("--org", default=None, help="only this organisation's")
    listing.set_defaults(run=_with_keys(_list))

    revoke = keys.add_parser("revoke", parents=[raw], help="revoke a key: every gateway refuses it within seconds")
    revoke.add_argument("key_id", metavar="ID", help="the key's id (key_…), as `aptix keys list` shows it")
    revoke.set_defaults(run=_with_keys(_revoke))


def check_org(org_id: str) -> str:
    """``org_id`` when it can name an organisation: 1 to 128 printable characters, no space, ``:`` or ``,``
    (so that it could stand in ``APTIX_API_KEYS`` too).

    Raises:
        UsageError: it cannot.
    """
    if not 0 < len(org_id) <= _MAX_ORG or any(not c.isprintable() or c.isspace() or c in ":," for c in org_id):
        raise UsageError(
            f"bad --org {org_id[:_MAX_ORG]!r}: an organisation is 1 to {_MAX_ORG} printable characters "
            "without spaces, ':' or ','"
        )
    return org_id


def parse_expiry(text: str, *, now: datetime) -> datetime:
    """When a key given ``--expires text`` at ``now`` expires.

    Args:
        text: a duration (``90d``, ``12h``, ``30m``, ``45s``, ``2w``), an ISO 8601 time with a zone, or a
            date (midnight UTC).
        now: the time it is.

    Returns:
        The expiry, in UTC.

    Raises:
        UsageError: ``text`` is none of these, or not after ``now``.
    """
    value = text.strip()
    duration = _DURATION.fullmatch(value)
    if duration:
        expires = now + timedelta(seconds=int(duration[1]) * _UNITS[duration[2]])
    else:
        try:
            expires = datetime.fromisoformat(value.replace("z", "Z"))
        except ValueError:
            raise UsageError(
                f"bad --expires {text[:64]!r}: give a duration (90d, 12h, 30m, 45s, 2w) or an ISO 8601 time with a "
                "zone (2027-01-01T00:00:00Z) or a date (2027-01-01)"
            ) from None
        if _DATE.fullmatch(value):
            expires = expires.replace(tzinfo=UTC)
        elif expires.tzinfo is None:
            raise UsageError(f"bad --expires {text[:64]!r}: say its time zone (2027-01-01T00:00:00Z, …+02:00)")
    expires = expires.astimezone(UTC)
    if expires <= now:
        raise UsageError(f"bad --expires {text[:64]!r}: {_stamp(expires)} is not in the future")
    return expires


def _create(keys: ApiKeyRepository, args: argparse.Namespace, now: datetime) -> int:
    org_id = check_org(args.org)
    name = args.name.strip() if args.name else None
    if name is not None and (len(name) > _MAX_NAME or not name.isprintable()):
        raise UsageError(f"bad --name: at most {_MAX_NAME} printable characters")
    expires_at = parse_expiry(args.expires, now=now) if args.expires is not None else None
    record, key = keys.create(org_id=org_id, name=name or None, expires_at=expires_at, now=now)
    if args.json:
        out(json.dumps({
            "id": record.key_id, "key": key, "org": record.org_id, "name": record.name, "prefix": record.prefix,
            "created_at": _stamp(record.created_at), "expires_at": _stamp(record.expires_at),
        }))  # fmt: skip
        return 0
    for label, value in (("id", record.key_id), ("org", record.org_id), ("name", record.name or "-"),
                         ("expires", _stamp(record.expires_at) or "never"), ("key", key)):  # fmt: skip
        out(f"{label:<8} {value}")
    sys.stderr.write("Store the key now: it is not shown again (the database keeps only its hash).\n")
    return 0


def _list(keys: ApiKeyRepository, args: argparse.Namespace, now: datetime) -> int:
    records = keys.find_all(org_id=check_org(args.org) if args.org is not None else None)
    if args.json:
        out(json.dumps([_key_json(record) for record in records]))
        return 0
    header = ("ID", "ORG", "NAME", "PREFIX", "CREATED", "LAST USED", "EXPIRES", "REVOKED")
    rows = [header] + [
        (r.key_id, r.org_id, r.name or "-", r.prefix, _stamp(r.created_at) or "-", _stamp(r.last_used_at) or "-",
         _stamp(r.expires_at) or "never", _stamp(r.revoked_at) or "-")
        for r in records
    ]  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    for row in rows:
        out("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())
    return 0


def _revoke(keys: ApiKeyRepository, args: argparse.Namespace, now: datetime) -> int:
    from shared.api_keys import KEY_ID_PATTERN

    key_id = args.key_id.strip()
    if not KEY_ID_PATTERN.fullmatch(key_id):
        raise UsageError(f"bad key id {key_id[:64]!r}: a key id is key_ and 16 hex digits (`aptix keys list`)")
    record = keys.revoke(key_id, now=now)
    if record is None:
        return fail(f"no API key has id {key_id!r} (`aptix keys list` shows them)", code=1)
    if args.json:
        out(json.dumps(_key_json(record)))
    else:
        when = _stamp(record.revoked_at)
        already = "" if record.revoked_at == now else " (already)"
        out(f"revoked {record.key_id} of {record.org_id} at {when}{already}")
    return 0


_KeyCommand = Callable[["ApiKeyRepository", argparse.Namespace, datetime], int]


def _with_keys(command: _KeyCommand) -> Callable[[argparse.Namespace], int]:
    """Run ``command`` on the repository of ``APTIX_DATABASE_URL``, its troubles as messages and exit codes."""

    def run(args: argparse.Namespace) -> int:
        from sqlalchemy.exc import OperationalError, ProgrammingError

        from aptix_cli.process_commands import warn_unknown_variables
        from shared.db import session_factory
        from shared.db.api_keys import ApiKeyRepository
        from shared.db.engine import create_db_engine
        from shared.redaction import without_password
        from shared.settings import get_settings

        warn_unknown_variables("keys")
        url = get_settings().database_url
        engine = create_db_engine(url, pool_size=1, max_overflow=0, application_name="aptix-keys")
        try:
            return command(ApiKeyRepository(session_factory(engine)), args, datetime.now(UTC))
        except UsageError as exc:
            return fail(str(exc), code=2)
        except OperationalError as exc:
            reason = str(exc.orig).strip().splitlines()[0][:200] if exc.orig else type(exc).__name__
            if "no such table" in reason:
                return fail(f"the database at {without_password(url)} has no API keys table: run `aptix db upgrade`",
                            code=1)  # fmt: skip
            return fail(f"the database at {without_password(url)} did not answer: {reason}", code=1)
        except ProgrammingError:
            return fail(f"the database at {without_password(url)} has no API keys table: run `aptix db upgrade`",
                        code=1)  # fmt: skip
        finally:
            engine.dispose()

    return run


def _key_json(record: ApiKeyRecord) -> dict[str, Any]:
    return {
        "id": record.key_id, "org": record.org_id, "name": record.name, "prefix": record.prefix,
        "created_at": _stamp(record.created_at), "last_used_at": _stamp(record.last_used_at),
        "expires_at": _stamp(record.expires_at), "revoked_at": _stamp(record.revoked_at),
    }  # fmt: skip


def _stamp(moment: datetime | None) -> str | None:
    """``2027-01-01T00:00:00Z``: UTC, to the second."""
    return None if moment is None else moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
