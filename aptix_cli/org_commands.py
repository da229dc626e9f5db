"""``aptix orgs set|show``: each organisation's own limits, in the database (``org_settings``).

``set`` changes only the limits it is given (``none`` takes one back to the default: the
``APTIX_ORG_MAX_IN_FLIGHT`` cap, no rpm limit, no daily budget); every gateway and admission scheduler
applies it within 5 s (``shared.ttl_cache``). ``show`` prints an organisation's limits and what its turns
used today (UTC), or every organisation that has limits of its own. docs/tenancy.md says what each does.
"""

from __future__ import annotations

import argparse
import re
from datetime import UTC, datetime
from typing import Any

from aptix_cli.command_support import UsageError, out
from aptix_cli.store_commands import StoreContext, json_flag, print_json, store_command

__all__ = ["ORG_PATTERN", "add_org_commands", "check_org", "limit_value"]

ORG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._@-]{0,127}$")
"""An organisation id: what ``APTIX_API_KEYS`` can carry (no ``:`` nor ``,``), at most 128 characters."""
_MAX = {"max_in_flight": 1_000_000, "rpm": 10_000_000, "tokens_per_day": 10**15}


def add_org_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``orgs set`` and ``orgs show`` on ``aptix``'s subparsers."""
    orgs = commands.add_parser("orgs", help="organisations' own limits (in the database)")
    org_commands = orgs.add_subparsers(dest="orgs_command", required=True)
    flags = json_flag()

    set_ = org_commands.add_parser(
        "set", parents=[flags], help="set an organisation's limits ('none': back to the default)"
    )
    set_.add_argument("org", metavar="ORG")
    set_.add_argument(
        "--max-in-flight", metavar="N", help="its batch turns in flight at once (none: APTIX_ORG_MAX_IN_FLIGHT)"
    )
    set_.add_argument("--rpm", metavar="N", help="requests per minute, every gateway together (none: no limit)")
    set_.add_argument(
        "--tokens-per-day", metavar="N", help="tokens its turns created in one UTC day may use (none: no limit)"
    )
    set_.set_defaults(run=store_command(_set))

    show = org_commands.add_parser(
        "show", parents=[flags], help="an organisation's limits (default: every one that has some)"
    )
    show.add_argument("org", metavar="ORG", nargs="?")
    show.set_defaults(run=store_command(_show))


def check_org(org_id: str) -> str:
    """``org_id`` if it is an organisation id an API key can carry.

    Raises:
        UsageError: it is not.
    """
    if not ORG_PATTERN.match(org_id):
        raise UsageError(
            f"{org_id!r} is not an organisation id: 1 to 128 letters, digits, '.', '_', '@' or '-', "
            "starting with a letter or digit"
        )
    return org_id


def limit_value(flag: str, raw: str, *, name: str) -> int | None:
    """A limit given on the command line: a positive whole number, or ``none`` (None).

    Raises:
        UsageError: anything else.
    """
    if raw.strip().lower() in ("none", "default"):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{flag} must be a positive whole number or 'none', not {raw!r}") from None
    if not 1 <= value <= _MAX[name]:
        raise UsageError(f"{flag} must be between 1 and {_MAX[name]} (or 'none'), not {value}")
    return value


def _set(context: StoreContext, args: argparse.Namespace) -> int:
    from shared.db.org_settings import OrgSettingsRepository

    org_id = check_org(args.org)
    changes: dict[str, int | None] = {}
    for name, flag in (("max_in_flight", "--max-in-flight"), ("rpm", "--rpm"), ("tokens_per_day", "--tokens-per-day")):
        raw = getattr(args, name)
        if raw is not None:
            changes[name] = limit_value(flag, raw, name=name)
    if not changes:
        raise UsageError("give at least one of --max-in-flight, --rpm, --tokens-per-day")
    limits = OrgSettingsRepository(context.sessions()).set(org_id, now=datetime.now(UTC), **changes)
    _print(context, [_view(context, limits)], as_json=args.json, one=True)
    return 0


def _show(context: StoreContext, args: argparse.Namespace) -> int:
    from shared.db.org_settings import OrgSettingsRepository

    repository = OrgSettingsRepository(context.sessions())
    rows = [repository.get(check_org(args.org))] if args.org is not None else list(repository.all().values())
    _print(context, [_view(context, row) for row in sorted(rows, key=lambda row: row.org_id)], as_json=args.json,
           one=args.org is not None)  # fmt: skip
    return 0


def _view(context: StoreContext, limits: Any) -> dict[str, Any]:
    from shared.db.usage import UsageRepository

    today = datetime.now(UTC).date()
    (used,) = UsageRepository(context.sessions()).daily(limits.org_id, first=today, last=today)
    return {
        "org_id": limits.org_id,
        "max_in_flight": limits.max_in_flight,
        "max_in_flight_default": context.settings.org_max_in_flight,
        "rpm": limits.rpm,
        "tokens_per_day": limits.tokens_per_day,
        "updated_at": limits.updated_at.isoformat() if limits.updated_at else None,
        "today": {"date": today.isoformat(), "turns": used.turns, "total_tokens": used.total_tokens},
    }


def _print(context: StoreContext, views: list[dict[str, Any]], *, as_json: bool, one: bool) -> None:
    if as_json:
        print_json(views[0] if one else views)
        return
    if not views:
        out("no organisation has limits of its own (aptix orgs set ORG ...)")
    for view in views:
        cap = view["max_in_flight"]
        cap_text = f"{cap}" if cap is not None else f"{view['max_in_flight_default']} (APTIX_ORG_MAX_IN_FLIGHT)"
        rpm = view["rpm"] if view["rpm"] is not None else "none"
        budget = view["tokens_per_day"] if view["tokens_per_day"] is not None else "none"
        today = view["today"]
        out(f"{view['org_id']}: max-in-flight {cap_text}, rpm {rpm}, tokens-per-day {budget}; "
            f"today ({today['date']} UTC): {today['turns']} turns, {today['total_tokens']} tokens")  # fmt: skip
