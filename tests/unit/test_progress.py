"""The batch progress bar: the pure ``render`` line and the TTY / non-TTY writer."""

from __future__ import annotations

import io

import pytest

from aptix_cli.progress import ProgressBar, format_duration, render


def test_render_shows_an_empty_bar_and_no_eta_when_nothing_has_finished() -> None:
    line = render(0, 500, {"queued": 500}, 0.0, 10)
    assert line == "[..........] 0/500 0%  queued 500  0.0 turns/s  ETA --"


def test_render_fills_half_the_bar_and_estimates_the_rest_when_half_is_done() -> None:
    line = render(250, 500, {"completed": 240, "failed": 10, "running": 50, "queued": 200}, 10.0, 10)
    assert line == "[#####.....] 250/500 50%  completed 240 failed 10 running 50 queued 200  25.0 turns/s  ETA 10s"


def test_render_says_done_in_elapsed_when_every_turn_has_finished() -> None:
    line = render(20, 20, {"completed": 19, "failed": 1}, 4.0, 8)
    assert line == "[########] 20/20 100%  completed 19 failed 1  5.0 turns/s  done in 4s"


def test_render_leaves_zero_counts_out_and_keeps_the_status_order() -> None:
    counts = {"queued": 3, "running": 0, "cancelled": 1, "completed": 6, "requires_client_tools": 0}
    line = render(7, 10, counts, 1.0, 10)
    assert "  completed 6 cancelled 1 queued 3  " in line
    assert "running" not in line and "requires_client_tools" not in line


@pytest.mark.parametrize(
    ("done", "elapsed", "eta"), [(312, 7.55, "ETA 5s"), (10, 10.0, "ETA 8m10s"), (1, 60.0, "ETA 8h19m")]
)
def test_render_formats_the_eta_in_seconds_minutes_or_hours(done: int, elapsed: float, eta: str) -> None:
    assert render(done, 500, {}, elapsed).endswith(eta)


@pytest.mark.parametrize("width", [1, 18, 40])
def test_render_bar_has_the_requested_width(width: int) -> None:
    line = render(312, 500, {}, 1.0, width)
    bar = line[: line.index("]") + 1]
    assert len(bar) == width + 2
    assert bar.count("#") == int(312 / 500 * width)


def test_render_matches_the_documented_example() -> None:
    counts = {"completed": 300, "failed": 2, "running": 10, "queued": 188}
    line = render(312, 500, counts, 7.55, 18)
    expected = "[###########.......] 312/500 62%  completed 300 failed 2 running 10 queued 188  41.3 turns/s  ETA 5s"
    assert line == expected


def test_render_clamps_done_and_survives_an_empty_batch() -> None:
    assert render(12, 10, {}, 1.0, 4).startswith("[####] 10/10 100%")
    assert render(0, 0, {}, 0.0, 4).startswith("[####] 0/0 100%")


def test_format_duration_rounds_up_to_a_whole_second() -> None:
    durations = [format_duration(s) for s in (0, 0.2, 59.5, 60, 125, 3725)]
    assert durations == ["0s", "1s", "1m00s", "1m00s", "2m05s", "1h02m"]


class _Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_bar_redraws_in_place_and_ends_with_a_newline_on_a_tty() -> None:
    # Given a bar on a terminal
    stream, clock = io.StringIO(), _Clock()
    bar = ProgressBar(stream, total=4, width=4, tty=True, clock=clock)
    # When it is updated twice and finished
    bar.update(0, {"queued": 4})
    clock.now += 1
    bar.update(2, {"completed": 2, "queued": 2})
    clock.now += 1
    bar.finish(4, {"completed": 4})
    # Then each draw starts with \r, shorter lines are padded over the old one, and a newline ends it
    text = stream.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and text.count("\n") == 1
    draws = text.rstrip("\n").split("\r")[1:]
    assert draws[1].startswith("[##..] 2/4 50%") and "ETA 1s" in draws[1]
    assert draws[2].startswith("[####] 4/4 100%  completed 4  2.0 turns/s  done in 2s")
    assert len(draws[2]) >= len(draws[1])


def test_bar_writes_plain_lines_at_most_every_interval_when_not_a_tty() -> None:
    # Given a bar writing to a log, at most every 5 seconds
    stream, clock = io.StringIO(), _Clock()
    bar = ProgressBar(stream, total=10, width=10, interval=5.0, tty=False, clock=clock)
    # When it is updated every second for 7 seconds, then finished
    for done in range(8):
        bar.update(done, {"completed": done, "queued": 10 - done})
        clock.now += 1
    bar.finish(10, {"completed": 10})
    # Then it wrote the first update, the one 5 s later and the final line; no \r anywhere
    lines = stream.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == ["0/10", "5/10", "10/10"]
    assert "\r" not in stream.getvalue()


def test_bar_does_not_repeat_the_final_line_when_it_was_just_written() -> None:
    stream, clock = io.StringIO(), _Clock()
    bar = ProgressBar(stream, total=2, width=2, tty=False, clock=clock)
    bar.update(2, {"completed": 2})
    bar.finish(2, {"completed": 2})
    assert len(stream.getvalue().splitlines()) == 1


def test_bar_interrupt_ends_a_line_drawn_in_place_only() -> None:
    stream = io.StringIO()
    bar = ProgressBar(stream, total=2, tty=True, clock=_Clock())
    bar.interrupt()
    assert stream.getvalue() == ""
    bar.update(1, {"completed": 1, "queued": 1})
    bar.interrupt()
    assert stream.getvalue().startswith("\r[") and stream.getvalue().endswith("\n")
