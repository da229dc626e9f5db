"""Usage contracts: an organisation's turns and tokens per UTC day (``GET /v1/usage``)."""

from __future__ import annotations

from datetime import date

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["UsageDay", "UsageList"]


class UsageDay(BaseModel):
    """One UTC day of the organisation's turns, each counted on the day it was created."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    date: date
    """The UTC day (`YYYY-MM-DD`)."""
    turns: int
    """Turns created that day (any status)."""
    llm_calls: int
    """Model calls those turns made, as last committed."""
    input_tokens: int
    """Input tokens the model reported for those calls."""
    output_tokens: int
    """Output tokens the model reported for those calls."""
    total_tokens: int
    """`input_tokens + output_tokens`: what the daily token budget counts."""


class UsageList(BaseModel):
    """The organisation's usage per day over a range, with its daily token budget."""

    model_config = ConfigDict(use_attribute_docstrings=True, populate_by_name=True)

    object: str = "list"
    """Always `list`."""
    first: date = Field(alias="from")
    """The first day of the range (UTC)."""
    last: date = Field(alias="to")
    """The last day of the range (UTC), included."""
    data: list[UsageDay]
    """Every day of the range, oldest first (a day without turns with zeros)."""
    tokens_per_day: int | None = None
    """The organisation's daily token budget (`aptix orgs set --tokens-per-day`); null: none."""
    tokens_today: int
    """Tokens the organisation's turns created today (UTC) used: what the budget is held to."""
