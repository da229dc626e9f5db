"""JSON as RFC 8259 defines it: no ``NaN``, ``Infinity`` or numbers too large for a double.

Python's ``json.loads`` accepts ``NaN``, ``Infinity`` and ``-Infinity`` and turns ``1e999`` into
``inf``; none of them is JSON, and each would reach the model as ``null`` (or fail a later
``json.dumps(allow_nan=False)``). Nor does a document nested deeper than the parser's recursion
allows (``[`` a thousand times) escape as a ``RecursionError``: it is a decode error like any other.
The gateway parses every request body with :func:`loads`.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["TOO_DEEP", "loads"]


def loads(data: str | bytes) -> Any:
    """Parse ``data`` as strict JSON.

    Raises:
        json.JSONDecodeError: invalid JSON, including a non-standard number (the message names it) and
            nesting deeper than Python's recursion limit lets the parser go (about a thousand levels).
    """
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float)
    except _NotJson as exc:
        raise json.JSONDecodeError(str(exc), text, text.find(exc.literal) if exc.literal in text else 0) from None
    except RecursionError:
        raise json.JSONDecodeError(TOO_DEEP, text, 0) from None


TOO_DEEP = "nested too deeply (arrays and objects within each other, about a thousand levels)"
"""The decode error's message for a document nested deeper than the parser can go."""


class _NotJson(ValueError):
    def __init__(self, message: str, literal: str) -> None:
        super().__init__(message)
        self.literal = literal


def _refuse_constant(name: str) -> Any:
    raise _NotJson(f"{name} is not a JSON number", name)


def _finite_float(literal: str) -> float:
    value = float(literal)
    if not math.isfinite(value):
        raise _NotJson(f"{literal} is too large for a JSON number (a 64-bit float)", literal)
    return value
