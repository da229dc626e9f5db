"""Running one server tool call: argument validation, the handler on a bounded pool, its timeout.

Arguments come from the LLM and are untrusted: they must parse as a JSON object and satisfy the
tool's JSON Schema, or the handler is not run and the model is told why (a normal tool result it
can correct). A handler that raises or overruns its timeout is a tool failure, which fails the turn
(AGN-031 §4).

Handlers run on a pool of ``APTIX_TOOL_THREADS`` threads per worker process. Python cannot stop a
thread: a handler that overruns its timeout keeps its thread until it returns, and its result is
then thrown away. Such a thread still holds one of the pool's slots, so a handler that never returns
costs one slot for the life of the process; when every slot is held, a new call waits its own
timeout for a slot and then fails ``tool_failed`` saying so (the worker logs an error; restart it).
So timed-out handlers can never pile up threads without bound.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

import jsonschema

from shared.result import ErrorCode, InvokeResult, failure, success
from workers.tools.registry import ServerTool

__all__ = ["ToolContext", "ToolExecutor", "parse_arguments"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler may know about the call (passed as ``context`` when it declares it)."""

    session_id: str
    turn_id: str
    org_id: str
    user_id: str
    mode: str
    call_id: str
    idempotency_key: str
    """``<turn_id>:<call_id>``: the same for every run of this call; pass it to downstream APIs."""

    def as_dict(self) -> dict[str, str]:
        """The context as a plain dict."""
        return asdict(self)


def parse_arguments(tool: ServerTool, arguments: str) -> dict[str, Any] | str:
    """The validated arguments, or a message saying why they were refused."""
    try:
        parsed = json.loads(arguments or "{}")
    except json.JSONDecodeError as exc:
        return f"error: the arguments of {tool.name} are not valid JSON ({exc.msg})"
    if not isinstance(parsed, dict):
        return f"error: the arguments of {tool.name} must be a JSON object"
    error = jsonschema.exceptions.best_match(tool.validator.iter_errors(parsed))
    if error is not None:
        return f"error: invalid arguments for {tool.name}: {error.message}"
    return parsed


class ToolExecutor:
    """Runs handlers on a bounded pool, one per worker process."""

    def __init__(self, max_threads: int) -> None:
        self._slots = threading.BoundedSemaphore(max_threads)
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=max_threads, thread_name_prefix="tool")
        self._max_threads = max_threads
        self._overrunning = 0
        self._lock = threading.Lock()

    @property
    def max_threads(self) -> int:
        """The pool's threads (``APTIX_TOOL_THREADS``)."""
        return self._max_threads

    @property
    def overrunning(self) -> int:
        """Handlers that overran their timeout and still hold their thread."""
        with self._lock:
            return self._overrunning

    def run(self, tool: ServerTool, arguments: dict[str, Any], context: ToolContext) -> InvokeResult[str]:
        """Call the tool's handler with its validated arguments, within its timeout.

        Returns:
            The output as a string (JSON for non-string values), or a ``tool_failed`` failure.
        """
        assert tool.handler is not None
        kwargs = dict(arguments)
        if "context" in inspect.signature(tool.handler).parameters:
            kwargs["context"] = context.as_dict()
        if not self._slots.acquire(timeout=tool.timeout_seconds):
            logger.error("no tool thread free: %d handler(s) overran their timeout and still run", self.overrunning)
            return failure(
                ErrorCode.TOOL_FAILED,
                f"tool {tool.name!r} could not start: all {self._max_threads} tool threads of this worker are "
                "held by handlers that overran their timeouts",
            )
        future = self._pool.submit(tool.handler, **kwargs)
        future.add_done_callback(self._free_slot)
        try:
            value = future.result(timeout=tool.timeout_seconds)
        except concurrent.futures.TimeoutError:
            with self._lock:
                self._overrunning += 1
            future.add_done_callback(self._overrun_ended)
            logger.warning("tool %s overran its %ss timeout; its thread is abandoned", tool.name, tool.timeout_seconds)
            return failure(ErrorCode.TOOL_FAILED, f"tool {tool.name!r} timed out after {tool.timeout_seconds}s")
        except Exception as exc:  # the handler is operator code: any exception it raises is its failure
            return failure(ErrorCode.TOOL_FAILED, f"tool {tool.name!r} failed: {type(exc).__name__}: {exc}"[:1000])
        if isinstance(value, str):
            return success(value)
        try:
            return success(json.dumps(value))
        except (TypeError, ValueError):
            return failure(ErrorCode.TOOL_FAILED, f"tool {tool.name!r} returned a value that is not JSON-serialisable")

    def _free_slot(self, _future: concurrent.futures.Future[Any]) -> None:
        self._slots.release()

    def _overrun_ended(self, _future: concurrent.futures.Future[Any]) -> None:
        with self._lock:
            self._overrunning -= 1
