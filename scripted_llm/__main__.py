"""Command line: ``python -m scripted_llm --host 127.0.0.1 --port 8900 --latency-ms 0``."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import uvicorn

from scripted_llm.server import create_app

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    """Run the scripted Responses API server in the foreground until interrupted.

    Args:
        argv: command-line arguments; ``sys.argv[1:]`` when None.
    """
    parser = argparse.ArgumentParser(prog="python -m scripted_llm", description="Scripted Responses API server.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--latency-ms", type=float, default=0.0, help="latency added to every answer")
    parser.add_argument("--journal-size", type=int, default=2000, help="request bodies kept in the journal")
    args = parser.parse_args(argv)
    app = create_app(latency_ms=args.latency_ms, journal_size=args.journal_size)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
