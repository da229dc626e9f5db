"""A deterministic, scripted Responses API server: "the model" of tests, the demo and benchmarks."""

from scripted_llm.runner import ScriptedServer
from scripted_llm.server import create_app

__all__ = ["ScriptedServer", "create_app"]
