"""OpenAI's list object: one page of a cursor-paginated listing (files, batches)."""

from __future__ import annotations

from typing import Any

__all__ = ["list_page"]


def list_page(data: list[dict[str, Any]], *, has_more: bool) -> dict[str, Any]:
    """The page holding ``data`` (objects with an ``id``), as the ``openai`` SDK's cursor pages read it:
    ``first_id`` and ``last_id`` name its ends (None when empty), ``has_more`` whether another follows."""
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": has_more,
    }
