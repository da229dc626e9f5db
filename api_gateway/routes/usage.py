"""``/v1/usage``: the caller's organisation's turns and tokens per UTC day, and its daily token budget."""

from __future__ import annotations

from datetime import date
from typing import Annotated

from fastapi import APIRouter, Query
from starlette.concurrency import run_in_threadpool

from api_gateway.deps import AuthenticatedRoute, Caller, Gateway
from api_gateway.openapi import error_responses
from api_gateway.services.errors import InvalidRequest
from api_gateway.services.limits import MAX_USAGE_DAYS
from shared.models.usage import UsageDay, UsageList

__all__ = ["router"]

router = APIRouter(prefix="/v1/usage", tags=["usage"], route_class=AuthenticatedRoute)

_DAY = r"^[0-9]{4}-[0-9]{2}-[0-9]{2}$"
"""A day as ``YYYY-MM-DD`` only (pydantic's ``date`` would also take ``0``, a Unix timestamp)."""


def _day(text: str | None, name: str) -> date | None:
    if text is None:
        return None
    try:
        return date.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(
            f"{name}: {text!r} is not a day (YYYY-MM-DD)",
            [{"loc": ["query", name], "msg": "not a valid date", "type": "date_from_datetime_parsing"}],
        ) from None


@router.get(
    "",
    response_model=UsageList,
    response_model_by_alias=True,
    operation_id="getUsage",
    summary="The organisation's usage per day",
    response_description="Every day of the range with its turns and tokens, and the daily token budget.",
    responses=error_responses(
        401, 422, 503, specific={422: f"Also `from` after `to`, or a range of more than {MAX_USAGE_DAYS} days."}
    ),
)
async def get_usage(
    caller: Caller,
    gateway: Gateway,
    first: Annotated[
        str | None,
        Query(
            alias="from",
            pattern=_DAY,
            json_schema_extra={"format": "date"},
            description="The first UTC day (`YYYY-MM-DD`); default: 6 days before `to`.",
        ),
    ] = None,
    last: Annotated[
        str | None,
        Query(
            alias="to",
            pattern=_DAY,
            json_schema_extra={"format": "date"},
            description="The last UTC day (`YYYY-MM-DD`), included; default: today.",
        ),
    ] = None,
) -> UsageList:
    """The turns of the caller's organisation, and the tokens they used, per UTC day of creation."""
    report = await run_in_threadpool(
        gateway.limits.usage, caller.org_id, first=_day(first, "from"), last=_day(last, "to")
    )
    return UsageList(
        first=report.first,
        last=report.last,
        data=[
            UsageDay(
                date=day.day,
                turns=day.turns,
                llm_calls=day.llm_calls,
                input_tokens=day.input_tokens,
                output_tokens=day.output_tokens,
                total_tokens=day.total_tokens,
            )
            for day in report.days
        ],
        tokens_per_day=report.tokens_per_day,
        tokens_today=report.tokens_today,
    )
