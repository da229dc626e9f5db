"""The official ``openai`` SDK against Aptix: sync, background + poll, stream + resume, a function tool round trip.

Start ``aptix dev --port 8000 --key my-dev-key`` (it serves a scripted model), then run
``python examples/openai_sdk.py``. ``APTIX_URL`` and ``APTIX_KEY`` point it elsewhere. The scripted
model answers ``Echo: <your text>``, and ``[[call:NAME {json}]]`` in a message makes it call NAME.
"""

from __future__ import annotations

import json
import os
import sys
import time

from openai import OpenAI
from openai.types.responses import FunctionToolParam

URL = os.environ.get("APTIX_URL", "http://127.0.0.1:8000")
KEY = os.environ.get("APTIX_KEY", "my-dev-key")
MODEL = os.environ.get("APTIX_MODEL", "gpt-4.1-mini")  # APTIX_LLM_MODEL's default: what aptix dev serves
OPEN_FILE: FunctionToolParam = {
    "type": "function",
    "name": "open_file",
    "description": "Open a file on the client.",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]},
    "strict": False,
}


def main() -> None:
    """Run each feature once and print what came back."""
    client = OpenAI(base_url=f"{URL}/openai/v1", api_key=KEY)

    # 1. Sync: the answer when the turn finished.
    response = client.responses.create(model=MODEL, input="hello from the openai SDK")
    _say("sync:", response.status, repr(response.output_text))

    # 2. Background: answered at once, then polled (from any gateway).
    response = client.responses.create(model=MODEL, input="hello in the background", background=True)
    while response.status in ("queued", "in_progress"):
        time.sleep(0.2)
        response = client.responses.retrieve(response.id)
    _say("background:", response.status, repr(response.output_text))

    # 3. Stream, cut after three events, resumed with starting_after: no gap, no duplicate.
    stream = client.responses.create(model=MODEL, input="stream me please", stream=True, background=True)
    seen = []
    for event in stream:
        seen.append(event)
        if len(seen) == 3:
            break
    stream.close()
    response_id = seen[0].response.id  # type: ignore[union-attr]  # the first event is response.created
    resumed = client.responses.retrieve(response_id, stream=True, starting_after=seen[-1].sequence_number)
    seen += list(resumed)
    numbers = [event.sequence_number for event in seen]
    text = "".join(getattr(event, "delta", "") for event in seen if event.type == "response.output_text.delta")
    _say("stream:", numbers == list(range(len(numbers))), seen[-1].type, repr(text))

    # 4. A function tool round trip: the turn pauses for the client's tool, the same turn resumes.
    response = client.responses.create(
        model=MODEL, input='[[call:open_file {"path": "notes.txt"}]] read my notes', tools=[OPEN_FILE]
    )
    calls = [item for item in response.output if item.type == "function_call"]
    _say("function call:", [(call.name, json.loads(call.arguments)) for call in calls])
    response = client.responses.create(
        model=MODEL,
        previous_response_id=response.id,
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "ship on Friday"} for call in calls],
        tools=[OPEN_FILE],
    )
    _say("after the tool:", response.status, repr(response.output_text))


def _say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(part) for part in parts) + "\n")


if __name__ == "__main__":
    main()
