"""The LLM port: a Responses API client and the parsing of its answers."""

from workers.llm.client import ResponsesClient
from workers.llm.parsing import parse_error, parse_response, replay_items
from workers.llm.types import FunctionCall, LlmResponse

__all__ = ["FunctionCall", "LlmResponse", "ResponsesClient", "parse_error", "parse_response", "replay_items"]
