"""The tool-results pre-check of ``aptix tool-results``: call ids against the turn's pending calls."""

from __future__ import annotations

from typing import Any

from aptix_cli.client_commands import check_call_ids


def _paused(*call_ids: str) -> dict[str, Any]:
    calls = [{"call_id": call_id, "name": "open_file", "arguments": "{}"} for call_id in call_ids]
    return {"turn_id": "t1", "status": "requires_client_tools", "pending_tool_calls": calls}


def test_results_for_exactly_the_pending_calls_pass() -> None:
    assert check_call_ids(_paused("c1", "c2"), ["c2", "c1"]) is None


def test_a_misspelled_call_id_is_named_with_the_pending_ones() -> None:
    problem = check_call_ids(_paused("call_abc"), ["call_abd"])
    assert problem is not None
    assert "not pending: call_abd" in problem and "missing: call_abc" in problem
    assert "(call_abc)" in problem and "--no-check" in problem


def test_a_call_id_given_twice_is_refused() -> None:
    problem = check_call_ids(_paused("c1"), ["c1", "c1"])
    assert problem is not None and "given twice: c1" in problem


def test_a_pending_call_left_out_is_refused() -> None:
    problem = check_call_ids(_paused("c1", "c2"), ["c1"])
    assert problem is not None and "missing: c2" in problem and "not pending" not in problem


def test_a_turn_not_waiting_for_tools_is_left_to_the_gateway() -> None:
    assert check_call_ids({"turn_id": "t1", "status": "completed", "pending_tool_calls": []}, ["c1"]) is None
