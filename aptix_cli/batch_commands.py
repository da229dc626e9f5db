"""``aptix batch submit|status|wait|results|cancel|list``: many turns at once, and picking a batch up again.

``submit`` uploads a JSON Lines file of TurnRequests as it is (``Content-Type: application/jsonl``,
streamed from disk, so a file of 100,000 requests never sits in memory); ``--wait`` follows it with a
progress bar, and ``--idempotency-key`` makes a retried submit find the batch the first one created. A
batch goes on at the gateway whatever the client does, so ``status``, ``wait`` (the same progress
bar), ``results`` and ``cancel`` take a batch id: after Ctrl-C in ``submit --wait``, or from another
shell; ``list`` shows the organisation's batches, newest first.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aptix_cli.command_support import UsageError, out, runner

if TYPE_CHECKING:
    from aptix_cli.client import ApiClient
    from aptix_cli.progress import ProgressBar

__all__ = ["add_batch_commands"]


def add_batch_commands(
    commands: argparse._SubParsersAction[argparse.ArgumentParser], common: argparse.ArgumentParser
) -> None:
    """Register ``batch`` and its subcommands on ``aptix``'s subparsers (``common``: connection flags)."""
    batch = commands.add_parser("batch", help="many turns at once")
    batch_commands = batch.add_subparsers(dest="batch_command", required=True)
    following = argparse.ArgumentParser(add_help=False)
    following.add_argument("--out", metavar="FILE", type=Path, help="write the resulting Turns here (JSON Lines)")
    following.add_argument("--poll", type=float, default=1.0, metavar="SECONDS", help="seconds between polls")

    submit = batch_commands.add_parser(
        "submit", parents=[common, following], help="submit a JSON Lines file of TurnRequests"
    )
    submit.add_argument("file", metavar="FILE.jsonl", type=Path)
    submit.add_argument("--wait", action="store_true", help="follow progress until every turn has finished")
    submit.add_argument(
        "--idempotency-key", metavar="KEY", help="a retried submit with the same key and file finds the same batch"
    )
    submit.set_defaults(run=runner(_submit))

    status = batch_commands.add_parser("status", parents=[common], help="print a batch's counts by status")
    status.add_argument("batch_id", metavar="BATCH_ID")
    status.add_argument("--json", action="store_true", help="print the raw Batch JSON")
    status.set_defaults(run=runner(_status))

    wait = batch_commands.add_parser(
        "wait", parents=[common, following], help="follow a batch with a progress bar until every turn has finished"
    )
    wait.add_argument("batch_id", metavar="BATCH_ID")
    wait.add_argument("--json", action="store_true", help="print the final Batch JSON instead of the summary")
    wait.set_defaults(run=runner(_wait))

    results = batch_commands.add_parser(
        "results", parents=[common], help="print a batch's Turns, one JSON object per line"
    )
    results.add_argument("batch_id", metavar="BATCH_ID")
    results.add_argument("--out", metavar="FILE", type=Path, help="write them to FILE instead")
    results.set_defaults(run=runner(_results))

    cancel = batch_commands.add_parser("cancel", parents=[common], help="cancel a batch's turns that have not started")
    cancel.add_argument("batch_id", metavar="BATCH_ID")
    cancel.add_argument(
        "--running",
        choices=("finish", "cancel"),
        default="finish",
        help="what happens to turns already running: finish on their own (default) or be cancelled too",
    )
    cancel.add_argument("--json", action="store_true", help="print the raw Batch JSON")
    cancel.set_defaults(run=runner(_cancel))

    listing = batch_commands.add_parser("list", parents=[common], help="list the organisation's batches, newest first")
    listing.add_argument("--limit", type=int, default=20, metavar="N", help="at most N batches (1 to 100)")
    listing.add_argument("--after", metavar="BATCH_ID", help="the batches older than this one (the next page)")
    listing.add_argument("--json", action="store_true", help="print the raw list JSON")
    listing.set_defaults(run=runner(_list))


def _submit(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.progress import ProgressBar

    if args.out and not args.wait:
        raise UsageError("--out needs --wait (the results are written once every turn has finished)")
    count = _check_batch(args.file)
    bar = ProgressBar(sys.stderr, total=count)  # its clock starts before the submission
    batch = api.upload_batch(args.file, idempotency_key=args.idempotency_key)
    out(f"batch {batch['batch_id']}: {batch.get('total', count)} turns")
    if not args.wait:
        return 0
    return _follow(api, batch, args, bar=bar, as_json=False)


def _status(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.batch_progress import in_flight
    from aptix_cli.rendering import batch_counts_line

    batch = api.get_batch(args.batch_id)
    if args.json:
        out(json.dumps(batch, indent=2))
        return 0
    counts: dict[str, int] = batch.get("counts", {})
    out(f"batch {batch.get('batch_id')}: {batch.get('total')} turns, created {batch.get('created_at')}")
    out(batch_counts_line(counts))
    waiting = in_flight(counts)
    out(f"{waiting} still in flight" if waiting else "nothing in flight")
    return 0


def _cancel(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.rendering import batch_counts_line

    batch = api.cancel_batch(args.batch_id, running=args.running)
    if args.json:
        out(json.dumps(batch, indent=2))
        return 0
    out(f"batch {batch.get('batch_id')}: {batch.get('status')}")
    out(batch_counts_line(batch.get("counts", {})))
    return 0


def _list(api: ApiClient, args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 100:
        raise UsageError("--limit takes 1 to 100")
    page = api.list_batches(limit=args.limit, after=args.after)
    if args.json:
        out(json.dumps(page, indent=2))
        return 0
    for batch in page.get("data", []):
        counts: dict[str, int] = batch.get("counts", {})
        done = sum(counts.get(status, 0) for status in ("completed", "failed", "cancelled"))
        status = str(batch.get("status"))
        out(f"{batch.get('batch_id')}  {status:<11}  {done}/{batch.get('total')} ended  {batch.get('created_at')}")
    if page.get("has_more"):
        out(f"more: aptix batch list --after {page.get('last_id')}")
    return 0


def _wait(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.progress import ProgressBar

    batch = api.get_batch(args.batch_id)
    bar = ProgressBar(sys.stderr, total=int(batch.get("total", 0)))
    return _follow(api, batch, args, bar=bar, as_json=args.json)


def _results(api: ApiClient, args: argparse.Namespace) -> int:
    turns = api.batch_results(args.batch_id)
    lines = "".join(json.dumps(turn) + "\n" for turn in turns)
    if args.out:
        args.out.write_text(lines)
        out(f"wrote {len(turns)} turns to {args.out}")
    else:
        sys.stdout.write(lines)
    return 0


def _follow(api: ApiClient, batch: dict[str, Any], args: argparse.Namespace, *, bar: ProgressBar, as_json: bool) -> int:
    """Follow ``batch`` until nothing is in flight, then print failures, write ``--out`` and sum up."""
    from aptix_cli.batch_progress import follow_batch, out_of_flight
    from aptix_cli.client import ClientError
    from aptix_cli.rendering import batch_summary, failed_turn_line
    from shared.models.turn import TurnStatus

    batch_id = str(batch["batch_id"])
    done_before = out_of_flight(batch)
    try:
        batch = follow_batch(api, batch, interval=max(args.poll, 0.05), bar=bar)
    except KeyboardInterrupt:
        bar.interrupt()
        sys.stderr.write(f"interrupted; batch {batch_id} goes on at the gateway (aptix batch wait {batch_id})\n")
        return 130
    except ClientError:
        bar.interrupt()
        raise
    counts: dict[str, int] = batch.get("counts", {})
    bar.finish(out_of_flight(batch), counts)
    elapsed = bar.elapsed
    if args.out or counts.get("failed") or counts.get("cancelled"):
        turns = api.batch_results(batch_id)
        if args.out:
            args.out.write_text("".join(json.dumps(turn) + "\n" for turn in turns))
            out(f"wrote {len(turns)} turns to {args.out}")
        if not as_json:
            for turn in turns:
                if turn.get("status") in (TurnStatus.FAILED, TurnStatus.CANCELLED):
                    out(failed_turn_line(turn))
    if as_json:
        out(json.dumps(batch, indent=2))
    else:
        # The rate counts the turns that left flight while this command watched.
        out(batch_summary(batch_id, counts, done=out_of_flight(batch) - done_before, elapsed=elapsed))
    return 0


def _check_batch(path: Path) -> int:
    """How many requests the file holds, each line checked to be a JSON object; read line by line, never whole.

    The gateway checks each request fully (and names the line of the first it refuses); this only
    catches a file that is not JSON Lines before it is sent.
    """
    count = 0
    try:
        with path.open("rb") as lines:
            for number, line in enumerate(lines, start=1):
                if not line.strip():
                    continue
                try:
                    request = json.loads(line)
                except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                    raise UsageError(f"{path} line {number}: not valid JSON: {exc}") from exc
                if not isinstance(request, dict):
                    raise UsageError(f"{path} line {number}: expected a JSON object (a TurnRequest)")
                count += 1
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    if not count:
        raise UsageError(f"{path}: no requests in the file")
    return count
