"""The machine a bench ran on: cores, CPU model and Python, for the top of the report."""

from __future__ import annotations

import os
import platform
from pathlib import Path

__all__ = ["cpu_model", "describe_machine"]


def describe_machine() -> str:
    """E.g. ``2 cores (nproc), AMD EPYC, Python 3.11.7, Linux 6.8``."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return (
        f"{cores} cores (nproc), {cpu_model()}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.release()}"
    )


def cpu_model(cpuinfo: str | None = None) -> str:
    """The first ``model name`` of ``/proc/cpuinfo`` (or of ``cpuinfo``); ``unknown CPU`` if there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            return platform.processor() or "unknown CPU"
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and value.strip():
            return value.strip()
    return "unknown CPU"
