"""What every ``aptix`` client command shares: its connection flags, how it runs, how it writes.

A command is a function of an :class:`~aptix_cli.client.ApiClient` and the parsed arguments that
returns an exit code. :func:`runner` builds the client and turns every expected trouble into a
message and an exit code: 0 success; 1 an HTTP error (``error <status> <code>: <message>`` on
stderr), an unreachable gateway, or a turn that failed or was cancelled; 2 a usage error; 141 when
the reader of standard output went away (``aptix turn ... | head -1``), quietly, as a command killed
by SIGPIPE would.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aptix_cli.client import ApiClient

__all__ = ["CLOSED_PIPE_EXIT", "DEFAULT_URL", "Command", "UsageError", "connection_flags", "fail", "out", "runner"]

DEFAULT_URL = "http://127.0.0.1:8000"
CLOSED_PIPE_EXIT = 141
"""The exit code of a command whose standard output was closed under it (128 + SIGPIPE)."""

Command = Callable[["ApiClient", argparse.Namespace], int]


class UsageError(Exception):
    """Bad input from the user: printed as ``error: <message>``, exit code 2."""


def connection_flags() -> argparse.ArgumentParser:
    """A parent parser with ``--url`` and ``--key`` (defaults from ``$APTIX_URL`` and ``$APTIX_KEY``)."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--url", default=os.environ.get("APTIX_URL") or DEFAULT_URL,
                        help="the gateway (default: $APTIX_URL, else %(default)s)")  # fmt: skip
    common.add_argument("--key", default=os.environ.get("APTIX_KEY"), help="API key (default: $APTIX_KEY)")
    return common


def runner(command: Command) -> Callable[[argparse.Namespace], int]:
    """Wrap a command: build the client, turn errors into messages and exit codes."""

    def run(args: argparse.Namespace) -> int:
        from aptix_cli.client import ApiClient, GatewayError, GatewayUnreachable

        if not args.key:
            return fail("no API key: pass --key KEY or set APTIX_KEY", code=2)
        try:
            with ApiClient(args.url, key=args.key) as api:
                code = command(api, args)
            sys.stdout.flush()  # inside the try: a closed pipe shows up here, not at interpreter exit
            return code
        except BrokenPipeError:
            _drop_stdout()
            return CLOSED_PIPE_EXIT
        except UsageError as exc:
            return fail(str(exc), code=2)
        except GatewayError as exc:
            sys.stderr.write(f"error {exc.status} {exc.code}: {exc.message}\n")
            return 1
        except GatewayUnreachable as exc:
            return fail(str(exc), code=1)

    return run


def out(line: str) -> None:
    """Write one line to standard output."""
    sys.stdout.write(line + "\n")


def fail(message: str, *, code: int) -> int:
    """Write ``error: <message>`` to standard error and return ``code``."""
    sys.stderr.write(f"error: {message}\n")
    return code


def _drop_stdout() -> None:
    # What is still buffered for the closed pipe would fail again when Python flushes at exit
    # ("Exception ignored ... BrokenPipeError"): point the descriptor at /dev/null instead.
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    finally:
        os.close(devnull)
