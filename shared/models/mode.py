"""The mode catalog as the HTTP API shows it (`GET /v1/modes`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ModeInfo", "ModeList"]


class ModeInfo(BaseModel):
    """One mode of the catalog."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    name: str
    """The mode's name, as `TurnRequest.mode` takes it."""
    description: str
    """What the mode is for."""
    tools: list[str]
    """The server tools the model may call in this mode (`agent_change_mode` always among them). A client
    tool may not take any server tool's name."""


class ModeList(BaseModel):
    """`GET /v1/modes`: the catalog's modes."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    modes: list[ModeInfo]
    """Every mode, in catalog order."""
