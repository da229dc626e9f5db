"""ProcessGate: lets a suspect step run alone in its worker process (a readers-writer gate).

A worker that dies takes every step it was running with it, so a lost delivery says little about
the step: it may have killed its worker, or died beside the step that did. A step whose last delivery
was lost (a suspect) therefore runs alone: it waits until the steps running in this process have
finished, and the steps that arrive meanwhile wait until it is done. If the process dies while it
runs alone, the step killed it (``docs/faults.md``, "Poison steps"). Ordinary steps share the gate.

Suspects come first: once one waits, no new step starts (a steady stream of ordinary steps cannot
keep it waiting); suspects take turns among themselves. A suspect waits at most ``timeout`` (the
steps it waits for may be long); the caller then sends it again later. The gate is built on
``threading``, which gevent's monkey-patching makes cooperative, so it works alike in a threads
pool, in the gevent pool and in a prefork child (which runs one step at a time anyway).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["ProcessGate"]


class ProcessGate:
    """The steps running in one worker process: any number together, or one suspect alone."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._sharing = 0
        """Ordinary steps running now."""
        self._alone = False
        """Whether a suspect runs alone now."""
        self._waiting = 0
        """Suspects waiting to run alone (while any waits, no ordinary step starts)."""

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Run the body beside the other ordinary steps (after any suspect that waits or runs)."""
        with self._changed:
            if self._alone or self._waiting:
                self._changed.wait_for(lambda: not self._alone and not self._waiting)
            self._sharing += 1
        try:
            yield
        finally:
            with self._changed:
                self._sharing -= 1
                if not self._sharing and self._waiting:  # the last one out lets a waiting suspect in
                    self._changed.notify_all()

    @contextmanager
    def alone(self, *, timeout: float) -> Iterator[bool]:
        """Run the body with no other step running in this process, waiting at most ``timeout`` seconds.

        Yields:
            True when the body runs alone; False when the wait timed out (the body then must not run
            the step: nothing stops other steps from starting).
        """
        with self._changed:
            self._waiting += 1
            admitted = False
            try:
                admitted = self._changed.wait_for(lambda: not self._alone and not self._sharing, timeout)
                if admitted:
                    self._alone = True
            finally:
                self._waiting -= 1
                if not admitted:  # gave up waiting: the ordinary steps it held back may start
                    self._changed.notify_all()
        if not admitted:
            yield False
            return
        try:
            yield True
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()
