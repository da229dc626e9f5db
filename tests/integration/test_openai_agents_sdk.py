"""The OpenAI Agents SDK's ``Runner`` against the OpenAI face: an agent whose model is an
``OpenAIResponsesModel`` with its client pointed at a real gateway and worker, and one function tool
that the Runner itself runs (Aptix sees it as a client tool)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import agents
import pytest
from agents import Agent, FunctionTool, OpenAIResponsesModel, Runner, RunResult, function_tool
from openai import AsyncOpenAI, OpenAI

from tests.conftest import KEY_A
from tests.integration.conftest import System

pytestmark = pytest.mark.integration

_MAX_TURNS = 4
"""Two model calls are needed; a model that keeps calling the tool fails the run quickly instead of looping."""


@pytest.fixture(scope="module", autouse=True)
def _no_tracing_export() -> Iterator[None]:
    """The SDK's tracing would export to OpenAI's servers; no test reaches them."""
    agents.set_tracing_disabled(True)
    yield
    agents.set_tracing_disabled(False)


def test_the_runner_runs_a_function_tool_to_the_final_output_when_it_sends_the_full_history(system: System) -> None:
    # Given an agent whose one tool records its calls, and a prompt that makes the model call it
    tool, calls = _recording_tool()
    marker = uuid.uuid4().hex

    # When the Runner runs it with its default: every request carries the whole history, no previous_response_id
    result = _run(system, tool, f'weather {marker} [[call:lookup_weather {{"city": "Paris"}}]]')

    # Then the Runner ran the tool once, sent its output back, and the model's answer is the final output
    assert calls == ["Paris"]
    assert result.final_output == "Tool results: lookup_weather=sunny in Paris"
    _, answered = system.llm_requests(marker)
    assert [item.get("type") for item in answered["input"]][-2:] == ["function_call", "function_call_output"]


def test_the_runner_continues_the_same_turn_when_it_chains_with_previous_response_id(system: System) -> None:
    # Given an agent whose one tool records its calls, and a prompt that makes the model call it
    tool, calls = _recording_tool()
    marker = uuid.uuid4().hex

    # When the Runner chains its requests with previous_response_id (sending only the tool's output)
    result = _run(
        system, tool, f'chained {marker} [[call:lookup_weather {{"city": "Oslo"}}]]', auto_previous_response_id=True
    )

    # Then the tool ran once, and the second response is the same Aptix turn resumed with that output
    assert calls == ["Oslo"]
    assert result.final_output == "Tool results: lookup_weather=sunny in Oslo"
    first_id, second_id = (response.response_id for response in result.raw_responses)
    assert first_id is not None and second_id is not None
    with OpenAI(base_url=system.gateway_url + "/openai/v1", api_key=KEY_A, max_retries=0) as client:
        first, second = client.responses.retrieve(first_id), client.responses.retrieve(second_id)
    assert second.previous_response_id == first_id
    first_ext, second_ext = _aptix(first.model_extra), _aptix(second.model_extra)
    assert second_ext["turn_id"] == first_ext["turn_id"] and second_ext["round"] == first_ext["round"] + 1
    assert [item.type for item in first.output][-1] == "function_call"
    assert second.output_text == result.final_output


def test_a_second_run_continues_the_conversation_when_given_the_last_response_id(system: System) -> None:
    # Given a finished run
    tool, calls = _recording_tool()
    marker = uuid.uuid4().hex
    earlier = _run(system, tool, f"remember {marker}")

    # When another run starts from its last response, and calls the tool
    later = _run(
        system, tool, f'again {marker} [[call:lookup_weather {{"city": "Rome"}}]]',
        previous_response_id=earlier.last_response_id,
    )  # fmt: skip

    # Then it runs in the same conversation, and the model saw the earlier exchange
    assert earlier.final_output == f"Echo: remember {marker}"
    assert calls == ["Rome"]
    assert later.final_output == "Tool results: lookup_weather=sunny in Rome"
    with OpenAI(base_url=system.gateway_url + "/openai/v1", api_key=KEY_A, max_retries=0) as client:
        sessions = {
            _aptix(client.responses.retrieve(response_id).model_extra)["session_id"]
            for response_id in (earlier.last_response_id, later.last_response_id)
            if response_id is not None
        }
    assert len(sessions) == 1
    resumed = system.llm_requests(f"again {marker}")[-1]
    assert f"Echo: remember {marker}" in json.dumps(resumed["input"])


def _recording_tool() -> tuple[FunctionTool, list[str]]:
    """A function tool the Runner runs, and the list of the cities it was called with."""
    calls: list[str] = []

    @function_tool
    def lookup_weather(city: str) -> str:
        """Look up the weather in a city.

        Args:
            city: The city's name.
        """
        calls.append(city)
        return f"sunny in {city}"

    return lookup_weather, calls


def _run(system: System, tool: FunctionTool, prompt: str, **options: Any) -> RunResult:
    """Run an agent with ``tool`` on the scripted model through the gateway's OpenAI face."""

    async def run() -> RunResult:
        async with AsyncOpenAI(base_url=system.gateway_url + "/openai/v1", api_key=KEY_A, max_retries=0) as client:
            agent = Agent(
                name="weather",
                instructions="Answer with the tool's results.",
                tools=[tool],
                model=OpenAIResponsesModel(model="scripted-model", openai_client=client),
            )
            return await Runner.run(agent, prompt, max_turns=_MAX_TURNS, **options)

    return asyncio.run(run())


def _aptix(extra: dict[str, Any] | None) -> dict[str, Any]:
    """The Aptix extension object of a response."""
    extension: dict[str, Any] = (extra or {})["aptix"]
    return extension
