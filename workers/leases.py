"""LeaseRenewer: one thread per worker process renews every step lease the process holds.

A step's lease (``APTIX_STEP_LEASE_SECONDS``) says a live worker is running it: a redelivered copy of
its message waits, and the reconciler leaves its turn alone. The renewer renews all the leases this
process holds in one Redis round trip every third of the lease, and pushes their turns' in-flight
markers forward in the same write. Its thread starts with the first lease held (a prefork child
starts its own) and ends when a round finds none held; under gevent it is a greenlet.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import redis

from shared.state import Lease, Release, StepLeases

__all__ = ["LeaseRenewer"]

logger = logging.getLogger(__name__)

_BATCH = 500
"""Leases renewed per Redis call (a call is one Lua script: keep each short)."""


class LeaseRenewer:
    """Holds this process's step leases and renews them until they are let go."""

    def __init__(self, leases: StepLeases, *, ttl_seconds: int, alive_until: Callable[[], float]) -> None:
        """Prepare the renewer; its thread starts with the first :meth:`holding`.

        Args:
            leases: where the leases live.
            ttl_seconds: the lease length; renewals come every third of it.
            alive_until: the in-flight marker of a turn whose step is running now.
        """
        self._leases = leases
        self._ttl = ttl_seconds
        self._alive_until = alive_until
        self._held: dict[Lease, None] = {}
        self._lock = threading.Lock()
        self._started = False
        if hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=self._forget_parent)

    @contextmanager
    def holding(self, lease: Lease) -> Iterator[None]:
        """Keep ``lease`` renewed while the body runs."""
        with self._lock:
            self._held[lease] = None
            if not self._started:
                self._started = True
                threading.Thread(target=self._run, name="aptix-lease-renewer", daemon=True).start()
        try:
            yield
        finally:
            with self._lock:
                self._held.pop(lease, None)

    def release(self, lease: Lease, *, why: Release = Release.ENDED) -> None:
        """Give ``lease`` back now (its step ends without a save, which would have given it back); ``why``
        decides what becomes of the step's delivery count (``shared.state.store.Release``)."""
        self._leases.release(lease, why=why)

    def record_alone(self, lease: Lease) -> bool:
        """Record that ``lease``'s delivery runs alone in this process (``StepLeases.record_alone``);
        False: the lease was no longer ours."""
        return self._leases.record_alone(lease)

    def held(self) -> list[Lease]:
        """The leases held now."""
        with self._lock:
            return list(self._held)

    def renew_now(self) -> list[Lease]:
        """Renew every held lease; returns those that were no longer ours."""
        leases = self.held()
        lost: list[Lease] = []
        for start in range(0, len(leases), _BATCH):
            lost += self._leases.renew(
                leases[start : start + _BATCH], ttl_seconds=self._ttl, alive_until=self._alive_until()
            )
        return lost

    def _forget_parent(self) -> None:
        """In a forked child: none of the parent's leases, a fresh lock, no thread yet."""
        self._held = {}
        self._lock = threading.Lock()
        self._started = False

    def _run(self) -> None:
        pause = threading.Event()  # never set: a pause that works the same under gevent
        while not pause.wait(self._ttl / 3):
            with self._lock:
                if not self._held:  # idle: end; the next lease held starts a new thread
                    self._started = False
                    return
            try:
                for lease in self.renew_now():
                    logger.warning("lost the lease of %s of turn %s before it ended", lease.step_key, lease.turn_id)
            except redis.RedisError as exc:
                logger.warning("could not renew %d step lease(s): %s", len(self.held()), type(exc).__name__)
            except Exception:  # the renewer must outlive any surprise
                logger.exception("the lease renewer failed a round")
