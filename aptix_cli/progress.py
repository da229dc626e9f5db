"""A one-line progress bar for many turns: counts by status, rate and ETA.

:func:`render` is a pure function of the numbers, so it is easy to test; :class:`ProgressBar`
writes it to a stream. On a terminal it redraws the line in place (``\\r``) and ends it with a
newline; into a file or a pipe it writes a plain line at most every ``interval`` seconds and once
at the end, so logs are not flooded::

    bar = ProgressBar(sys.stderr, total=500)
    bar.update(done=312, counts={"completed": 300, "failed": 2, "running": 10, "queued": 188})
    bar.finish(done=500, counts={"completed": 498, "failed": 2})

renders ``[#########.........] 312/500 62%  completed 300 failed 2 running 10 queued 188  41.3 turns/s  ETA 4s``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import TextIO

from shared.models.turn import TurnStatus

__all__ = ["STATUS_ORDER", "ProgressBar", "format_duration", "render"]

STATUS_ORDER = (
    TurnStatus.COMPLETED,
    TurnStatus.FAILED,
    TurnStatus.CANCELLED,
    TurnStatus.REQUIRES_CLIENT_TOOLS,
    TurnStatus.RUNNING,
    TurnStatus.QUEUED,
)
"""Every status, in the order they are shown: terminal ones first, then those still unfinished."""

_DEFAULT_WIDTH = 30


def render(done: int, total: int, counts: Mapping[str, int], elapsed: float, width: int = _DEFAULT_WIDTH) -> str:
    """One progress line.

    Args:
        done: Turns that have finished (any status other than queued or running).
        total: All turns.
        counts: Turns by status; zero counts are left out, the order is :data:`STATUS_ORDER`
            followed by any other status.
        elapsed: Seconds since the work started; the rate is ``done / elapsed``.
        width: The number of cells between the brackets.

    Returns:
        E.g. ``[#####.....] 5/10 50%  completed 5 queued 5  2.5 turns/s  ETA 2s``. The ETA is
        ``--`` while nothing has finished, and ``done in <elapsed>`` once everything has.
    """
    width = max(width, 1)
    done = max(0, min(done, total)) if total > 0 else max(done, 0)
    fraction = done / total if total > 0 else 1.0
    filled = min(width, int(fraction * width))
    bar = "[" + "#" * filled + "." * (width - filled) + "]"
    parts = [f"{bar} {done}/{total} {int(fraction * 100)}%"]
    shown: list[tuple[str, int]] = [(status, counts[status]) for status in STATUS_ORDER if counts.get(status)]
    shown += [(status, count) for status, count in counts.items() if status not in STATUS_ORDER and count]
    if shown:
        parts.append(" ".join(f"{status} {count}" for status, count in shown))
    rate = done / elapsed if elapsed > 0 else 0.0
    parts.append(f"{rate:.1f} turns/s")
    if total > 0 and done >= total:
        parts.append(f"done in {format_duration(elapsed)}")
    elif rate > 0:
        parts.append(f"ETA {format_duration((total - done) / rate)}")
    else:
        parts.append("ETA --")
    return "  ".join(parts)


def format_duration(seconds: float) -> str:
    """``4s``, ``2m05s`` or ``1h02m`` (rounded up to whole seconds, so a short wait never shows ``0s``)."""
    whole = max(0, int(seconds + 0.999))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class ProgressBar:
    """Writes :func:`render` lines to a stream: redrawn in place on a TTY, throttled otherwise.

    Args:
        stream: Where to write (usually ``sys.stderr``).
        total: All turns.
        width: Cells in the bar.
        interval: On a non-TTY, the fewest seconds between two lines.
        tty: Whether to redraw in place; ``None`` asks ``stream.isatty()``.
        clock: A monotonic clock (tests pass a fake one).
    """

    def __init__(
        self,
        stream: TextIO,
        *,
        total: int,
        width: int = _DEFAULT_WIDTH,
        interval: float = 5.0,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self._stream = stream
        self._width = width
        self._interval = interval
        self._tty = _isatty(stream) if tty is None else tty
        self._clock = clock
        self._started = clock()
        self._last_written: float | None = None
        self._last_line = ""
        self._drawn = 0

    @property
    def elapsed(self) -> float:
        """Seconds since the bar was made."""
        return self._clock() - self._started

    def update(self, done: int, counts: Mapping[str, int]) -> None:
        """Show the current numbers (on a non-TTY only if ``interval`` has passed since the last line)."""
        now = self._clock()
        line = render(done, self.total, counts, now - self._started, self._width)
        if self._tty:
            self._redraw(line)
        elif self._last_written is None or now - self._last_written >= self._interval:
            self._stream.write(line + "\n")
            self._last_line = line
        else:
            return
        self._last_written = now
        self._stream.flush()

    def finish(self, done: int, counts: Mapping[str, int]) -> None:
        """Show the final numbers and end the line."""
        line = render(done, self.total, counts, self.elapsed, self._width)
        if self._tty:
            self._redraw(line)
            self._stream.write("\n")
        elif line != self._last_line:
            self._stream.write(line + "\n")
        self._stream.flush()

    def interrupt(self) -> None:
        """End a line drawn in place, so an error message that follows starts on a line of its own."""
        if self._tty and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = 0

    def _redraw(self, line: str) -> None:
        # Pad with spaces so a shorter line fully covers the previous one.
        self._stream.write("\r" + line + " " * max(0, self._drawn - len(line)))
        self._drawn = len(line)
        self._last_line = line


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False
