"""Server tools: the registry of built-in and operator tools, and their executor."""

from workers.tools.registry import ServerTool, ToolRegistry

__all__ = ["ServerTool", "ToolRegistry"]
