"""``aptix bench``: figures of the production shape (separate processes, real services), printed, never asserted.

:func:`run_bench` runs the gateway, the worker processes and the scripted model as processes of their
own on a scratch PostgreSQL database and two scratch Redis databases (:mod:`.production`); with
``--embedded`` it runs the old in-process measurement instead (:mod:`.embedded`). Submodules are
imported only when run: ``bare_chain`` is loaded by Celery worker processes that must not pay for
the rest.
"""

from __future__ import annotations

from aptix_cli.bench.options import BenchOptions

__all__ = ["BenchOptions", "run_bench", "run_embedded"]


def run_bench(options: BenchOptions) -> int:
    """Start the production shape, measure, print, clean up.

    Returns:
        0 when every turn and every bare chain completed, else 1.
    """
    from aptix_cli.bench.production import run_production_bench

    return run_production_bench(options)


def run_embedded(*, turns: int, llm_latency_ms: float, worker_threads: int) -> int:
    """The in-process measurement of ``aptix bench --embedded``; 0 when every turn completed."""
    from aptix_cli.bench.embedded import run_embedded_bench

    return run_embedded_bench(turns=turns, llm_latency_ms=llm_latency_ms, worker_threads=worker_threads)
