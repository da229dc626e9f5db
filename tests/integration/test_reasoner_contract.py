"""The reasoner contract (AGN-031 §11, AGN-011 §4-5, TUL-007) over HTTP, with real workers.

Server tools, mid-turn mode changes, the client-tool pause and re-entry, ledger verification,
turn-context clearing, failures, busy sessions, cancel and the client-tool timeout.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from tests.integration.conftest import OPEN_FILE, System
from tests.integration.events import TaskEventRecorder
from tests.responses_fixtures import validate_request_bodies
from tests.support.waiting import wait_for

pytestmark = pytest.mark.integration


def _marker() -> str:
    return f"m{uuid.uuid4().hex[:10]}"


def _call(name: str, arguments: dict[str, Any] | None = None) -> str:
    return f"[[call:{name} {json.dumps(arguments or {})}]]"


def _kinds(trace: list[dict[str, Any]]) -> list[str]:
    return [step["kind"] for step in trace]


def test_server_tool_result_goes_back_to_the_model_when_the_model_calls_one(system: System) -> None:
    marker = _marker()
    turn = system.run_turn({"input": f"{_call('get_current_time')} what time is it {marker}"})
    assert turn["status"] == "completed", turn
    assert turn["output_text"].startswith("Tool results: get_current_time=20")
    assert turn["usage"]["llm_calls"] == 2
    first, second = system.llm_requests(marker)
    call, output = second["input"][-2:]
    assert call["type"] == "function_call" and call["name"] == "get_current_time"
    assert output == {"type": "function_call_output", "call_id": call["call_id"], "output": output["output"]}
    trace = system.trace(turn["turn_id"])
    assert [s["data"]["tool"] for s in trace if s["kind"] == "tool_execution"] == ["get_current_time"]
    validate_request_bodies([first, second])


def test_operator_tool_gets_validated_arguments_and_the_tool_context(system: System) -> None:
    turn = system.run_turn({"input": f"{_call('whoami')} {_marker()}"})
    assert turn["status"] == "completed"
    context = json.loads(turn["output_text"].removeprefix("Tool results: whoami="))
    call_id = context["call_id"]
    assert call_id.startswith("call_")
    assert context == {
        "session_id": turn["session_id"], "turn_id": turn["turn_id"], "org_id": "org-a", "user_id": "user-a",
        "mode": "general", "call_id": call_id, "idempotency_key": f"{turn['turn_id']}:{call_id}",
    }  # fmt: skip


def test_invalid_tool_arguments_are_refused_without_running_the_tool(system: System) -> None:
    key = _marker()
    turn = system.run_turn({"input": f"{_call('record_call', {'key': 5})} {key}"})
    assert turn["status"] == "completed"
    assert "invalid arguments for record_call" in turn["output_text"]
    assert system.tool_calls("5") == 0


def test_mode_change_applies_to_the_next_call_of_the_same_turn(system: System) -> None:
    # Given a turn whose model asks to switch to ddr-authoring
    marker = _marker()
    change = _call("agent_change_mode", {"targetMode": "ddr-authoring", "reason": "the user wants a DDR"})
    # When it runs
    turn = system.run_turn({"input": f"{change} write a DDR {marker}"})
    # Then the turn ends in the new mode, and the second call used its prompt layer, tools and welcome
    assert turn["status"] == "completed", turn
    assert turn["mode"] == "ddr-authoring"
    assert turn["mode_changes"] == [
        {"from": "general", "to": "ddr-authoring", "reason": "the user wants a DDR", "branch": False}
    ]
    first, second = system.llm_requests(marker)
    assert "general" in first["instructions"] and "ddr-authoring" in second["instructions"]
    assert [t["name"] for t in second["tools"]] == ["get_current_time", "agent_change_mode"]
    developer = [item["content"] for item in second["input"] if item.get("role") == "developer"]
    assert developer == ["DDR authoring mode is on. Ask for the record's id and title if the user has not given them."]
    result = json.loads(second["input"][-1]["output"])
    assert result["success"] is True and result["mode"] == "ddr-authoring" and result["branch"] is False
    session = system.session(turn["session_id"])
    assert session["mode"] == "ddr-authoring"
    assert [(h["from"], h["to"], h["reason"]) for h in session["mode_history"]] == [
        ("general", "ddr-authoring", "the user wants a DDR")
    ]
    kinds = _kinds(system.trace(turn["turn_id"]))
    assert kinds.count("welcome_emitted") == 2 and "mode_change" in kinds


def test_branch_flag_is_surfaced_when_the_model_sets_it(system: System) -> None:
    change = _call("agent_change_mode", {"targetMode": "rag-indexing", "branch": True})
    turn = system.run_turn({"input": f"{change} {_marker()}"})
    assert turn["mode_changes"][0]["branch"] is True
    assert turn["mode"] == "rag-indexing"


def test_rejected_mode_change_is_a_normal_result_and_the_mode_stays(system: System) -> None:
    marker = _marker()
    turn = system.run_turn({"input": f"{_call('agent_change_mode', {'targetMode': 'astrology'})} {marker}"})
    assert turn["status"] == "completed"
    assert turn["mode"] == "general" and turn["mode_changes"] == []
    result = json.loads(system.llm_requests(marker)[1]["input"][-1]["output"])
    assert result["success"] is False and result["mode"] == "general"
    assert "astrology" in result["message"] and "rag-indexing" in result["valid_modes"]
    assert system.session(turn["session_id"])["mode_history"] == []
    assert "mode_change_rejected" in _kinds(system.trace(turn["turn_id"]))


def test_two_mode_changes_in_one_response_keep_the_last_and_record_both(system: System) -> None:
    first = _call("agent_change_mode", {"targetMode": "ddr-authoring"})
    second = _call("agent_change_mode", {"targetMode": "rag-indexing"})
    turn = system.run_turn({"input": f"{first} {second} {_marker()}"})
    assert turn["status"] == "completed"
    assert turn["mode"] == "rag-indexing"
    assert [(c["from"], c["to"]) for c in turn["mode_changes"]] == [
        ("general", "ddr-authoring"), ("ddr-authoring", "rag-indexing")
    ]  # fmt: skip
    history = system.session(turn["session_id"])["mode_history"]
    assert [(h["from"], h["to"]) for h in history] == [("general", "ddr-authoring"), ("ddr-authoring", "rag-indexing")]


def test_client_tool_call_pauses_the_turn_and_results_resume_it(system: System) -> None:
    # Given a turn whose model calls a client tool
    marker = _marker()
    paused = system.run_turn({"input": f"{_call('open_file', {'path': 'a.txt'})} {marker}", "tools": [OPEN_FILE]})
    # Then it pauses with the pending call (exit mode 2)
    assert paused["status"] == "requires_client_tools", paused
    (pending,) = paused["pending_tool_calls"]
    assert pending["name"] == "open_file" and json.loads(pending["arguments"]) == {"path": "a.txt"}
    # When the client posts the output
    done = system.resume(paused["turn_id"], [{"call_id": pending["call_id"], "output": "hello from a.txt"}])
    # Then the same turn completes, and the model saw its call followed by the output
    assert done["status"] == "completed", done
    assert done["turn_id"] == paused["turn_id"]
    assert done["output_text"] == "Tool results: open_file=hello from a.txt"
    assert done["pending_tool_calls"] == []
    resumed = system.llm_requests(marker)[-1]
    assert resumed["input"][-2]["type"] == "function_call" and resumed["input"][-2]["call_id"] == pending["call_id"]
    assert resumed["input"][-1] == {
        "type": "function_call_output", "call_id": pending["call_id"], "output": "hello from a.txt"
    }  # fmt: skip
    kinds = _kinds(system.trace(done["turn_id"]))
    assert kinds.index("exit") < kinds.index("reentry_verification")
    assert [s["data"]["exit_mode"] for s in system.trace(done["turn_id"]) if s["kind"] == "exit"] == [2, 1]


def _pause(system: System, calls: int = 1) -> dict[str, Any]:
    directives = " ".join(_call("open_file", {"path": f"{i}.txt"}) for i in range(calls))
    turn = system.run_turn({"input": f"{directives} {_marker()}", "tools": [OPEN_FILE]})
    assert turn["status"] == "requires_client_tools", turn
    assert len(turn["pending_tool_calls"]) == calls
    return turn


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("missing", "missing results"),
        ("extra", "not expected"),
        ("unknown", "unknown call ids"),
    ],
)
def test_reentry_with_mismatched_results_fails_continuation_mismatch(system: System, case: str, expected: str) -> None:
    turn = _pause(system, calls=2)
    first, second = (call["call_id"] for call in turn["pending_tool_calls"])
    results = {
        "missing": [{"call_id": first, "output": "one"}],
        "extra": [{"call_id": first, "output": "one"}, {"call_id": second, "output": "2"},
                  {"call_id": second, "output": "2"}],
        "unknown": [{"call_id": first, "output": "one"}, {"call_id": second, "output": "2"},
                    {"call_id": "call_nope", "output": "x"}],
    }[case]  # fmt: skip
    failed = system.resume(turn["turn_id"], results)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "continuation_mismatch"
    assert expected in failed["error"]["message"]
    verification = [s for s in system.trace(turn["turn_id"]) if s["kind"] == "reentry_verification"]
    assert verification and verification[0]["data"]["ok"] is False
    # A failed turn never breaks its session
    follow_up = system.run_turn({"session_id": turn["session_id"], "input": f"still there? {_marker()}"})
    assert follow_up["status"] == "completed"


def test_tool_results_are_409_when_the_turn_is_not_waiting(system: System) -> None:
    turn = system.run_turn({"input": f"plain {_marker()}"})
    response = system.post_results(turn["turn_id"], [{"call_id": "call_x", "output": "x"}])
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "turn_not_awaiting_tool_results"


def test_tool_results_are_422_and_the_turn_still_waits_when_an_output_has_a_lone_surrogate(system: System) -> None:
    # Given a turn paused on a client call
    turn = _pause(system)
    call_id = turn["pending_tool_calls"][0]["call_id"]
    # When its output carries half a surrogate pair (text UTF-8 cannot encode)
    response = system.http.post(
        f"/v1/turns/{turn['turn_id']}/tool-results",
        content=b'{"tool_results": [{"call_id": "%s", "output": "half a pair \\ud800"}]}' % call_id.encode(),
        headers={**system.headers(), "Content-Type": "application/json"},
    )
    # Then they are refused as invalid, and the turn still waits for valid ones
    assert response.status_code == 422, response.text
    assert response.json()["error"]["code"] == "invalid_request"
    assert system.wait_turn(turn["turn_id"])["status"] == "requires_client_tools"
    resumed = system.resume(turn["turn_id"], [{"call_id": call_id, "output": "fine"}])
    assert resumed["status"] == "completed", resumed


def test_turn_context_is_cleared_after_its_one_emission(system: System) -> None:
    marker = _marker()
    turn = system.run_turn({"input": f"{_call('get_current_time')} {marker}"})
    first, second = system.llm_requests(marker)
    assert any(item.get("role") == "developer" for item in first["input"])
    assert not any(item.get("role") == "developer" for item in second["input"])
    kinds = _kinds(system.trace(turn["turn_id"]))
    assert kinds.index("welcome_emitted") < kinds.index("llm_call") < kinds.index("turn_context_cleared")


def test_server_tool_runs_once_across_a_pause_and_resume_when_a_response_mixes_both(system: System) -> None:
    key = _marker()
    directives = f"{_call('record_call', {'key': key})} {_call('open_file', {'path': 'b.txt'})}"
    paused = system.run_turn({"input": f"{directives} {key}", "tools": [OPEN_FILE]})
    assert paused["status"] == "requires_client_tools"
    assert [c["name"] for c in paused["pending_tool_calls"]] == ["open_file"]
    assert system.tool_calls(key) == 1
    done = system.resume(paused["turn_id"], [{"call_id": paused["pending_tool_calls"][0]["call_id"], "output": "B"}])
    assert done["status"] == "completed"
    assert done["output_text"] == f"Tool results: record_call=recorded {key} #1; open_file=B"
    assert system.tool_calls(key) == 1


def test_unknown_tool_fails_the_turn_with_unknown_tool(system: System) -> None:
    turn = system.run_turn({"input": f"{_call('format_disk')} {_marker()}"})
    assert turn["status"] == "failed"
    assert turn["error"]["code"] == "unknown_tool"
    assert "format_disk" in turn["error"]["message"]


def test_failing_tool_fails_the_turn_with_its_message(system: System) -> None:
    turn = system.run_turn({"input": f"{_call('explode', {'reason': 'disk on fire'})} {_marker()}"})
    assert turn["status"] == "failed"
    assert turn["error"]["code"] == "tool_failed"
    assert "disk on fire" in turn["error"]["message"]


def test_tool_that_overruns_its_timeout_fails_the_turn(system: System) -> None:
    turn = system.run_turn({"input": f"{_call('sleepy', {'seconds': 3})} {_marker()}"})
    assert turn["status"] == "failed"
    assert turn["error"]["code"] == "tool_failed"
    assert "timed out" in turn["error"]["message"]


def test_iteration_limit_fails_the_turn_when_the_model_never_stops(system: System) -> None:
    turn = system.run_turn({"input": f"[[loop]] {_marker()}"})
    assert turn["status"] == "failed"
    assert turn["error"]["code"] == "iteration_limit"
    assert "10" in turn["error"]["message"]
    assert turn["usage"]["llm_calls"] == 10


def test_session_with_a_paused_turn_is_busy(system: System) -> None:
    turn = _pause(system)
    response = system.post_turn({"session_id": turn["session_id"], "input": "next"})
    assert response.status_code == 409
    assert response.json()["error"]["code"] == "session_busy"


def test_cancel_ends_a_paused_turn_and_frees_its_session(system: System) -> None:
    turn = _pause(system)
    response = system.http.post(f"/v1/turns/{turn['turn_id']}/cancel", headers=system.headers())
    assert response.status_code == 200
    cancelled = response.json()
    assert cancelled["status"] == "cancelled"
    assert cancelled["error"]["code"] == "cancelled"
    assert system.post_results(turn["turn_id"], [{"call_id": "x", "output": "y"}]).status_code == 409
    again = system.http.post(f"/v1/turns/{turn['turn_id']}/cancel", headers=system.headers())
    assert again.status_code == 409 and again.json()["error"]["code"] == "turn_finished"
    follow_up = system.run_turn({"session_id": turn["session_id"], "input": f"after cancel {_marker()}"})
    assert follow_up["status"] == "completed"


def test_cancel_stops_a_running_turn(system: System, task_events: TaskEventRecorder) -> None:
    # Given a turn whose first model call is in flight (it answers after 1.5 s with a tool call)
    marker = _marker()
    started = system.post_turn({"input": f"[[sleep:1500]] {_call('get_current_time')} {marker}"})
    turn_id = started.json()["turn_id"]
    wait_for(lambda: system.llm_requests(marker), what="the turn's first model call")
    # When it is cancelled
    response = system.http.post(f"/v1/turns/{turn_id}/cancel", headers=system.headers())
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    # Then the call in flight ends, its task (the default boundaries: the entry's) runs the reasoner after it and
    # sends the tool's message, whose start finds the turn cancelled and ends the chain: no tool runs and no second
    # call is made (without the cancel the tool result would make one)
    results = wait_for(lambda: task_events.succeeded_results(turn_id)[1:] and task_events.succeeded_results(turn_id),
                       what="the tool's task")  # fmt: skip
    assert re.fullmatch(r"'ran request_handler .*, llm_call [\d.]+ ms, reasoner [\d.]+ ms; next execute_server_tools'",
                        results[0]), results  # fmt: skip
    assert results[1:] == ["None"]  # it ran no step
    final = system.wait_turn(turn_id)
    assert final["status"] == "cancelled"
    assert task_events.succeeded_tasks(turn_id) == ["aptix.step.entry", "aptix.step.execute_server_tools"]
    assert len(system.llm_requests(marker)) == 1, "the turn went on after it was cancelled"


def test_paused_turn_fails_client_tool_timeout_when_results_do_not_come(
    system: System, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    url = extra_gateway({"APTIX_CLIENT_TOOL_TIMEOUT_SECONDS": "1"})
    turn = _pause(system)

    def expired() -> dict[str, Any] | None:
        response = system.http.get(f"{url}/v1/turns/{turn['turn_id']}", headers=system.headers())
        assert response.status_code == 200
        current: dict[str, Any] = response.json()
        return None if current["status"] == "requires_client_tools" else current

    failed = wait_for(expired, what="the paused turn's client-tool timeout", seconds=15, interval=0.2)
    assert failed["status"] == "failed"
    assert failed["error"]["code"] == "client_tool_timeout"
    assert "1s" in failed["error"]["message"]
    late = system.http.post(
        f"{url}/v1/turns/{turn['turn_id']}/tool-results",
        json={"tool_results": [{"call_id": turn["pending_tool_calls"][0]["call_id"], "output": "late"}]},
        headers=system.headers(),
    )
    assert late.status_code == 409


def test_modes_endpoint_lists_the_catalog(system: System) -> None:
    response = system.http.get("/v1/modes", headers=system.headers())
    assert response.status_code == 200
    modes = {mode["name"]: mode for mode in response.json()["modes"]}
    assert {"general", "ddr-authoring", "workflow-authoring", "rag-indexing"} <= set(modes)
    assert modes["workflow-authoring"]["tools"] == ["agent_change_mode"]


def test_turn_actions_refuse_bad_callers_and_bodies_without_touching_the_turn(system: System) -> None:
    from tests.conftest import KEY_B

    turn = _pause(system)
    turn_id = turn["turn_id"]
    no_key = system.http.post(f"/v1/turns/{turn_id}/tool-results", content=b"{not json")
    assert no_key.status_code == 401 and no_key.json()["error"]["code"] == "unauthorized"
    for body in ({"tool_results": "x"}, {"tool_results": [{"call_id": "", "output": "x"}]}, {"results": []}):
        invalid = system.http.post(f"/v1/turns/{turn_id}/tool-results", json=body, headers=system.headers())
        assert invalid.status_code == 422 and invalid.json()["error"]["code"] == "invalid_request"
    for method, path in (
        ("POST", f"/v1/turns/{turn_id}/tool-results"),
        ("POST", f"/v1/turns/{turn_id}/cancel"),
        ("GET", f"/v1/turns/{turn_id}/trace"),
    ):
        other_org = system.http.request(
            method, path, headers=system.headers(KEY_B), json={"tool_results": []} if "results" in path else None
        )
        assert other_org.status_code == 404, (path, other_org.text)
    unknown = system.http.post("/v1/turns/turn_nope/cancel", headers=system.headers())
    assert unknown.status_code == 404
    assert system.wait_turn(turn_id)["status"] == "requires_client_tools"


def test_tool_results_are_503_and_change_nothing_when_the_broker_is_down(
    system: System, extra_gateway: Callable[[dict[str, str]], str]
) -> None:
    from aptix_cli.launcher import free_port

    turn = _pause(system)
    url = extra_gateway({"APTIX_BROKER_URL": f"redis://127.0.0.1:{free_port()}/0"})
    call_id = turn["pending_tool_calls"][0]["call_id"]
    refused = system.http.post(
        f"{url}/v1/turns/{turn['turn_id']}/tool-results",
        json={"tool_results": [{"call_id": call_id, "output": "x"}]},
        headers=system.headers(),
        timeout=60,
    )
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable"
    still = system.wait_turn(turn["turn_id"])
    assert still["status"] == "requires_client_tools" and still["pending_tool_calls"] == turn["pending_tool_calls"]
    done = system.resume(turn["turn_id"], [{"call_id": call_id, "output": "after the outage"}])
    assert done["status"] == "completed" and done["output_text"] == "Tool results: open_file=after the outage"
