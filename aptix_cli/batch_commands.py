"""``aptix batch submit|status|wait|results``: many turns at once, and picking a batch up again.

``submit`` sends a JSON Lines file of TurnRequests; ``--wait`` follows it with a progress bar.
A batch goes on at the gateway whatever the client does, so ``status``, ``wait`` (the same progress
bar) and ``results`` take a batch id: after Ctrl-C in ``submit --wait``, or from another shell.
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


def _submit(api: ApiClient, args: argparse.Namespace) -> int:
    from aptix_cli.progress import ProgressBar

    if args.out and not args.wait:
        raise UsageError("--out needs --wait (the results are written once every turn has finished)")
    requests = _read_batch(args.file)
    bar = ProgressBar(sys.stderr, total=len(requests))  # its clock starts before the submission
    batch = api.create_batch(requests)
    out(f"batch {batch['batch_id']}: {batch.get('total', len(requests))} turns")
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


def _read_batch(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except OSError as exc:
        raise UsageError(f"{path}: {exc.strerror or exc}") from exc
    requests = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path} line {number}: not valid JSON: {exc.msg}") from exc
        if not isinstance(request, dict):
            raise UsageError(f"{path} line {number}: expected a JSON object (a TurnRequest)")
        requests.append(request)
    if not requests:
        raise UsageError(f"{path}: no requests in the file")
    return requests
