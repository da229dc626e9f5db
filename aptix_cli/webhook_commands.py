"""``aptix webhooks secret add|list|retire`` and ``aptix webhooks enable``: webhook signing secrets kept in
the database, and disabled endpoints enabled again.

Rotating an organisation's secret without losing a delivery: ``secret add`` (the new one signs every
delivery alongside the old one within seconds: ``shared.ttl_cache``), move the receiver to the new one,
then ``secret retire`` the old one. ``APTIX_WEBHOOK_SECRETS`` keeps working beside them. ``enable`` lets
an endpoint that answered 410 Gone get events again. docs/tenancy.md, "Webhook secrets".
"""

from __future__ import annotations

import argparse
import base64
import os
from datetime import UTC, datetime
from typing import Any

from aptix_cli.command_support import UsageError, out
from aptix_cli.org_commands import check_org
from aptix_cli.store_commands import NotFound, StoreContext, json_flag, print_json, store_command

__all__ = ["add_webhook_commands", "new_secret"]


def add_webhook_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``webhooks secret add|list|retire`` and ``webhooks enable`` on ``aptix``'s subparsers."""
    webhooks = commands.add_parser("webhooks", help="webhook signing secrets and endpoints (in the database)")
    webhook_commands = webhooks.add_subparsers(dest="webhooks_command", required=True)
    flags = json_flag()

    secret = webhook_commands.add_parser("secret", help="an organisation's signing secrets")
    secret_commands = secret.add_subparsers(dest="secret_command", required=True)
    add = secret_commands.add_parser(
        "add", parents=[flags], help="add a signing secret (printed once); it signs beside the others"
    )
    add.add_argument("--org", required=True, metavar="ORG")
    add.add_argument("--secret", metavar="WHSEC", help="whsec_<base64> of 16 bytes or more (default: a new one)")
    add.set_defaults(run=store_command(_add))
    listing = secret_commands.add_parser("list", parents=[flags], help="list the secrets (never the secret itself)")
    listing.add_argument("--org", metavar="ORG")
    listing.set_defaults(run=store_command(_list))
    retire = secret_commands.add_parser("retire", parents=[flags], help="stop a secret signing")
    retire.add_argument("secret_id", metavar="ID")
    retire.set_defaults(run=store_command(_retire))

    enable = webhook_commands.add_parser(
        "enable", parents=[flags], help="send to an endpoint disabled after a 410 Gone again"
    )
    enable.add_argument("--org", required=True, metavar="ORG")
    enable.add_argument("url", metavar="URL")
    enable.set_defaults(run=store_command(_enable))


def new_secret() -> str:
    """A new signing secret: ``whsec_`` and the base64 of 32 random bytes."""
    return "whsec_" + base64.b64encode(os.urandom(32)).decode("ascii")


def _add(context: StoreContext, args: argparse.Namespace) -> int:
    from shared.db.webhook_secrets import WebhookSecretRepository

    org_id = check_org(args.org)
    secret = args.secret or new_secret()
    try:
        record = WebhookSecretRepository(context.sessions()).add(org_id, secret, now=datetime.now(UTC))
    except ValueError as exc:
        raise UsageError(f"--secret: {str(exc).split(': ', 1)[-1]}") from None
    if args.json:
        print_json({**_view(record), "secret": secret})
    else:
        out(f"{record.secret_id} added for {org_id}; it signs every delivery within seconds, beside the others:")
        out(secret)
    return 0


def _list(context: StoreContext, args: argparse.Namespace) -> int:
    from shared.db.webhook_secrets import WebhookSecretRepository

    org_id = None if args.org is None else check_org(args.org)
    records = WebhookSecretRepository(context.sessions()).listing(org_id)
    if args.json:
        print_json([_view(record) for record in records])
        return 0
    if not records:
        out("no webhook secret in the database" + (f" for {org_id}" if org_id else ""))
    for record in records:
        state = "active" if record.retired_at is None else f"retired {record.retired_at.isoformat()}"
        out(f"{record.secret_id}  {record.org_id}  {record.hint}  created {record.created_at.isoformat()}  {state}")
    return 0


def _retire(context: StoreContext, args: argparse.Namespace) -> int:
    from shared.db.webhook_secrets import WebhookSecretRepository

    repository = WebhookSecretRepository(context.sessions())
    record = repository.retire(args.secret_id, now=datetime.now(UTC))
    if record is None:
        raise NotFound(f"no webhook secret {args.secret_id!r} (aptix webhooks secret list shows them)")
    if args.json:
        print_json(_view(record))
    else:
        out(f"{record.secret_id} of {record.org_id} retired at {record.retired_at}; it signs nothing from now on")
    still = [other for other in repository.listing(record.org_id) if other.retired_at is None]
    if not still and not args.json:
        out(f"note: {record.org_id} has no active secret in the database now (only APTIX_WEBHOOK_SECRETS', if any)")
    return 0


def _enable(context: StoreContext, args: argparse.Namespace) -> int:
    from shared.db.webhook_endpoints import WebhookEndpointRepository

    org_id = check_org(args.org)
    if not WebhookEndpointRepository(context.sessions()).enable(org_id, args.url):
        raise NotFound(f"{args.url} is not a disabled endpoint of {org_id} (GET /v1/webhook-endpoints lists them)")
    if args.json:
        print_json({"org_id": org_id, "url": args.url, "state": "enabled"})
    else:
        out(f"{args.url} of {org_id} enabled: events recorded from now on are sent to it")
    return 0


def _view(record: Any) -> dict[str, Any]:
    return {
        "id": record.secret_id,
        "org_id": record.org_id,
        "hint": record.hint,
        "created_at": record.created_at.isoformat(),
        "retired_at": record.retired_at.isoformat() if record.retired_at else None,
    }
