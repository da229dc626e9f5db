"""Response and conversation ids: views of a turn's round and of a session, derived, never stored apart.

A response is one round of a turn (round 0 when the turn starts, one more per tool-results re-entry),
so its id is the turn's id and the round: ``resp_<turn hex>r<round>``. Anything that knows a turn's
id and round (the webhook outbox inside a commit, a stream) names the response without a lookup. A
conversation is a session: ``conv_<session hex>``.
"""

from __future__ import annotations

import re

__all__ = ["conversation_id", "is_response_id", "parse_response_id", "response_id", "session_of_conversation"]

_RESPONSE = re.compile(r"^resp_([0-9a-f]{32})r([0-9]{1,6})$")
_CONVERSATION = re.compile(r"^conv_([0-9a-f]{32})$")
_TURN_PREFIX = "turn_"
_SESSION_PREFIX = "sess_"


def response_id(turn_id: str, round_: int) -> str:
    """The id of the response that is round ``round_`` of turn ``turn_id``."""
    return f"resp_{turn_id.removeprefix(_TURN_PREFIX)}r{round_}"


def parse_response_id(value: str) -> tuple[str, int] | None:
    """(turn id, round) of a response id; None when ``value`` is not one."""
    found = _RESPONSE.match(value)
    if found is None:
        return None
    return _TURN_PREFIX + found.group(1), int(found.group(2))


def is_response_id(value: str) -> bool:
    """Whether ``value`` has the shape of a response id."""
    return _RESPONSE.match(value) is not None


def conversation_id(session_id: str) -> str:
    """The conversation id of a session."""
    return f"conv_{session_id.removeprefix(_SESSION_PREFIX)}"


def session_of_conversation(value: str) -> str | None:
    """The session id a conversation id wraps; None when ``value`` is not a conversation id."""
    found = _CONVERSATION.match(value)
    return None if found is None else _SESSION_PREFIX + found.group(1)
