"""Unit tests of the shared contracts: InvokeResult, settings, the mode catalog, envelopes."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from shared.errors import ConfigurationError
from shared.models.envelope import TurnEnvelope
from shared.models.turn import TurnRequest, TurnStatus
from shared.modes import load_catalog
from shared.result import ErrorCode, InvokeResult, failure, success
from shared.settings import Settings, parse_api_keys
from shared.task_names import LAYER_OF, TASK_QUEUES, WEBHOOK_TASK, Layer, Queue, StepName, task_name
from workers.tools import ToolRegistry


def test_invoke_result_refuses_a_value_on_failure() -> None:
    with pytest.raises(ValidationError):
        InvokeResult[int](ok=False, value=1, error={"code": "internal_error", "message": "x"})
    with pytest.raises(ValidationError):
        InvokeResult[int](ok=True, value=1, error={"code": "internal_error", "message": "x"})
    assert success(3).unwrap() == 3
    with pytest.raises(ValueError, match="tool_failed"):
        failure(ErrorCode.TOOL_FAILED, "boom").unwrap()


def test_api_keys_parse_into_identities_and_bad_entries_are_refused() -> None:
    keys = parse_api_keys("k1:org1:user1, k2:org2:user2")
    assert (keys["k2"].org_id, keys["k2"].user_id) == ("org2", "user2")
    with pytest.raises(ValidationError):
        Settings(api_keys="just-a-key")


def test_llm_key_falls_back_to_openai_api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("APTIX_LLM_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-fallback")
    assert Settings().llm_api_key.get_secret_value() == "sk-fallback"
    monkeypatch.setenv("APTIX_LLM_API_KEY", "sk-aptix")
    assert Settings().llm_api_key.get_secret_value() == "sk-aptix"


def test_settings_refuse_nonsense_limits() -> None:
    with pytest.raises(ValidationError):
        Settings(max_iterations=0)
    with pytest.raises(ValidationError):
        Settings(llm_base_url="ftp://example")


def test_default_catalog_has_the_four_modes_and_always_offers_change_mode() -> None:
    catalog = load_catalog()
    assert {"general", "ddr-authoring", "workflow-authoring", "rag-indexing"} <= set(catalog.mode_names)
    assert catalog.default_mode == "general"
    for mode in catalog.modes:
        assert mode.server_tool_names[-1] == "agent_change_mode"


def test_catalog_naming_an_unknown_tool_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "modes.yaml"
    path.write_text("modes:\n  - name: general\n    tools: [no_such_tool]\n")
    with pytest.raises(ConfigurationError, match="no_such_tool"):
        load_catalog(path)


def test_catalog_without_its_default_mode_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "modes.yaml"
    path.write_text("default_mode: general\nmodes:\n  - name: other\n")
    with pytest.raises(ConfigurationError, match="default_mode"):
        load_catalog(path)


def test_operator_tool_with_a_handler_that_does_not_import_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "modes.yaml"
    path.write_text(
        "tools:\n  - name: lookup\n    handler: no_such_module:fn\nmodes:\n  - name: general\n    tools: [lookup]\n"
    )
    catalog = load_catalog(path)
    with pytest.raises(ConfigurationError, match="no_such_module"):
        ToolRegistry.from_catalog(catalog)


def test_every_layer_task_is_routed_to_its_queue() -> None:
    assert TASK_QUEUES[task_name(StepName.LLM_CALL)] is Queue.LLM
    assert TASK_QUEUES[task_name(StepName.EXECUTE_SERVER_TOOLS)] is Queue.TOOLS
    assert TASK_QUEUES[task_name(StepName.REASONER)] is Queue.PIPELINE
    assert set(TASK_QUEUES) == {
        "aptix.step.entry", "aptix.step.reasoner", "aptix.step.compose", "aptix.step.llm_call",
        "aptix.step.execute_server_tools", "aptix.step.persist", "aptix.webhook.deliver",
    }  # fmt: skip
    # Webhook deliveries wait on clients' endpoints: never in a turn's queues.
    assert TASK_QUEUES[WEBHOOK_TASK] is Queue.WEBHOOKS


def test_the_agn_032_entry_steps_are_one_layer_with_one_task() -> None:
    entry = {step for step, layer in LAYER_OF.items() if layer is Layer.ENTRY}
    assert entry == {
        StepName.REQUEST_HANDLER, StepName.SESSION_CREATOR, StepName.SESSION_RESTORER,
        StepName.CLIENT_TOOL_SESSION_RESTORER, StepName.SESSION_CONTEXT_RESOLVER,
        StepName.CONTEXT_PROVIDER_INITIALIZER, StepName.CLIENT_TOOL_CONTINUATION_RESOLVER,
    }  # fmt: skip
    assert {task_name(step) for step in entry} == {"aptix.step.entry"}


def test_envelope_step_key_separates_rounds_steps_and_iterations() -> None:
    env = TurnEnvelope(turn_id="t", step=StepName.REASONER, iteration=2)
    assert env.step_key == "0:0:reasoner:2"
    assert env.to(StepName.COMPOSE, iteration=3).step_key == "0:1:compose:3"
    retried = env.model_copy(update={"attempt": 1})
    assert retried.step_key == env.step_key
    with pytest.raises(ValidationError):
        TurnEnvelope.model_validate({"turn_id": "t", "step": "reasoner", "pickle": "x"})


def test_turn_request_normalises_empty_session_and_refuses_blank_input() -> None:
    assert TurnRequest(input="hi", session_id="").session_id is None
    with pytest.raises(ValidationError):
        TurnRequest(input="   ")
    with pytest.raises(ValidationError):
        TurnRequest(input="a\x00b")


def test_each_queue_has_its_own_exchange_and_routing_key() -> None:
    from shared.broker import create_producer

    app = create_producer(Settings())
    bindings = {(q.exchange.name, q.routing_key) for q in app.amqp.queues.values()}
    assert bindings == {(queue.value, queue.value) for queue in Queue}


def test_turn_status_classifies_itself() -> None:
    assert (
        {status for status in TurnStatus if status.is_terminal}
        == TurnStatus.terminal()
        == {TurnStatus.COMPLETED, TurnStatus.FAILED, TurnStatus.CANCELLED}
    )
    assert (
        {status for status in TurnStatus if status.is_unfinished}
        == TurnStatus.unfinished()
        == {TurnStatus.QUEUED, TurnStatus.RUNNING, TurnStatus.REQUIRES_CLIENT_TOOLS}
    )
    assert TurnStatus.terminal().isdisjoint(TurnStatus.unfinished())
    assert (
        {status for status in TurnStatus if status.is_in_flight}
        == TurnStatus.in_flight()
        == {TurnStatus.QUEUED, TurnStatus.RUNNING}
    )
    assert TurnStatus.in_flight() < TurnStatus.unfinished()
