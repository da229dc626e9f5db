"""api_gateway.parameters: a query parameter or header holding NUL is refused before any route reads it."""

from __future__ import annotations

import pytest
from starlette.requests import Request

from api_gateway.errors import ApiError
from api_gateway.parameters import NUL_MESSAGE, check_parameters


def _request(query: bytes, headers: tuple[tuple[bytes, bytes], ...] = ()) -> Request:
    scope = {"type": "http", "method": "GET", "path": "/v1/batches", "query_string": query, "headers": list(headers)}
    return Request(scope)


def test_a_query_parameter_holding_nul_is_422_naming_it() -> None:
    with pytest.raises(ApiError) as refused:
        check_parameters(_request(b"limit=5&after=a%00b"))
    assert (refused.value.status_code, refused.value.code) == (422, "invalid_request")
    assert refused.value.message == f"query.after: {NUL_MESSAGE}"
    assert refused.value.details == [{"loc": ["query", "after"], "msg": NUL_MESSAGE, "type": "value_error"}]


def test_a_header_holding_nul_is_422_naming_it_and_each_one_is_listed() -> None:
    # h11 refuses such a header before the app; this check does not rely on it
    with pytest.raises(ApiError) as refused:
        check_parameters(_request(b"after=%00", ((b"last-event-id", b"1-0\x00"),)))
    assert [detail["loc"] for detail in refused.value.details] == [["query", "after"], ["header", "last-event-id"]]


def test_parameters_without_nul_pass_whatever_else_they_hold() -> None:
    check_parameters(_request(b"after=batch_1&x=%ff%fe&y=\xe2\x9c\x93&z=", ((b"authorization", b"Bearer k"),)))
