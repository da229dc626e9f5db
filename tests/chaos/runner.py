"""Running the fault matrix: each fault on a fresh system, then settling, counting and tearing down.

Each fault gets its own Redis server, database, model, workers and gateway, all ended (and the
database dropped) when the fault is over, also when it went wrong. A fault that cannot run to its
end is reported with its error, and the next fault still runs.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import TextIO

import yaml

from shared.task_names import DEFAULT_TASK_BOUNDARIES
from tests.chaos.evidence import collect
from tests.chaos.faults import FAULTS, Fault, FaultPlan
from tests.chaos.load import Ledger, wait_settled
from tests.chaos.net.faults import NET_FAULTS
from tests.chaos.poison import POISON_TOOL
from tests.chaos.report import FaultReport, FaultRun, build_report, render_fault

__all__ = ["ALL_FAULTS", "RETRY_BUDGET_SECONDS", "plans", "run_matrix"]

logger = logging.getLogger(__name__)

ALL_FAULTS: dict[str, Fault] = {**FAULTS, **NET_FAULTS}
"""The faults on one host (``make chaos``) and those on hosts apart (``make chaos-net``, root only)."""
RETRY_BUDGET_SECONDS = 120.0
"""``APTIX_LLM_RETRY_BUDGET_SECONDS`` of the system: a fault shorter than this must fail no turn."""

COUNT_RUN_TOOL = {
    "name": "count_run",
    "description": "Record that this turn ran its tool.",
    "handler": "tests.support.tools:count_run",
    "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
}


def plans(
    names: Sequence[str],
    *,
    small: bool,
    turns: int | None = None,
    seed: int = 0,
    task_boundaries: str = DEFAULT_TASK_BOUNDARIES.value,
) -> list[FaultPlan]:
    """The plans of the named faults, in matrix order.

    Raises:
        KeyError: a name is not a fault.
    """
    unknown = sorted(set(names) - set(ALL_FAULTS))
    if unknown:
        raise KeyError(f"unknown fault(s): {', '.join(unknown)}; known: {', '.join(ALL_FAULTS)}")
    return [
        FaultPlan(
            name=name,
            turns=turns or (fault.small_turns if small else fault.turns),
            small=small,
            seed=seed,
            task_boundaries=task_boundaries,
        )
        for name, fault in ALL_FAULTS.items()
        if name in names
    ]


def run_matrix(
    fault_plans: Sequence[FaultPlan], *, log_dir: Path, settle_seconds: float, out: TextIO | None = None
) -> list[FaultReport]:
    """Run each plan on a fresh system; write each fault's table to ``out`` as soon as it is known."""
    log_dir.mkdir(parents=True, exist_ok=True)
    catalog = write_catalog(log_dir / "modes.yaml")
    reports = []
    for plan in fault_plans:
        logger.info("fault %s: %d turns (logs in %s)", plan.name, plan.turns, log_dir / plan.name)
        report = run_fault(plan, log_dir=log_dir, catalog=catalog, settle_seconds=settle_seconds)
        reports.append(report)
        if out is not None:
            out.write(render_fault(report, retry_budget_seconds=RETRY_BUDGET_SECONDS) + "\n\n")
            out.flush()
    return reports


def run_fault(plan: FaultPlan, *, log_dir: Path, catalog: Path, settle_seconds: float) -> FaultReport:
    """Start a system, run the fault, wait for the turns to settle, count the evidence, tear down."""
    fault = ALL_FAULTS[plan.name]
    fault_dir = log_dir / plan.name
    fault_dir.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    ledger = Ledger()
    run = FaultRun(f"{plan.name} (did not start)")
    error: str | None = None
    report: FaultReport | None = None
    options = replace(fault.options, task_boundaries=plan.task_boundaries)
    system = fault.system(fault_dir=fault_dir, catalog=catalog, options=options)
    try:
        # Broad on purpose: whatever stops one fault (a process that will not start, a harness
        # bug) is reported as that fault's error and the matrix goes on to the next fault.
        try:
            system.start()
            run = fault.run(system, plan, ledger)
        except Exception:
            error = traceback.format_exc()
            logger.exception("fault %s did not run to its end", plan.name)
        try:
            if ledger.accepted or ledger.rejected:
                settled = wait_settled(system.database.url, deadline=time.monotonic() + settle_seconds)
                logger.info("fault %s: turns %s", plan.name, "settled" if settled else "did not all settle")
            report = build_report(plan.name, run, ledger, collect(system))
        except Exception:
            error = (error or "") + traceback.format_exc()
            logger.exception("fault %s: evidence could not be read", plan.name)
    finally:
        system.close()
    report = report or FaultReport(name=plan.name, run=run)
    report.error = error
    report.seconds = time.monotonic() - began
    return report


def write_catalog(path: Path) -> Path:
    """The packaged mode catalog plus the ``count_run`` and ``poison`` operator tools, offered in mode general."""
    catalog = yaml.safe_load(resources.files("shared.modes").joinpath("default_catalog.yaml").read_text())
    catalog["tools"] = [*catalog.get("tools", []), COUNT_RUN_TOOL, POISON_TOOL]
    for mode in catalog["modes"]:
        if mode["name"] == "general":
            mode["tools"] = [*mode["tools"], COUNT_RUN_TOOL["name"], POISON_TOOL["name"]]
    path.write_text(yaml.safe_dump(catalog))
    return path
