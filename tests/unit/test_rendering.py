"""What the client commands print: turns, traces, sessions and batch summaries."""

from __future__ import annotations

from aptix_cli.rendering import (
    batch_counts_line,
    batch_summary,
    failed_turn_line,
    session_lines,
    trace_table,
    turn_lines,
)


def test_turn_lines_show_the_answer_status_and_ids_of_a_completed_turn() -> None:
    turn = {"turn_id": "t1", "session_id": "s1", "status": "completed", "mode": "general", "output_text": "Hi."}
    assert turn_lines(turn) == ["Hi.", "", "status: completed  mode: general", "turn: t1  session: s1"]


def test_turn_lines_say_how_to_answer_pending_tool_calls() -> None:
    turn = {
        "turn_id": "t1",
        "session_id": "s1",
        "status": "requires_client_tools",
        "pending_tool_calls": [{"call_id": "c1", "name": "open_file", "arguments": '{"path": "a"}'}],
    }
    lines = turn_lines(turn)
    assert lines[-2] == '  c1  open_file  {"path": "a"}'
    assert lines[-1] == "send the outputs with: aptix tool-results t1 --result c1=OUTPUT"


def test_turn_lines_say_a_running_turn_goes_on_at_the_gateway() -> None:
    lines = turn_lines({"turn_id": "t1", "session_id": "s1", "status": "running"})
    assert lines[-1] == "the turn is still running; it goes on at the gateway"


def test_trace_table_aligns_rows_and_counts_the_steps() -> None:
    trace = {
        "turn_id": "t1",
        "steps": [
            {"seq": 1, "kind": "step", "step": "request_handler", "worker": "w1", "duration_ms": 1.25,
             "data": {"round": 0, "iteration": 0, "mode": "general"}},
        ],
    }  # fmt: skip
    lines = trace_table(trace)
    assert lines[0].split() == ["seq", "kind", "step", "worker", "r", "i", "ms", "details"]
    assert lines[1].split() == ["1", "step", "request_handler", "w1", "0", "0", "1.2", "mode=general"]
    assert lines[-1] == "1 steps, turn t1"


def test_session_lines_list_the_mode_history_and_the_turns() -> None:
    session = {
        "session_id": "s1",
        "mode": "ddr-authoring",
        "created_at": "c",
        "updated_at": "u",
        "mode_history": [{"from": "general", "to": "ddr-authoring", "at": "a", "reason": "why"}],
        "turns": [{"turn_id": "t1", "status": "completed", "created_at": "c1"}],
    }
    assert session_lines(session) == [
        "session s1  mode: ddr-authoring",
        "created c  updated u",
        "mode history (1):",
        "  general -> ddr-authoring  at a  why",
        "turns (1):",
        "  t1  completed  c1",
    ]


def test_batch_summary_always_shows_the_terminal_statuses() -> None:
    line = batch_summary("b1", {"completed": 9, "requires_client_tools": 1}, done=10, elapsed=2.0)
    assert line == "batch b1 finished: completed 9 failed 0 cancelled 0 requires_client_tools 1  in 2.0s  5.0 turns/s"


def test_failed_turn_line_names_the_error() -> None:
    turn = {"status": "failed", "turn_id": "t1", "error": {"code": "llm_error", "message": "boom"}}
    assert failed_turn_line(turn) == "failed t1: llm_error: boom"


def _long_trace() -> dict[str, object]:
    details = {"round": 0, "iteration": 1, "tools": [f"tool_number_{i}" for i in range(12)]}
    step = {"seq": 1, "kind": "llm_call", "step": "llm_call", "worker": "w1", "duration_ms": 2.0, "data": details}
    return {"turn_id": "t1", "steps": [step]}


def test_trace_table_cuts_the_details_to_the_width() -> None:
    lines = trace_table(_long_trace())
    assert len(lines[1]) == 120 and lines[1].endswith("...")


def test_trace_table_without_a_width_keeps_every_detail() -> None:
    lines = trace_table(_long_trace(), width=None)
    assert len(lines[1]) > 120 and lines[1].endswith('"tool_number_11"]')


def test_batch_counts_line_names_every_status_in_order() -> None:
    line = batch_counts_line({"completed": 3, "running": 1})
    assert line == "completed 3 failed 0 cancelled 0 requires_client_tools 0 running 1 queued 0"
