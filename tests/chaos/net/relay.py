"""A TCP relay that can add latency: ``python -m tests.chaos.net.relay [--delay-ms D] LISTEN=TARGET ...``.

The host side of a network namespace's link: each ``HOST:PORT=HOST:PORT`` pair listens on the first
address and relays every connection to the second (Redis and PostgreSQL listen on 127.0.0.1 only, so
a worker host in a namespace reaches them through here). With ``--delay-ms`` every chunk read is
written to the other side that much later, in order, in each direction: a link whose round trips are
``2 x D`` ms slower (this kernel has no ``netem``). Packet loss is not the relay's: the harness drops
real packets with ``iptables -m statistic`` on the link (``tests.chaos.net.hosts``).

It prints ``relay ready`` once every listener is bound, and runs until it is killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import sys
import time
from collections.abc import Sequence

__all__ = ["main"]

_CHUNK = 65536


def main(argv: Sequence[str] | None = None) -> int:
    """Parse the pairs and relay until killed."""
    parser = argparse.ArgumentParser(prog="python -m tests.chaos.net.relay")
    parser.add_argument("--delay-ms", type=float, default=0.0, help="added to each direction of every connection")
    parser.add_argument("pairs", nargs="+", metavar="LISTEN_HOST:PORT=TARGET_HOST:PORT")
    args = parser.parse_args(argv)
    pairs = [_pair(text) for text in args.pairs]
    asyncio.run(_serve(pairs, delay=args.delay_ms / 1000.0))
    return 0


def _pair(text: str) -> tuple[tuple[str, int], tuple[str, int]]:
    listen, _, target = text.partition("=")
    return _address(listen), _address(target)


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def _serve(pairs: list[tuple[tuple[str, int], tuple[str, int]]], *, delay: float) -> None:
    servers = [
        await asyncio.start_server(functools.partial(_relay, target=target, delay=delay), host, port)
        for (host, port), target in pairs
    ]
    sys.stdout.write(f"relay ready: {len(servers)} listeners, {delay * 1000:.0f} ms each way\n")
    sys.stdout.flush()
    await asyncio.Event().wait()


async def _relay(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, target: tuple[str, int], delay: float
) -> None:
    try:
        if delay:
            await asyncio.sleep(delay)  # the SYN's way
        up_reader, up_writer = await asyncio.open_connection(*target)
    except OSError:
        writer.close()
        return
    writers = (writer, up_writer)
    await asyncio.gather(_pump(reader, up_writer, delay, writers), _pump(up_reader, writer, delay, writers))
    for each in writers:
        each.close()


async def _pump(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    delay: float,
    writers: tuple[asyncio.StreamWriter, ...],
) -> None:
    """Copy ``reader`` to ``writer``, each chunk ``delay`` seconds after it was read, in order.

    An end of stream is passed on (a half close); an error closes both sides (``writers``).
    """
    queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def deliver() -> None:
        while True:
            due, data = await queue.get()
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            if not data:
                with contextlib.suppress(OSError):
                    writer.write_eof()
                return
            writer.write(data)
            await writer.drain()

    deliverer = asyncio.create_task(deliver())
    try:
        while True:
            data = await reader.read(_CHUNK)
            queue.put_nowait((time.monotonic() + delay, data))
            if not data:
                break
        await deliverer
    except OSError:
        for each in writers:
            each.close()
    finally:
        deliverer.cancel()


if __name__ == "__main__":
    raise SystemExit(main())
