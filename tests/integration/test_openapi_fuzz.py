"""The OpenAPI document against the real gateway: a schema-driven fuzzer (schemathesis) finds nothing it does not say.

Schemathesis reads ``/openapi.json`` from the running gateway and runs every phase (the schema's
examples, boundary coverage, random fuzzing, stateful sequences over the links it infers) with a
valid key, positive and negative data. Its checks fail on a 5xx other than the documented 503, a
status the operation does not document, a body or a header its schema does not describe, invalid
data the gateway accepts, a request without the key that is not refused, and a method a path does
not take that is not a 405 with ``Allow``. Not checked: that valid data is accepted, since the
gateway refuses some of it on purpose with documented statuses (an unknown ``session_id`` is 404, a
busy session 409, a client tool named like a server tool 422).

On top, from the HAR of every request it sent: each status is documented for its operation (405
only for a method the path does not take), each JSON Lines body is ``Turn``s, and each operation
was seen succeeding, so the run tested more than the error paths.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema

from tests.conftest import KEY_A
from tests.integration.conftest import OPEN_FILE, System
from tests.support.waiting import wait_for

EXAMPLES_PER_OPERATION = 10
"""Bounds the run: about 600 requests in all (every phase together), 10-20 s here."""
MAX_BATCH_REQUESTS = 3
"""The fuzzed gateway's batch limit: its document says so (``maxItems``), so the fuzzer's batches stay small."""
SEED = 12
"""A fixed seed: the same cases every run, so a failure is reproducible (``st run --seed``)."""
CHECKS = [
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
    "missing_required_header",
    "unsupported_method",
    "allow_header_conformance",
    "ignored_auth",
    "use_after_free",
    "ensure_resource_availability",
]
JSON_LINES = "application/jsonl"


def test_gateway_answers_only_what_its_openapi_document_says_when_fuzzed(
    system: System, extra_gateway: Callable[[dict[str, str]], str], tmp_path: Path
) -> None:
    # Given a gateway whose batches are small, two turns and a batch waiting for client tool results (for
    # the operations that need one to succeed)
    gateway_url = extra_gateway({"APTIX_MAX_BATCH_REQUESTS": str(MAX_BATCH_REQUESTS)})
    document = system.http.get(f"{gateway_url}/openapi.json").json()
    assert document["components"]["schemas"]["BatchRequest"]["properties"]["requests"]["maxItems"] == MAX_BATCH_REQUESTS
    for_results, for_cancel, batch = _paused_turn(system), _paused_turn(system), _paused_batch(system)
    (tmp_path / "schemathesis.toml").write_text(_config(for_results=for_results, for_cancel=for_cancel, batch=batch))

    # When schemathesis fuzzes every operation of /openapi.json with a valid key
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("schemathesis")), "run", f"{gateway_url}/openapi.json",
            "--header", f"Authorization: Bearer {KEY_A}", "--checks", ",".join(CHECKS),
            "--max-examples", str(EXAMPLES_PER_OPERATION), "--seed", str(SEED), "--workers", "1",
            "--generation-database", "none", "--no-color", "--report", "json,har", "--report-dir", "report",
        ],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )  # fmt: skip

    # Then it found no failure and no error
    output = done.stdout[-6000:] + done.stderr[-2000:]
    report = json.loads(_one(tmp_path / "report", "json-*.json").read_text())
    assert report["exit_code"] == 0 == done.returncode, output
    assert report["failures"] == [] and report["errors"] == [], output
    operations = sum(1 for item in document["paths"].values() for method in item if method in _METHODS)
    assert report["operations"]["tested"] == report["operations"]["total"] == operations, output
    # And every answer it got is documented for its operation, and no operation only ever failed
    entries = json.loads(_one(tmp_path / "report", "har-*.json").read_text())["log"]["entries"]
    assert len(entries) >= 300, f"a bounded but real run: {len(entries)} requests"
    seen = _statuses_by_operation(document, entries)
    assert not _undocumented(document, seen), seen
    assert not [status for statuses in seen.values() for status in statuses if status >= 500 and status != 503]
    assert not [op for op, statuses in seen.items() if op in _documented(document) and min(statuses) >= 300], seen
    # And every JSON Lines body it got is one Turn per line
    _assert_json_lines_are_turns(document, entries)
    _wait_until_its_turns_settled(system, entries)


_METHODS = frozenset({"get", "post", "put", "patch", "delete"})


def _paused_turn(system: System) -> str:
    turn = system.run_turn({"input": '[[call:open_file {"path": "a.txt"}]] fuzz', "tools": [OPEN_FILE]})
    assert turn["status"] == "requires_client_tools", turn
    turn_id: str = turn["turn_id"]
    return turn_id


def _paused_batch(system: System) -> str:
    """A batch whose one turn waits for client tool results: a batch that can be cancelled."""
    request = {"input": '[[call:open_file {"path": "b.txt"}]] fuzz batch', "tools": [OPEN_FILE]}
    batch_id: str = system.http.post("/v1/batches", json={"requests": [request]}, headers=system.headers()).json()[
        "batch_id"
    ]
    wait_for(lambda: _batch_settled(system, batch_id), what=f"batch {batch_id} to pause", seconds=60)
    return batch_id


def _config(*, for_results: str, for_cancel: str, batch: str) -> str:
    # A refusal of invalid data may be any documented 4xx (413 for a batch too large to send).
    return f"""\
[checks.negative_data_rejection]
expected-statuses = [401, 404, 409, 413, 422]

[checks.not_a_server_error]
expected-statuses = ["2xx", "3xx", "4xx", 503]

[[operations]]
include-operation-id = "postToolResults"
parameters = {{ "path.turn_id" = "{for_results}" }}

[[operations]]
include-operation-id = "cancelTurn"
parameters = {{ "path.turn_id" = "{for_cancel}" }}

[[operations]]
include-operation-id = "cancelBatch"
parameters = {{ "path.batch_id" = "{batch}" }}
"""


def _wait_until_its_turns_settled(system: System, entries: list[dict[str, Any]]) -> None:
    """Leave the shared worker idle for the tests after this one: every turn and batch the fuzzer started is done."""
    answered = [entry for entry in entries if entry["request"]["method"] == "POST" and entry["response"]["status"]
                in (200, 202)]  # fmt: skip
    # A streamed answer (?stream=true) ends with the turn's end or pause: only JSON answers name turns still moving.
    bodies = [_json(entry) for entry in answered if "event-stream" not in entry["response"]["content"]["mimeType"]]
    for turn_id in {body["turn_id"] for body in bodies if "turn_id" in body}:
        assert system.wait_turn(turn_id)["status"] not in ("queued", "running"), turn_id
    for batch_id in {body["batch_id"] for body in bodies if body.get("batch_id")}:
        wait_for(
            lambda batch_id=batch_id: _batch_settled(system, batch_id), what=f"batch {batch_id} to finish", seconds=60
        )


def _batch_settled(system: System, batch_id: str) -> bool:
    counts = system.http.get(f"/v1/batches/{batch_id}", headers=system.headers()).json()["counts"]
    return counts["queued"] + counts["running"] == 0


def _json(entry: dict[str, Any]) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(_text(entry["response"]["content"]))
    return body


def _one(directory: Path, pattern: str) -> Path:
    (found,) = directory.glob(pattern)
    return found


def _documented(document: dict[str, Any]) -> dict[tuple[str, str], set[int]]:
    """(METHOD, path template) -> the statuses its operation documents."""
    return {
        (method.upper(), path): {int(status) for status in operation["responses"]}
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    }


def _statuses_by_operation(document: dict[str, Any], entries: list[dict[str, Any]]) -> dict[tuple[str, str], set[int]]:
    """(METHOD, path template) -> the statuses seen, for every request the fuzzer sent."""
    # The paths are letters, digits, "/", "-" and "{parameter}": no other regex metacharacter to escape.
    templates = [(re.compile("^" + re.sub(r"\{[^/]+?\}", "[^/]+", path) + "$"), path) for path in document["paths"]]
    seen: dict[tuple[str, str], set[int]] = {}
    for entry in entries:
        path = re.sub(r"^[a-z]+://[^/]+", "", entry["request"]["url"]).split("?")[0]
        template = next((name for pattern, name in templates if pattern.match(path)), path)
        seen.setdefault((entry["request"]["method"], template), set()).add(entry["response"]["status"])
    return seen


def _undocumented(document: dict[str, Any], seen: dict[tuple[str, str], set[int]]) -> list[str]:
    documented = _documented(document)
    found = []
    for (method, path), statuses in seen.items():
        allowed = documented.get((method, path))
        if allowed is None:
            # Not an operation: a method the path does not take is 405, a path the API does not have is 404.
            allowed = {405} if path in document["paths"] else {404}
        found.extend(f"{method} {path} -> {status}" for status in sorted(statuses - allowed))
    return found


def _assert_json_lines_are_turns(document: dict[str, Any], entries: list[dict[str, Any]]) -> None:
    turn = jsonschema.Draft202012Validator({"$ref": "#/components/schemas/Turn", "components": document["components"]})
    bodies = [_text(entry["response"]["content"]) for entry in entries if _is_json_lines(entry)]
    lines = [json.loads(line) for body in bodies for line in body.splitlines()]
    assert lines, "the fuzzer read no batch results"
    for line in lines:
        turn.validate(line)


def _is_json_lines(entry: dict[str, Any]) -> bool:
    return entry["response"]["status"] == 200 and entry["response"]["content"].get("mimeType", "").startswith(
        JSON_LINES
    )


def _text(content: dict[str, Any]) -> str:
    text: str = content.get("text", "")
    return base64.b64decode(text).decode() if content.get("encoding") == "base64" else text
