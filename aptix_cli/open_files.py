"""The open-files limit of a process that holds many sockets (the gateway, a worker, a benchmark)."""

from __future__ import annotations

import resource

__all__ = ["allow_open_files"]


def allow_open_files(needed: int) -> int:
    """Raise the soft limit on open files towards ``needed``, as far as the hard limit allows.

    Each model call in flight and each client connection is a socket; processes often start with a
    soft limit of 1,024 under a far higher hard limit.

    Returns:
        ``needed``, or the lower hard limit that stopped the raise.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return needed
    target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return target
