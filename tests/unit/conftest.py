"""Unit-test fixtures: the gateway as ``connect_gateway`` wires it on in-process ports, and one turn
driven once per run, so one-time costs are not any one test's time."""

from __future__ import annotations

import gc

import pytest

from tests.unit.fakes import FakeLlm, Gateway, answer, drive, make_context, record_turn


@pytest.fixture
def gateway() -> Gateway:
    """The gateway's services on SQLite and fakeredis, with a broker that records (tests.unit.fakes.Gateway)."""
    return Gateway()


@pytest.fixture(scope="session", autouse=True)
def _warm_pipeline() -> None:
    """Drive one turn on the fakes before the first test.

    The first turn of a process pays about 0.1 s once (lazy imports, SQLAlchemy compiling and
    caching its statements, pydantic building validators); the next ones take about 10 ms. Paying
    it here keeps ``pytest --durations`` honest about each test's own time (under 50 ms each).
    What exists by then is moved out of the garbage collector's sight (``gc.freeze``): otherwise a
    full collection walks that whole heap, about 0.1 s charged to whichever test triggers it.
    """
    ctx = make_context(FakeLlm(answer("warm")))
    drive(ctx, record_turn(ctx))
    gc.collect()
    gc.freeze()
