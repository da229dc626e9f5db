"""The state store's ports: each store implements every port, with the port's signatures, and nothing else."""

from __future__ import annotations

import inspect

import pytest

from shared.state import CancelFlags, InFlightMarkers, MemoryStateStore, RedisStateStore, StepLeases, Timers, TurnStates

PORTS: list[type] = [TurnStates, StepLeases, CancelFlags, InFlightMarkers, Timers]
STORES: list[type] = [RedisStateStore, MemoryStateStore]
NOT_A_PORT = {"from_url", "flush", "lapse"}
"""A constructor, and the memory store's "Redis restarted empty" and "a dead worker's lease lapsed" for tests."""


def _methods(cls: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(member)
        for name, member in vars(cls).items()
        if not name.startswith("_") and callable(member) and name not in NOT_A_PORT
    }


@pytest.mark.parametrize("store", STORES, ids=lambda store: store.__name__)
@pytest.mark.parametrize("port", PORTS, ids=lambda port: port.__name__)
def test_each_store_implements_each_port_with_its_signatures(store: type, port: type) -> None:
    for name, signature in _methods(port).items():
        assert inspect.signature(getattr(store, name)) == signature, f"{store.__name__}.{name}"


@pytest.mark.parametrize("store", STORES, ids=lambda store: store.__name__)
def test_every_method_of_a_store_belongs_to_exactly_one_port(store: type) -> None:
    owners: dict[str, list[str]] = {}
    for port in PORTS:
        for name in _methods(port):
            owners.setdefault(name, []).append(port.__name__)
    assert all(len(ports) == 1 for ports in owners.values()), owners
    assert set(_methods(store)) == set(owners)
