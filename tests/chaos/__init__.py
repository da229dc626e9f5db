"""The chaos suite: a fault matrix run against the real processes of Aptix (``python -m tests.chaos``).

Each fault (worker kill, worker kill under OpenAI-face responses with resumed streams, Redis restart,
the Sentinel-managed Redis primary killed and its replica promoted, a Redis Cluster primary of the
state store killed and its replica promoted, model outage, PostgreSQL backend termination, gateway
kill, reconciler kill, a poison step that kills every worker running it) runs on a fresh system of
child processes while turns run, and the report counts from the ground truth (turn rows, the tool
log, the model journal) how the turns ended.
"""

from tests.chaos.faults import FAULTS, FaultPlan
from tests.chaos.report import FaultReport, render_fault, render_summary
from tests.chaos.runner import RETRY_BUDGET_SECONDS, plans, run_matrix

__all__ = [
    "FAULTS",
    "RETRY_BUDGET_SECONDS",
    "FaultPlan",
    "FaultReport",
    "plans",
    "render_fault",
    "render_summary",
    "run_matrix",
]
