"""``aptix keys``' input: expiries and organisation names."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from aptix_cli.command_support import UsageError
from aptix_cli.key_commands import check_org, parse_expiry

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("90d", NOW + timedelta(days=90)),
        ("12h", NOW + timedelta(hours=12)),
        ("30m", NOW + timedelta(minutes=30)),
        ("45s", NOW + timedelta(seconds=45)),
        ("2w", NOW + timedelta(weeks=2)),
        ("2027-01-01", datetime(2027, 1, 1, tzinfo=UTC)),
        ("2027-01-01T00:00:00Z", datetime(2027, 1, 1, tzinfo=UTC)),
        ("2027-01-01T02:00:00+02:00", datetime(2027, 1, 1, tzinfo=UTC)),
    ],
)
def test_an_expiry_is_a_duration_from_now_or_a_time_with_its_zone(text: str, expected: datetime) -> None:
    assert parse_expiry(text, now=NOW) == expected


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("soon", "give a duration"),
        ("90 days", "give a duration"),
        ("2027-01-01T00:00:00", "say its time zone"),
        ("2026-01-01", "not in the future"),
        ("0s", "not in the future"),
    ],
)
def test_an_expiry_that_cannot_be_right_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(UsageError, match=says):
        parse_expiry(text, now=NOW)


@pytest.mark.parametrize("org_id", ["", "a b", "a:b", "a,b", "tab\there", "x" * 129])
def test_an_organisation_name_that_could_not_stand_in_aptix_api_keys_is_refused(org_id: str) -> None:
    with pytest.raises(UsageError, match="bad --org"):
        check_org(org_id)


def test_an_organisation_name_is_kept_as_given() -> None:
    assert check_org("acme.eu-1") == "acme.eu-1"
