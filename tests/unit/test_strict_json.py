"""shared.strict_json: the request-body parser refuses what RFC 8259 does not call a number."""

from __future__ import annotations

import json

import pytest

from shared import strict_json


@pytest.mark.parametrize("text", ['{"a": NaN}', '{"a": Infinity}', "[-Infinity]", "[1e999]", "[-1e400]"])
def test_non_standard_numbers_are_a_decode_error_naming_them(text: str) -> None:
    with pytest.raises(json.JSONDecodeError) as refused:
        strict_json.loads(text)
    literal = text.strip("[]{}").split(": ")[-1].strip("[]")
    assert literal in refused.value.msg
    assert text[refused.value.pos :].startswith(literal)


def test_standard_json_parses_as_json_loads_does() -> None:
    text = '{"a": [1, 2.5, -3e10, 1.7976931348623157e308], "b": null, "c": "\\u00e9"}'
    assert strict_json.loads(text.encode()) == json.loads(text)


@pytest.mark.parametrize("depth", [1_000, 100_000])
@pytest.mark.parametrize(("opening", "closing"), [("[", "]"), ('{"a":', "}")])
def test_nesting_deeper_than_the_parser_goes_is_a_decode_error_not_a_recursion_error(
    depth: int, opening: str, closing: str
) -> None:
    with pytest.raises(json.JSONDecodeError) as refused:
        strict_json.loads((opening * depth + "1" + closing * depth).encode())
    assert refused.value.msg == strict_json.TOO_DEEP
