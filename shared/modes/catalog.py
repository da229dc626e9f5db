"""Mode catalog loading and validation (format in API.md, "Mode catalog").

A catalog that names an unknown tool, repeats a name, lacks its default mode or has a ``models``
entry without a positive ``rpm`` or ``tpm`` is refused at start-up with a
:class:`~shared.errors.ConfigurationError`. Whether an operator tool's handler
imports is checked by the workers, which are the only ones that import handlers.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Annotated, Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, PositiveInt, StringConstraints, ValidationError, model_validator

from shared.errors import ConfigurationError

__all__ = [
    "BUILTIN_TOOL_NAMES",
    "CHANGE_MODE_TOOL",
    "Mode",
    "ModeCatalog",
    "ModelLimits",
    "OperatorTool",
    "load_catalog",
]

CHANGE_MODE_TOOL = "agent_change_mode"
"""The mode change tool (TUL-007), offered in every mode."""
BUILTIN_TOOL_NAMES = frozenset({CHANGE_MODE_TOOL, "get_current_time"})
"""Server tools that need no catalog entry."""

_Name = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_.-]{1,64}$")]


class OperatorTool(BaseModel):
    """A server tool an operator adds, run by an importable handler."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str = ""
    handler: Annotated[str, StringConstraints(pattern=r"^[\w.]+:[\w.]+$")]
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    timeout_seconds: float = Field(default=30.0, gt=0)
    idempotent: bool = False
    """Whether running the handler twice for one call is harmless. A call whose worker died after it
    started is run again only when this is true; otherwise the model is told its outcome is unknown."""


class Mode(BaseModel):
    """One mode: its prompt layer, its welcome (bootstrap) text and its server tools."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: _Name
    description: str = ""
    instructions: str = ""
    welcome: str = ""
    tools: tuple[str, ...] = ()
    model: str | None = None
    """Optional model override for this mode."""

    @property
    def server_tool_names(self) -> tuple[str, ...]:
        """The mode's tools with ``agent_change_mode`` always added (AGN-011 §4.2)."""
        names = [name for name in self.tools if name != CHANGE_MODE_TOOL]
        return (*names, CHANGE_MODE_TOOL)


class ModelLimits(BaseModel):
    """One model's shared rate limits (``models:`` in the catalog); a limit left out is the environment's."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    rpm: PositiveInt | None = None
    """Requests per minute, across every worker; None: ``APTIX_LLM_RPM`` for the configured model, else none."""
    tpm: PositiveInt | None = None
    """Tokens per minute (input + output), across every worker; None: ``APTIX_LLM_TPM`` likewise."""

    @model_validator(mode="after")
    def _sets_a_limit(self) -> ModelLimits:
        if self.rpm is None and self.tpm is None:
            raise ValueError("a models entry needs rpm, tpm or both")
        return self


class ModeCatalog(BaseModel):
    """The whole catalog."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    default_mode: _Name = "general"
    tools: tuple[OperatorTool, ...] = ()
    modes: tuple[Mode, ...]
    models: dict[Annotated[str, StringConstraints(min_length=1, max_length=200)], ModelLimits] = Field(
        default_factory=dict
    )
    """Per-model rate limits by model name (the name a request carries: ``APTIX_LLM_MODEL``, a mode's ``model``
    or a turn's own, ``TurnExtras.model``)."""

    @model_validator(mode="after")
    def _consistent(self) -> ModeCatalog:
        mode_names = [mode.name for mode in self.modes]
        if len(set(mode_names)) != len(mode_names):
            raise ValueError("mode names must be unique")
        if self.default_mode not in mode_names:
            raise ValueError(f"default_mode {self.default_mode!r} is not a mode of the catalog")
        tool_names = [tool.name for tool in self.tools]
        if len(set(tool_names)) != len(tool_names):
            raise ValueError("tool names must be unique")
        if clash := BUILTIN_TOOL_NAMES.intersection(tool_names):
            raise ValueError(f"tools {sorted(clash)} are built in and cannot be redefined")
        known = BUILTIN_TOOL_NAMES.union(tool_names)
        for mode in self.modes:
            if unknown := [name for name in mode.tools if name not in known]:
                raise ValueError(f"mode {mode.name!r} names unknown tools {unknown}")
        return self

    def get(self, name: str | None) -> Mode | None:
        """The mode called ``name``, or None."""
        return next((mode for mode in self.modes if mode.name == name), None)

    def get_or_default(self, name: str | None) -> Mode:
        """The mode called ``name``, falling back to the default mode.

        Args:
            name: a mode name; None or a name the catalog does not have means the default mode
                (a session whose mode left the catalog carries on in the default mode).

        Returns:
            The named mode, else the default mode.
        """
        return self.get(name) or self.default()

    def default(self) -> Mode:
        """The default mode (``default_mode``)."""
        mode = self.get(self.default_mode)
        assert mode is not None  # guaranteed by the validator
        return mode

    @property
    def mode_names(self) -> list[str]:
        """Every mode's name, in catalog order."""
        return [mode.name for mode in self.modes]

    @property
    def server_tool_names(self) -> frozenset[str]:
        """Every server tool name: the built-ins and the operator tools."""
        return BUILTIN_TOOL_NAMES.union(tool.name for tool in self.tools)

    def operator_tool(self, name: str) -> OperatorTool | None:
        """The operator tool called ``name``, or None."""
        return next((tool for tool in self.tools if tool.name == name), None)


def load_catalog(path: str | Path | None = None) -> ModeCatalog:
    """Load and validate a catalog.

    Args:
        path: a YAML file; the packaged default when None.

    Returns:
        The validated catalog.

    Raises:
        ConfigurationError: when the file is missing, not YAML, or not a valid catalog.
    """
    try:
        if path is None:
            text = resources.files("shared.modes").joinpath("default_catalog.yaml").read_text("utf-8")
            source = "the packaged default catalog"
        else:
            text = Path(path).read_text("utf-8")
            source = str(path)
        raw = yaml.safe_load(text)
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigurationError(f"cannot read the mode catalog {str(path)!r}: {exc}") from exc
    try:
        return ModeCatalog.model_validate(raw)
    except ValidationError as exc:
        raise ConfigurationError(f"invalid mode catalog in {source}: {exc}") from exc
