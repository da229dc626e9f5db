"""The mode catalog (TUL-007, AGN-011): which modes exist, their prompt layers, welcomes and tools."""

from shared.modes.catalog import (
    BUILTIN_TOOL_NAMES,
    CHANGE_MODE_TOOL,
    Mode,
    ModeCatalog,
    ModelLimits,
    OperatorTool,
    load_catalog,
)

__all__ = [
    "BUILTIN_TOOL_NAMES", "CHANGE_MODE_TOOL", "Mode", "ModeCatalog", "ModelLimits", "OperatorTool", "load_catalog",
]  # fmt: skip
