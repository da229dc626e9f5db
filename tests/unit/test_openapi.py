"""The gateway's OpenAPI document: security, error envelope, operation ids, descriptions, constraints.

What the gateway really answers is checked against this document by tests/integration/test_openapi_fuzz.py.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from pydantic import ValidationError

from api_gateway.app import create_app
from shared.models.batch import BatchRequest
from shared.models.turn import NUL_FREE_PATTERN, ClientTool, TurnRequest
from shared.settings import Settings

OPERATIONS = {
    ("post", "/v1/turns"): ("createTurn", {200, 202, 401, 429, 404, 409, 413, 422, 503}),
    ("get", "/v1/turns/{turn_id}"): ("getTurn", {200, 401, 429, 404, 422, 503}),
    ("post", "/v1/turns/{turn_id}/tool-results"): ("postToolResults", {200, 202, 401, 429, 404, 409, 413, 422, 503}),
    ("post", "/v1/turns/{turn_id}/cancel"): ("cancelTurn", {200, 401, 429, 404, 409, 503}),
    ("get", "/v1/turns/{turn_id}/trace"): ("getTurnTrace", {200, 401, 429, 404, 503}),
    ("get", "/v1/turns/{turn_id}/events"): ("getTurnEvents", {200, 401, 429, 404, 422, 503}),
    ("get", "/v1/sessions/{session_id}"): ("getSession", {200, 401, 429, 404, 503}),
    ("get", "/v1/modes"): ("listModes", {200, 401, 429}),
    ("get", "/v1/usage"): ("getUsage", {200, 401, 422, 429, 503}),
    ("get", "/v1/webhook-endpoints"): ("listWebhookEndpoints", {200, 401, 429, 503}),
    ("get", "/v1/webhook-deliveries"): ("listWebhookDeliveries", {200, 401, 429, 404, 422, 503}),
    ("post", "/v1/batches"): ("createBatch", {202, 401, 429, 404, 409, 413, 422, 503}),
    ("get", "/v1/batches"): ("listBatches", {200, 401, 429, 422, 503}),
    ("get", "/v1/batches/{batch_id}"): ("getBatch", {200, 401, 429, 404, 503}),
    ("post", "/v1/batches/{batch_id}/cancel"): ("cancelBatch", {200, 401, 429, 404, 409, 422, 503}),
    ("get", "/v1/batches/{batch_id}/results"): ("getBatchResults", {200, 401, 429, 404, 503}),
    ("get", "/healthz"): ("getLiveness", {200}),
    ("get", "/readyz"): ("getReadiness", {200, 503}),
}
"""Every operation: its stable operationId and every status it can answer (429: every one that takes a key,
which counts against its organisation's requests per minute)."""
REQUEST_MODELS = ("TurnRequest", "BatchTurnRequest", "ClientTool", "ToolResult", "ToolResultsRequest", "BatchRequest")


@pytest.fixture(scope="module")
def document() -> dict[str, Any]:
    app = create_app(Settings(database_url="sqlite://", api_keys="k:o:u", max_batch_requests=250))
    openapi: dict[str, Any] = app.openapi()
    return openapi


def _operations(document: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(method, path): op for path, ops in document["paths"].items() for method, op in ops.items()}


def test_every_operation_has_its_stable_id_a_summary_and_exactly_its_statuses(document: dict[str, Any]) -> None:
    operations = _operations(document)
    assert set(operations) == set(OPERATIONS)
    for key, (operation_id, statuses) in OPERATIONS.items():
        operation = operations[key]
        assert operation["operationId"] == operation_id
        assert operation.get("summary"), operation_id
        assert {int(status) for status in operation["responses"]} == statuses, operation_id


def test_every_v1_operation_requires_the_bearer_scheme_and_health_needs_none(document: dict[str, Any]) -> None:
    assert document["components"]["securitySchemes"]["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": document["components"]["securitySchemes"]["bearerAuth"]["description"],
    }
    for (_method, path), operation in _operations(document).items():
        if path.startswith("/v1/"):
            assert operation["security"] == [{"bearerAuth": []}], path
        else:
            assert "security" not in operation, path


def test_every_error_answer_is_the_error_envelope_with_its_codes_named(document: dict[str, Any]) -> None:
    for (method, path), operation in _operations(document).items():
        for status, response in operation["responses"].items():
            if int(status) < 400:
                continue
            assert response["content"] == {"application/json": {"schema": {"$ref": "#/components/schemas/ErrorBody"}}}
            assert "`" in response["description"], f"{method} {path} {status}: name the error codes"
        if "401" in operation["responses"]:
            assert operation["responses"]["401"]["headers"]["WWW-Authenticate"]["required"] is True
        if "503" in operation["responses"]:
            assert operation["responses"]["503"]["headers"]["Retry-After"]["required"] is True
    envelope = document["components"]["schemas"]["ErrorBody"]
    assert envelope["required"] == ["error"]
    assert set(document["components"]["schemas"]["ErrorDetail"]["properties"]) == {"code", "message", "details"}


def test_fastapis_default_validation_error_is_gone(document: dict[str, Any]) -> None:
    text = json.dumps(document)
    assert "HTTPValidationError" not in text and '"ValidationError"' not in text
    assert "#/components/schemas/ValidationError" not in text


def test_every_property_of_every_model_has_a_description(document: dict[str, Any]) -> None:
    missing = [
        f"{name}.{field}"
        for name, schema in document["components"]["schemas"].items()
        for field, prop in schema.get("properties", {}).items()
        if not prop.get("description")
    ]
    assert not missing
    undescribed = [name for name, schema in document["components"]["schemas"].items() if not schema.get("description")]
    assert not undescribed


def test_every_path_and_query_parameter_has_a_description(document: dict[str, Any]) -> None:
    for (method, path), operation in _operations(document).items():
        for parameter in operation.get("parameters", []):
            assert parameter.get("description"), f"{method} {path} {parameter['name']}"


def test_batch_results_are_documented_as_json_lines_of_turns(document: dict[str, Any]) -> None:
    ok = _operations(document)[("get", "/v1/batches/{batch_id}/results")]["responses"]["200"]
    assert ok["content"] == {"application/jsonl": {"schema": {"$ref": "#/components/schemas/Turn"}}}


def test_every_request_string_refuses_nul_in_the_schema(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    unguarded = []
    for name in REQUEST_MODELS:
        for field, prop in schemas[name]["properties"].items():
            options = prop.get("anyOf", [prop])
            strings = [o for o in options if o.get("type") == "string" and "const" not in o and "enum" not in o]
            if prop.get("type") == "object" and "propertyNames" in prop:
                strings = [prop["propertyNames"], prop["additionalProperties"]]
            unguarded += [f"{name}.{field}" for s in strings if "pattern" not in s]
    assert not unguarded
    metadata = schemas["TurnRequest"]["properties"]["metadata"]
    assert metadata["propertyNames"]["pattern"] == metadata["additionalProperties"]["pattern"] == NUL_FREE_PATTERN
    assert "patternProperties" not in metadata, "unmatched keys would pass unconstrained"


def test_the_constraints_the_server_enforces_are_in_the_schema(document: dict[str, Any]) -> None:
    schemas = document["components"]["schemas"]
    assert schemas["ClientTool"]["properties"]["name"]["pattern"] == "^[A-Za-z0-9_-]{1,64}$"
    assert "unique" in schemas["TurnRequest"]["properties"]["tools"]["description"]
    assert "server tool" in schemas["ClientTool"]["properties"]["name"]["description"]
    assert "blank" in schemas["TurnRequest"]["properties"]["input"]["description"]
    requests = schemas["BatchRequest"]["properties"]["requests"]
    assert requests["items"] == {"$ref": "#/components/schemas/BatchTurnRequest"}
    assert requests["maxItems"] == 250, "the gateway's own APTIX_MAX_BATCH_REQUESTS"
    assert "same `session_id`" in requests["description"]
    key = schemas["BatchTurnRequest"]["properties"]["idempotency_key"]
    assert {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[^\\x00]*$"} in key["anyOf"]
    assert schemas["BatchStatus"]["enum"] == ["in_progress", "cancelling", "cancelled", "completed"]
    assert schemas["ClientTool"]["properties"]["strict"]["type"] == "boolean"


def test_the_api_description_says_how_to_authenticate_and_what_an_error_is(document: dict[str, Any]) -> None:
    description = document["info"]["description"]
    for needed in ("Authorization: Bearer <key>", "ErrorBody", "NaN", "1e999", "lone surrogates", "NUL", "413"):
        assert needed in description, needed


def test_request_models_refuse_what_their_schema_refuses() -> None:
    # A schema stricter than the server would mislead clients the other way: each of these is refused.
    with pytest.raises(ValidationError, match="valid boolean"):
        ClientTool.model_validate({"name": "t", "strict": 0})
    with pytest.raises(ValidationError, match="at most 255"):
        BatchRequest.model_validate({"requests": [{"input": "a", "idempotency_key": "k" * 256}]})
    with pytest.raises(ValidationError, match="NUL"):
        TurnRequest.model_validate({"input": "hi", "metadata": {"k\x00": "v"}})
    assert BatchRequest.model_validate({"requests": [{"input": "a", "idempotency_key": "k"}]}).requests[0].input == "a"


def test_create_batch_takes_a_json_body_or_a_json_lines_upload(document: dict[str, Any]) -> None:
    body = _operations(document)[("post", "/v1/batches")]["requestBody"]["content"]
    assert body["application/json"]["schema"] == {"$ref": "#/components/schemas/BatchRequest"}
    assert body["application/jsonl"]["schema"] == {"$ref": "#/components/schemas/TurnRequest"}
    assert "APTIX_MAX_UPLOAD_REQUESTS" in body["application/jsonl"]["description"]
    listed = _operations(document)[("get", "/v1/batches")]["responses"]["200"]["content"]["application/json"]
    assert listed["schema"] == {"$ref": "#/components/schemas/BatchList"}
