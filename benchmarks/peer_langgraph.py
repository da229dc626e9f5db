"""A durable peer of Aptix's server-tool turn: a LangGraph graph checkpointed by ``AsyncPostgresSaver``.

The graph is the agent loop, ``model -> tool -> model``: the ``model`` node calls the model and
routes to ``tool`` when the answer is a function call, the ``tool`` node runs it and goes back to
``model``, which answers. Each turn is a thread of its own; the checkpointer (PostgreSQL,
``--database-url``, through a connection pool) saves the state after every step, before the next
runs (``durability="sync"``), so a crashed turn resumes from its last checkpoint. The turns run in
one process on asyncio, at most ``--concurrency`` at a time. ``aptix bench --peers`` runs it in a
virtualenv of its own (``langgraph``, ``langgraph-checkpoint-postgres``, ``httpx``) and drives it by
the protocol of ``peer_turn``::

    python benchmarks/peer_langgraph.py --model-url http://127.0.0.1:8900 \\
        --database-url postgresql://postgres@127.0.0.1:5432/peer_langgraph --turns 300 \\
        --directive '[[call:get_current_time {}]]'
"""

from __future__ import annotations

import asyncio
import operator
import time
import uuid
from typing import Annotated, Any, Literal, TypedDict

import httpx
import peer_turn
from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
from langgraph.graph import END, START, StateGraph
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool


class TurnState(TypedDict):
    """A turn's checkpointed state: the Responses API input items so far, and the answer."""

    items: Annotated[list[dict[str, Any]], operator.add]
    answer: str


def main() -> None:
    """Run the peer."""
    asyncio.run(_main(peer_turn.arguments(__doc__.splitlines()[0])))


async def _main(args: Any) -> None:
    client = httpx.AsyncClient(base_url=args.model_url, limits=peer_turn.limits(args.concurrency), timeout=60.0)
    pool = AsyncConnectionPool(
        args.database_url,
        min_size=peer_turn.POOL_SIZE,
        max_size=peer_turn.POOL_SIZE,
        open=False,
        kwargs={"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row},
    )
    await pool.open(wait=True)
    try:
        checkpointer = AsyncPostgresSaver(pool)  # type: ignore[arg-type]
        await checkpointer.setup()
        graph = _graph(client).compile(checkpointer=checkpointer)
        limit = asyncio.Semaphore(args.concurrency)

        async def one(index: int) -> bool:
            async with limit:
                return await _turn(graph, peer_turn.user_text(index, args.directive))

        await asyncio.gather(*(one(index) for index in range(args.warm_up)))
        peer_turn.wait_for_go()
        started = time.perf_counter()
        first = args.warm_up
        done = await asyncio.gather(*(one(index) for index in range(first, first + args.turns)))
        peer_turn.report_result(turns=args.turns, completed=sum(done), started=started)
        peer_turn.wait_for_end()
    finally:
        await pool.close()
        await client.aclose()


def _graph(client: httpx.AsyncClient) -> StateGraph[TurnState]:
    async def model(state: TurnState) -> dict[str, Any]:
        response = await peer_turn.post_async(client, peer_turn.request(state["items"]))
        try:
            return {"items": [peer_turn.function_call(response)]}
        except ValueError:
            return {"answer": peer_turn.answer_text(response)}

    async def tool(state: TurnState) -> dict[str, Any]:
        call = state["items"][-1]
        if call["name"] != "get_current_time":
            raise ValueError(f"unknown tool {call['name']!r}")
        return {"items": [peer_turn.tool_output(call, peer_turn.get_current_time())]}

    def route(state: TurnState) -> Literal["tool", "__end__"]:
        return "tool" if state["items"][-1].get("type") == "function_call" else END

    graph = StateGraph(TurnState)
    graph.add_node("model", model)
    graph.add_node("tool", tool)
    graph.add_edge(START, "model")
    graph.add_conditional_edges("model", route)
    graph.add_edge("tool", "model")
    return graph


async def _turn(graph: Any, text: str) -> bool:
    """One turn on a thread of its own; whether it answered."""
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    try:
        final = await graph.ainvoke({"items": [peer_turn.user(text)], "answer": ""}, config, durability="sync")
    except (httpx.HTTPError, ValueError):
        return False
    return bool(final.get("answer"))


if __name__ == "__main__":
    main()
