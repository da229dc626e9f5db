"""AdmissionWindow: how many turns may be in flight in all, sized so that step messages barely queue.

Every organisation's cap (``APTIX_ORG_MAX_IN_FLIGHT``) bounds what one organisation holds in flight;
it cannot say how many turns the workers run without a queue: that depends on the model's latency,
the tools, the hosts. Too few and the workers idle; too many and every message, an interactive
turn's included, waits behind the batch inside the workers, where priorities no longer apply.

The window finds the number from what the workers measure: the shortest wait of a step message between
its sending and its task's start in each half second (``workers.dispatch_delays``), against a target
(``APTIX_ADMISSION_TARGET_DELAY_MS``; CoDel's reading of a queue: when even the shortest wait is above
the target, the queue stays, it is not a burst). The admission scheduler updates it every
:data:`CONTROL_SECONDS`:

- the wait is above the target: the window shrinks by a fifth, once the turns in flight have come
  down to it (the last cut took effect: one cut per drain, not one per look);
- below the target, while turns are held and the window is full: it grows by a quarter when the wait
  is under half the target (or no worker reported: nothing started lately, as when every turn waits on
  a slow model), by a sixteenth when it is closer;
- never under :data:`FLOOR` nor over :data:`CEILING`.

A batch behind a fast model settles at the few turns the cores run at once; behind a 200 ms model at
the many that keep the cores busy while each waits. The window only holds back releases of held
(batch) turns: interactive turns are never held, and count in it.
"""

from __future__ import annotations

from collections.abc import Sequence

from shared.state.admission import DelayReport

__all__ = ["CEILING", "CONTROL_SECONDS", "FLOOR", "AdmissionWindow", "combined_delay"]

CONTROL_SECONDS = 0.5
"""How often the active scheduler resizes the window (each worker process reports about as often)."""
FLOOR = 2
"""The fewest turns the window lets run: a batch always moves."""
CEILING = 100_000
INITIAL = 8
"""The window a scheduler starts with; it reaches a 200 ms model's ~100 within seconds."""
_CUT = 0.8
_FAST_GROWTH = 1.25
_SLOW_GROWTH = 1.0625


class AdmissionWindow:
    """The most turns in flight across organisations, resized from the workers' dispatch delays."""

    def __init__(self, *, target_seconds: float, initial: int = INITIAL) -> None:
        """Start at ``initial`` turns, aiming at dispatch delays of ``target_seconds`` at most."""
        self.target = target_seconds
        self.size = max(FLOOR, min(CEILING, initial))

    def update(self, delay: float | None, *, in_flight: int, held: int) -> int:
        """Resize from the workers' ``delay`` (seconds; None when none reported lately), the turns ``in_flight``
        and ``held`` in all; the new size."""
        if delay is not None and delay > self.target:
            if in_flight <= self.size:
                self.size = max(FLOOR, int(self.size * _CUT))
        elif held > 0 and in_flight >= self.size - max(1, self.size // 10):
            growth = _FAST_GROWTH if delay is None or delay < self.target / 2 else _SLOW_GROWTH
            self.size = min(CEILING, max(self.size + 1, int(self.size * growth)))
        return self.size


def combined_delay(reports: Sequence[DelayReport]) -> float | None:
    """The workers' shortest delays, each weighted by the task starts it covers (a process that started one
    task says little); None without reports."""
    samples = sum(report.samples for report in reports)
    if samples == 0:
        return None
    return sum(report.least * report.samples for report in reports) / samples
