"""A durable peer of Aptix's server-tool turn: a DBOS Transact workflow of three checkpointed steps.

Each turn is one workflow, ``model call -> server tool -> model call``, each a ``@DBOS.step`` whose
outcome DBOS checkpoints in its system database (PostgreSQL, ``--database-url``) before the next
runs, so a crashed turn resumes from its last finished step. The turns run in one process, at most
``--concurrency`` at a time (a thread each, DBOS's sync API). ``aptix bench --peers`` runs it in a
virtualenv of its own (``dbos``, ``httpx``) and drives it by the protocol of ``peer_turn``::

    python benchmarks/peer_dbos.py --model-url http://127.0.0.1:8900 \\
        --database-url postgresql://postgres@127.0.0.1:5432/peer_dbos --turns 300 \\
        --directive '[[call:get_current_time {}]]'
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import peer_turn
from dbos import DBOS, DBOSConfig


def main() -> None:
    """Launch DBOS on the given database, warm up, then run the measured turns."""
    args = peer_turn.arguments(__doc__.splitlines()[0])
    config: DBOSConfig = {
        "name": "aptix-bench-peer",
        "system_database_url": args.database_url,
        "sys_db_pool_size": peer_turn.POOL_SIZE,
        "log_level": "WARNING",
    }
    DBOS(config=config)
    client = httpx.Client(base_url=args.model_url, limits=peer_turn.limits(args.concurrency), timeout=60.0)
    _Model.client = client
    DBOS.launch()
    try:
        with ThreadPoolExecutor(max_workers=args.concurrency) as pool:
            _run(pool, range(args.warm_up), args.directive)
            peer_turn.wait_for_go()
            started = time.perf_counter()
            first = args.warm_up
            completed = _run(pool, range(first, first + args.turns), args.directive)
            peer_turn.report_result(turns=args.turns, completed=completed, started=started)
        peer_turn.wait_for_end()
    finally:
        DBOS.destroy()
        client.close()


class _Model:
    """The process's HTTP client to the model, set once in :func:`main` (steps take only their inputs)."""

    client: httpx.Client


@DBOS.step()
def call_model(request: dict[str, Any]) -> dict[str, Any]:
    """One Responses API call."""
    return peer_turn.post(_Model.client, request)


@DBOS.step()
def run_tool(name: str) -> str:
    """The server tool the model asked for."""
    if name != "get_current_time":
        raise ValueError(f"unknown tool {name!r}")
    return peer_turn.get_current_time()


@DBOS.workflow()
def turn(text: str) -> str:
    """One server-tool turn: the model asks for the tool, the tool runs, the model answers."""
    asked = peer_turn.user(text)
    call = peer_turn.function_call(call_model(peer_turn.request([asked])))
    output = peer_turn.tool_output(call, run_tool(call["name"]))
    return peer_turn.answer_text(call_model(peer_turn.request([asked, call, output])))


def _run(pool: ThreadPoolExecutor, indexes: range, directive: str) -> int:
    """Run one turn per index on the pool; how many answered."""

    def one(index: int) -> bool:
        try:
            return bool(turn(peer_turn.user_text(index, directive)))
        except (httpx.HTTPError, ValueError):
            return False

    return sum(pool.map(one, indexes))


if __name__ == "__main__":
    main()
