"""The mode change (TUL-007, AGN-011 §5, seeds/README.md rules 1, 3, 4).

``agent_change_mode(targetMode, reason?, branch?)``. A known target mode is persisted through the
session manager (session mode + a ModeHistory row), becomes the in-flight mode, and arms its
welcome as turn-scoped context, so the next LLM call of the same turn carries the new mode's
prompt layer, tools and welcome (AGN-031 §8). An unknown target is not a failure: the result says
the change was rejected and lists the valid modes, and the turn stays in its mode.
"""

from __future__ import annotations

import json
from typing import Any

from shared.models.envelope import TurnEnvelope
from shared.models.turn import ModeChange
from shared.state import TurnState
from workers.context import StepContext
from workers.trace import trace

__all__ = ["change_mode"]


def change_mode(ctx: StepContext, env: TurnEnvelope, state: TurnState, arguments: dict[str, Any]) -> str:
    """Apply (or reject) one mode change; returns the tool's JSON result."""
    target = str(arguments["targetMode"])
    reason = arguments.get("reason")
    branch = bool(arguments.get("branch", False))
    previous = state.mode or ctx.catalog.default_mode
    mode = ctx.catalog.get(target)
    if mode is None:
        trace(ctx, state, env, "mode_change_rejected", requested=target, mode=previous)
        return _result(
            success=False,
            mode=previous,
            reason=reason,
            branch=branch,
            message=f"mode {target!r} does not exist; staying in {previous!r}",
            valid_modes=ctx.catalog.mode_names,
        )
    ctx.sessions.set_mode(
        state.session_id,
        turn_id=state.turn_id,
        seq=len(state.mode_changes),
        from_mode=previous,
        to_mode=mode.name,
        reason=reason,
        org_id=state.org_id,
        user_id=state.user_id,
        now=ctx.clock(),
    )
    state.mode = mode.name
    state.mode_changes.append(ModeChange(from_mode=previous, to_mode=mode.name, reason=reason, branch=branch))
    state.providers.turn_context = [mode.welcome] if mode.welcome else []
    trace(ctx, state, env, "mode_change", previous=previous, mode=mode.name, reason=reason, branch=branch)
    if mode.welcome:
        trace(ctx, state, env, "welcome_armed", mode=mode.name)
    return _result(success=True, mode=mode.name, reason=reason, branch=branch, message=f"now in mode {mode.name!r}")


def _result(
    *, success: bool, mode: str, reason: object, branch: bool, message: str, valid_modes: list[str] | None = None
) -> str:
    body: dict[str, Any] = {"success": success, "mode": mode, "branch": branch, "reason": reason, "message": message}
    if valid_modes is not None:
        body["valid_modes"] = valid_modes
    return json.dumps(body)
