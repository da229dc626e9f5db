"""Running one server tool call: argument validation, the handler, its timeout, its output.

Arguments come from the LLM and are untrusted: they must parse as a JSON object and satisfy the
tool's JSON Schema, or the handler is not run and the model is told why (a normal tool result it
can correct). A handler that raises or overruns its timeout is a tool failure, which fails the turn
(AGN-031 §4). A timed-out handler's thread cannot be killed; it is abandoned, its result ignored.
"""

from __future__ import annotations

import concurrent.futures
import inspect
import json
from dataclasses import asdict, dataclass
from typing import Any

import jsonschema

from shared.result import ErrorCode, InvokeResult, failure, success
from workers.tools.registry import ServerTool

__all__ = ["ToolContext", "parse_arguments", "run_tool"]


@dataclass(frozen=True, slots=True)
class ToolContext:
    """What a handler may know about the call (passed as ``context`` when it declares it)."""

    session_id: str
    turn_id: str
    org_id: str
    user_id: str
    mode: str

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
    try:
        jsonschema.validate(parsed, tool.parameters)
    except jsonschema.ValidationError as exc:
        return f"error: invalid arguments for {tool.name}: {exc.message}"
    return parsed


def run_tool(tool: ServerTool, arguments: dict[str, Any], context: ToolContext) -> InvokeResult[str]:
    """Call the tool's handler with its validated arguments, within its timeout.

    Returns:
        The output as a string (JSON for non-string values), or a ``tool_failed`` failure.
    """
    assert tool.handler is not None
    kwargs = dict(arguments)
    if "context" in inspect.signature(tool.handler).parameters:
        kwargs["context"] = context.as_dict()
    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"tool-{tool.name}")
    try:
        value = pool.submit(tool.handler, **kwargs).result(timeout=tool.timeout_seconds)
    except concurrent.futures.TimeoutError:
        return failure(ErrorCode.TOOL_FAILED, f"tool {tool.name!r} timed out after {tool.timeout_seconds}s")
    except Exception as exc:  # the handler is operator code: any exception it raises is its failure
        return failure(ErrorCode.TOOL_FAILED, f"tool {tool.name!r} failed: {type(exc).__name__}: {exc}"[:1000])
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
    if isinstance(value, str):
        return success(value)
    try:
        return success(json.dumps(value))
    except (TypeError, ValueError):
        return failure(ErrorCode.TOOL_FAILED, f"tool {tool.name!r} returned a value that is not JSON-serialisable")
