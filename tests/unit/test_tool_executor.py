"""The bounded tool executor: timeouts, and handlers that never return cannot pile up threads."""

from __future__ import annotations

import threading

from shared.result import ErrorCode
from tests.support.waiting import wait_for
from workers.tools.executor import ToolContext, ToolExecutor
from workers.tools.registry import ServerTool

_CONTEXT = ToolContext(session_id="s", turn_id="t", org_id="o", user_id="u", mode="general", call_id="c",
                       idempotency_key="t:c")  # fmt: skip


def _tool(handler: object, timeout: float = 0.2) -> ServerTool:
    return ServerTool("t", "", {"type": "object", "properties": {}}, handler, timeout)  # type: ignore[arg-type]


def test_handler_that_overruns_its_timeout_fails_the_call_and_is_counted_until_it_returns() -> None:
    release = threading.Event()
    executor = ToolExecutor(2)
    result = executor.run(_tool(lambda: release.wait(5) and "late"), {}, _CONTEXT)
    assert (
        result.error is not None and result.error.code is ErrorCode.TOOL_FAILED and "timed out" in result.error.message
    )
    assert executor.overrunning == 1
    release.set()
    wait_for(lambda: executor.overrunning == 0, what="the overrunning handler to return", seconds=1, interval=0.01)


def test_calls_fail_instead_of_starting_threads_when_every_slot_is_held_by_an_overrun() -> None:
    release = threading.Event()
    before = threading.active_count()  # other tests of this process may have threads of their own
    executor = ToolExecutor(2)
    for _ in range(2):
        executor.run(_tool(lambda: release.wait(5)), {}, _CONTEXT)
    result = executor.run(_tool(lambda: "quick"), {}, _CONTEXT)
    assert result.error is not None and "all 2 tool threads" in result.error.message
    assert threading.active_count() <= before + 2  # the two held threads, no third
    release.set()


def test_handler_gets_the_idempotency_key_in_its_context() -> None:
    result = ToolExecutor(1).run(_tool(lambda context: context["idempotency_key"]), {}, _CONTEXT)
    assert result.unwrap() == "t:c"
