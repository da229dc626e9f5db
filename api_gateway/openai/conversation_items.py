"""Conversation items: a session's transcript items as OpenAI message items, with ids derived from where they are.

An item's id is its turn's id and its position in that turn's transcript, ``msg_<turn hex>_<seq>``:
the same on every read and on every gateway, with nothing stored for it, and a cursor (``after``) that
names the item it stands for.
"""

from __future__ import annotations

import re
from typing import Any

from api_gateway.openai.items import listed_items
from shared.db.conversations import TranscriptEntry

__all__ = ["item_id", "parse_item_id", "rendered"]

_ITEM = re.compile(r"^msg_([0-9a-f]{32})_([0-9]{1,6})$")
_TURN_PREFIX = "turn_"


def item_id(turn_id: str, seq: int) -> str:
    """The id of item ``seq`` of turn ``turn_id``'s transcript."""
    return f"msg_{turn_id.removeprefix(_TURN_PREFIX)}_{seq}"


def parse_item_id(value: str) -> tuple[str, int] | None:
    """(turn id, seq) of a conversation item id; None when ``value`` is not one."""
    found = _ITEM.match(value)
    return None if found is None else (_TURN_PREFIX + found.group(1), int(found.group(2)))


def rendered(entry: TranscriptEntry) -> dict[str, Any]:
    """A transcript item as a ``message`` item: ``input_text`` for user, system and developer, ``output_text``
    for the assistant, always ``completed`` (as ``listed_items`` shows a response's input)."""
    message = {"type": "message", "role": entry.role, "content": entry.content}
    (item,) = listed_items([message], prefix=entry.turn_id.removeprefix(_TURN_PREFIX))
    item["id"] = item_id(entry.turn_id, entry.seq)
    return item
