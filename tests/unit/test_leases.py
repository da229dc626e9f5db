"""LeaseRenewer: one thread per process renews every lease it holds, in one store call per round."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from functools import partial

from shared.state import Lease, MemoryStateStore
from tests.support.waiting import wait_for
from workers.leases import LeaseRenewer


class _CountingStore(MemoryStateStore):
    """Counts renew calls and the leases in each."""

    def __init__(self) -> None:
        super().__init__()
        self.renew_calls: list[int] = []

    def renew(self, leases: Sequence[Lease], *, ttl_seconds: int, alive_until: float) -> list[Lease]:
        self.renew_calls.append(len(leases))
        return super().renew(leases, ttl_seconds=ttl_seconds, alive_until=alive_until)


def _renewer(store: MemoryStateStore, ttl: int) -> LeaseRenewer:
    return LeaseRenewer(store, ttl_seconds=ttl, alive_until=lambda: 1e12)


def test_held_leases_outlive_their_ttl_and_lapse_once_let_go() -> None:
    store = _CountingStore()
    renewer = _renewer(store, ttl=1)
    leases = [Lease(f"turn_{i}", "0:2:llm_call:1", f"me-{i}") for i in range(3)]
    for lease in leases:
        assert store.claim(lease, ttl_seconds=1)
    with renewer.holding(leases[0]), renewer.holding(leases[1]), renewer.holding(leases[2]):
        time.sleep(2.2)  # over two lease lengths
        assert not any(store.claim(Lease(lease.turn_id, lease.step_key, "thief"), ttl_seconds=1) for lease in leases)
    # every round renewed all three leases in one call
    assert store.renew_calls and set(store.renew_calls) <= {3}
    assert store.markers == {lease.turn_id: 1e12 for lease in leases}
    for lease in leases:
        taken = Lease(lease.turn_id, lease.step_key, "next")
        wait_for(partial(store.claim, taken, ttl_seconds=1), what=f"the lease of {lease.turn_id} to lapse", seconds=2)


def test_one_renewer_thread_serves_every_step_of_the_process() -> None:
    store = _CountingStore()
    renewer = _renewer(store, ttl=30)
    before = {t.ident for t in threading.enumerate()}
    for i in range(20):
        with renewer.holding(Lease(f"turn_{i}", "0:1:compose:1", "me")):
            pass
    started = [t for t in threading.enumerate() if t.name == "aptix-lease-renewer" and t.ident not in before]
    assert len(started) == 1
    assert renewer.held() == []


def test_renew_now_names_a_lease_taken_over_after_it_lapsed() -> None:
    store = _CountingStore()
    renewer = _renewer(store, ttl=30)
    mine = Lease("turn_x", "0:1:compose:1", "me")
    assert store.claim(mine, ttl_seconds=30)
    store.release(mine)
    assert store.claim(Lease("turn_x", "0:1:compose:1", "other"), ttl_seconds=30)
    with renewer.holding(mine):
        assert renewer.renew_now() == [mine]
