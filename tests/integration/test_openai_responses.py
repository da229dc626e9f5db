"""The Responses API of the OpenAI face, driven by the official ``openai`` SDK against a real gateway and worker."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import openai
import pytest
from openai.types.responses import Response

from tests.conftest import KEY_A, KEY_B
from tests.integration.conftest import OPEN_FILE, System
from tests.responses_fixtures import validate_response_bodies, validate_stream_bodies
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def client(system: System) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=system.gateway_url + "/openai/v1", api_key=KEY_A, max_retries=0) as sdk:
        yield sdk


def _strict(response: Response) -> Response:
    """The raw body validates as the SDK's Response (the SDK's own parse is lenient)."""
    return Response.model_validate(response.model_dump(mode="json"))


def test_a_sync_create_answers_the_completed_response(client: openai.OpenAI) -> None:
    response = _strict(client.responses.create(model="scripted-model", input="hello sync", instructions="Be brief."))

    assert response.status == "completed"
    assert response.output_text == "Echo: hello sync"
    assert response.id.startswith("resp_")
    assert response.instructions == "Be brief."
    assert response.usage is not None and response.usage.total_tokens > 0
    extension = (response.model_extra or {})["aptix"]
    assert extension["turn_id"].startswith("turn_") and extension["mode"] == "general"


def test_instructions_and_model_options_reach_the_model(client: openai.OpenAI, system: System) -> None:
    client.responses.create(
        model="scripted-model", input="options probe", instructions="Answer in French.", temperature=0.2,
        max_output_tokens=300, tool_choice="auto",
    )  # fmt: skip

    (request,) = system.llm_requests("options probe")
    assert request["instructions"].endswith("Answer in French.")
    assert request["temperature"] == 0.2 and request["max_output_tokens"] == 300 and request["tool_choice"] == "auto"


def test_a_background_response_is_polled_to_its_end(client: openai.OpenAI) -> None:
    created = client.responses.create(model="scripted-model", input="hello background", background=True)

    # The create answers at once with the turn as it stands: a worker may have finished it already (a plain turn
    # takes milliseconds, and the gateway sends it before it answers)
    assert created.status in ("queued", "in_progress", "completed")
    final = wait_for(lambda: _done(client.responses.retrieve(created.id)), what="the background response to finish")
    assert _strict(final).output_text == "Echo: hello background"
    assert final.background is True


def test_a_function_tool_round_trip_resumes_the_same_turn(client: openai.OpenAI, system: System) -> None:
    tool = {"type": "function", "name": "open_file", "description": "Open a file.", "strict": False,
            "parameters": OPEN_FILE["parameters"]}  # fmt: skip
    first = _strict(client.responses.create(
        model="scripted-model", input='round trip [[call:open_file {"path": "a.txt"}]]', tools=[tool]
    ))  # fmt: skip
    assert first.status == "completed"
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "open_file" and json.loads(call.arguments) == {"path": "a.txt"}

    second = _strict(client.responses.create(
        model="scripted-model", previous_response_id=first.id, tools=[tool],
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "contents of a"}],
    ))  # fmt: skip

    assert second.status == "completed"
    assert second.output_text == "Tool results: open_file=contents of a"
    assert second.previous_response_id == first.id
    first_ext, second_ext = (first.model_extra or {})["aptix"], (second.model_extra or {})["aptix"]
    assert second_ext["turn_id"] == first_ext["turn_id"] and second_ext["round"] == 1
    # The paused round reads the same after its turn moved on.
    assert _strict(client.responses.retrieve(first.id)).output == first.output


def test_outputs_for_other_calls_are_refused_and_change_nothing(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="scripted-model", input='mismatch [[call:open_file {"path": "b"}]]', tools=[_open_file()]
    )
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(
            model="scripted-model", previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": "call_unknown", "output": "x"}],
        )  # fmt: skip
    assert refused.value.param == "input"
    assert client.responses.retrieve(first.id).status == "completed"
    assert (client.responses.retrieve(first.id).model_extra or {})["aptix"]["turn_status"] == "requires_client_tools"


def test_a_conversation_continues_with_previous_response_id(client: openai.OpenAI, system: System) -> None:
    first = client.responses.create(model="scripted-model", input="first message xyz")
    second = client.responses.create(model="scripted-model", input="second message xyz", previous_response_id=first.id)
    third = client.responses.create(model="scripted-model", input="third message xyz", previous_response_id=second.id)

    sessions = {(r.model_extra or {})["aptix"]["session_id"] for r in (first, second, third)}
    assert len(sessions) == 1
    (request,) = system.llm_requests("third message xyz")
    texts = json.dumps(request["input"])
    assert "first message xyz" in texts and "Echo: second message xyz" in texts


def test_input_items_are_listed_with_cursor_pages(client: openai.OpenAI) -> None:
    items = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": [{"type": "input_text", "text": "one"}]},
        {"role": "assistant", "content": "two"},
        {"role": "user", "content": "three"},
    ]
    response = client.responses.create(model="scripted-model", input=items)  # type: ignore[arg-type]

    page = client.responses.input_items.list(response.id, order="asc", limit=3)
    assert [item.type for item in page.data] == ["message"] * 3
    assert page.has_more is True
    everything = list(client.responses.input_items.list(response.id, order="asc", limit=3))
    assert len(everything) == 4
    assert [getattr(item, "role", None) for item in everything] == ["system", "user", "assistant", "user"]


def test_cancel_is_idempotent_and_a_finished_response_is_returned_as_is(client: openai.OpenAI) -> None:
    slow = client.responses.create(model="scripted-model", input="slow [[sleep:3000]]", background=True)
    cancelled = client.responses.cancel(slow.id)
    assert cancelled.status == "cancelled"
    assert client.responses.cancel(slow.id).status == "cancelled"

    done = client.responses.create(model="scripted-model", input="quick to cancel")
    assert client.responses.cancel(done.id).status == "completed"


def test_errors_are_the_sdk_exception_classes(client: openai.OpenAI, system: System) -> None:
    with pytest.raises(openai.BadRequestError) as bad:
        client.responses.create(model="scripted-model", input=[{"role": "user", "content": [{"type": "input_image"}]}])  # type: ignore[list-item]
    assert bad.value.param == "input[0].content[0].type"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.responses.create(model="scripted-model", input="x", extra_body={"surprise": 1})
    assert unknown.value.param == "surprise"
    with pytest.raises(openai.BadRequestError):
        client.responses.create(model="scripted-model", input="x", tools=[{"type": "web_search"}])  # type: ignore[list-item]
    with pytest.raises(openai.BadRequestError) as stored:
        client.responses.create(model="scripted-model", input="x", store=False, background=True)
    assert stored.value.param == "store"
    with pytest.raises(openai.NotFoundError) as missing_model:
        client.responses.create(model="no-such-model", input="x")
    assert missing_model.value.code == "model_not_found"
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_" + "0" * 32 + "r0")
    mine = client.responses.create(model="scripted-model", input="org a only")
    base_url = system.gateway_url + "/openai/v1"
    with openai.OpenAI(base_url=base_url, api_key=KEY_B, max_retries=0) as other, pytest.raises(openai.NotFoundError):
        other.responses.retrieve(mine.id)
    with (
        openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0) as stranger,
        pytest.raises(openai.AuthenticationError),
    ):
        stranger.responses.retrieve(mine.id)


def test_a_body_nested_too_deep_and_a_parameter_holding_nul_are_400s_in_openais_shape(
    client: openai.OpenAI, system: System
) -> None:
    # A body nested deeper than the JSON parser goes (a RecursionError, once a 500)
    deep = b'{"model": "scripted-model", "input": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    response = system.http.post(
        "/openai/v1/responses", content=deep, headers={**system.headers(), "Content-Type": "application/json"}
    )
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "invalid_request" and "nested too deeply" in response.text
    # A NUL character in a query parameter
    mine = client.responses.create(model="scripted-model", input="nul after")
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.input_items.list(mine.id, after="msg_\x00")
    assert refused.value.param == "after"


def test_an_idempotency_key_makes_a_retried_create_return_the_same_response(client: openai.OpenAI) -> None:
    headers = {"Idempotency-Key": "retry-me-1"}
    first = client.responses.create(model="scripted-model", input="idempotent", extra_headers=headers)
    again = client.responses.create(model="scripted-model", input="idempotent", extra_headers=headers)
    assert again.id == first.id
    with pytest.raises(openai.ConflictError):
        client.responses.create(model="scripted-model", input="another body", extra_headers=headers)


def test_a_streamed_create_sends_openai_events_whose_deltas_join_to_the_text(client: openai.OpenAI) -> None:
    events = list(client.responses.create(model="scripted-model", input="stream these words please", stream=True))

    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert events[0].type == "response.created" and events[-1].type == "response.completed"
    text = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    final = events[-1].response  # type: ignore[union-attr]  # response.completed carries the response
    assert text == final.output_text == "Echo: stream these words please"
    with client.responses.with_streaming_response.create(
        model="scripted-model", input="stream a raw body", stream=True
    ) as raw:
        body = b"".join(raw.iter_bytes())
    validate_stream_bodies([body])


def test_a_function_call_streams_its_arguments(client: openai.OpenAI) -> None:
    events = list(client.responses.create(
        model="scripted-model", input='stream a call [[call:open_file {"path": "s.txt"}]]', tools=[_open_file()],  # type: ignore[list-item]
        stream=True,
    ))  # fmt: skip

    arguments = "".join(event.delta for event in events if event.type == "response.function_call_arguments.delta")
    assert json.loads(arguments) == {"path": "s.txt"}
    assert events[-1].type == "response.completed"


def test_a_stream_resumed_on_another_gateway_gets_exactly_the_events_after_n(
    client: openai.OpenAI, system: System, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    # Given a background response streamed from one gateway, cut after three events
    stream = client.responses.create(
        model="scripted-model", input="resume me elsewhere [[sleep:500]]", stream=True, background=True
    )
    first = []
    for event in stream:
        first.append(event)
        if len(first) == 3:
            break
    stream.close()
    response_id = first[0].response.id  # type: ignore[union-attr]  # response.created carries the response
    # When the client resumes after the last event it has, on another gateway process
    other_url = extra_gateway({})
    with openai.OpenAI(base_url=other_url + "/openai/v1", api_key=KEY_A, max_retries=0) as other:
        rest = list(other.responses.retrieve(response_id, stream=True, starting_after=first[-1].sequence_number))
        replay = list(other.responses.retrieve(response_id, stream=True))
    # Then it gets exactly the events after N: no gap, no duplicate, the same as a full replay
    joined = [event.model_dump(mode="json") for event in (*first, *rest)]
    assert [event["sequence_number"] for event in joined] == list(range(len(joined)))
    assert joined == [event.model_dump(mode="json") for event in replay]
    assert joined[-1]["type"] == "response.completed"


def test_a_client_that_disconnects_never_cancels_a_background_response(client: openai.OpenAI) -> None:
    stream = client.responses.create(
        model="scripted-model", input="keep running [[sleep:1000]]", stream=True, background=True
    )
    created = next(iter(stream))
    stream.close()
    response_id = created.response.id  # type: ignore[union-attr]  # response.created carries the response

    final = wait_for(lambda: _done(client.responses.retrieve(response_id)), what="the response to finish")
    assert final.status == "completed" and final.output_text == "Echo: keep running [[sleep:1000]]"


def test_the_example_runs_against_a_real_gateway(system: System) -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    example = Path(__file__).resolve().parents[2] / "examples" / "openai_sdk.py"
    env = {**os.environ, "APTIX_URL": system.gateway_url, "APTIX_KEY": KEY_A, "APTIX_MODEL": "scripted-model"}
    done = subprocess.run([sys.executable, str(example)], env=env, capture_output=True, text=True, timeout=120)

    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "sync: completed 'Echo: hello from the openai SDK'"
    assert lines[2] == "stream: True response.completed 'Echo: stream me please'"
    assert lines[-1] == "after the tool: completed 'Tool results: open_file=ship on Friday'"


def test_three_responses_in_one_conversation_share_its_session(client: openai.OpenAI) -> None:
    conversation = client.conversations.create(metadata={"topic": "three"})
    answers = [
        client.responses.create(model="scripted-model", input=f"conversation turn {n}", conversation=conversation.id)
        for n in range(3)
    ]

    assert {(answer.model_extra or {})["aptix"]["session_id"] for answer in answers} == {
        "sess_" + conversation.id.removeprefix("conv_")
    }
    assert all(answer.conversation is not None and answer.conversation.id == conversation.id for answer in answers)
    items = list(client.conversations.items.list(conversation.id, order="asc"))
    assert [item.content[0].text for item in items] == [  # type: ignore[union-attr]
        text for n in range(3) for text in (f"conversation turn {n}", f"Echo: conversation turn {n}")
    ]


def test_a_busy_conversation_is_a_conflict_and_an_unknown_one_not_found(client: openai.OpenAI) -> None:
    conversation = client.conversations.create()
    client.responses.create(
        model="scripted-model", input="hold it [[sleep:1500]]", conversation=conversation.id, background=True
    )
    with pytest.raises(openai.ConflictError) as busy:
        client.responses.create(model="scripted-model", input="me too", conversation=conversation.id)
    assert busy.value.code == "session_busy"
    with pytest.raises(openai.NotFoundError) as unknown:
        client.responses.create(model="scripted-model", input="x", conversation="conv_" + "0" * 32)
    assert unknown.value.param == "conversation"


def test_a_body_over_the_limit_is_a_413_in_openais_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.APIStatusError) as refused:
        client.responses.create(model="scripted-model", input="x" * 70_000)
    assert refused.value.status_code == 413
    assert refused.value.code == "request_too_large" and refused.value.type == "invalid_request_error"


def test_every_status_renders_as_a_valid_response_body(client: openai.OpenAI) -> None:
    raw = client.responses.with_raw_response
    queued = raw.create(model="scripted-model", input="render queued [[sleep:1500]]", background=True)
    completed = raw.create(model="scripted-model", input="render completed")
    failed = raw.create(model="scripted-model", input="render failed [[fail:400]]")
    paused = raw.create(model="scripted-model", input='render paused [[call:open_file {"path": "r"}]]',
                        tools=[_open_file()])  # type: ignore[list-item]  # fmt: skip
    bodies = [response.http_response.json() for response in (queued, completed, failed, paused)]
    bodies.append(client.responses.with_raw_response.cancel(bodies[0]["id"]).http_response.json())

    assert bodies[0]["status"] in ("queued", "in_progress")
    assert [body["status"] for body in bodies[1:]] == ["completed", "failed", "completed", "cancelled"]
    assert bodies[2]["error"]["code"] == "server_error" and bodies[2]["error"]["type"] == "llm_error"
    validate_response_bodies(bodies)


def _open_file() -> dict[str, object]:
    return {"type": "function", "name": "open_file", "description": "Open a file.", "strict": False,
            "parameters": OPEN_FILE["parameters"]}  # fmt: skip


def _done(response: Response) -> Response | None:
    return response if response.status not in ("queued", "in_progress") else None
