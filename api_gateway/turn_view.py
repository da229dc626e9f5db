"""The API view of a recorded turn (``shared.turn_view``, which webhook events share)."""

from shared.turn_view import to_turn

__all__ = ["to_turn"]
