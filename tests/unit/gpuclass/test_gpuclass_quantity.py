"""Quantities parse like Go's resource.Quantity and round up like Quantity.Value()."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from operators.gpuclass import quantity
from operators.gpuclass.quantity import (
    MAX_TEXT_LENGTH,
    MAX_VALUE,
    PARSED_MEMO_LIMIT,
    SMALLEST_POSITIVE,
    parse_exact,
    parse_value,
)


@pytest.mark.parametrize(
    ("text", "exact", "value"),
    [
        ("0", 0, 0),
        ("2", 2, 2),
        ("+2", 2, 2),
        ("007", 7, 7),
        ("2000m", 2, 2),
        ("1500m", Fraction(3, 2), 2),
        ("1.5", Fraction(3, 2), 2),
        ("1.", 1, 1),
        (".5", Fraction(1, 2), 1),
        ("1k", 1000, 1000),
        ("1M", 10**6, 10**6),
        ("1E", 10**18, 10**18),
        ("1Ki", 1024, 1024),
        ("1Mi", 2**20, 2**20),
        ("1.5Ki", 1536, 1536),
        ("1e3", 1000, 1000),
        ("1E3", 1000, 1000),
        ("1e+3", 1000, 1000),
        ("15e-1", Fraction(3, 2), 2),
        ("100u", Fraction(1, 10**4), 1),
        ("5n", Fraction(5, 10**9), 1),
        ("-0", 0, 0),
        ("0.000Ki", 0, 0),
        ("1e-400", SMALLEST_POSITIVE, 1),
        ("9e18", 9 * 10**18, 9 * 10**18),
        ("1e19", MAX_VALUE, MAX_VALUE),
        ("1e999999999", MAX_VALUE, MAX_VALUE),
        ("8Ei", MAX_VALUE, MAX_VALUE),
        (3, 3, 3),
        (1.5, Fraction(3, 2), 2),
    ],
)
def test_valid_quantities(text: object, exact: int | Fraction, value: int) -> None:
    assert parse_exact(text) == exact
    assert parse_value(text) == value


@pytest.mark.parametrize(
    "text",
    [
        "",
        "-1",
        "-0.5",
        "-1Ki",
        -1,
        "garbage",
        "1 ",
        " 1",
        "1K",
        "1e",
        "e3",
        ".",
        "+",
        "-",
        "1..5",
        "1m5",
        "0x10",
        "1,5",
        "\u0661",  # an Arabic-Indic digit: str.isdigit says yes, Kubernetes says no
        "1" * (MAX_TEXT_LENGTH + 1) + "m",
        None,
        True,
        [],
        float("nan"),
        float("inf"),
    ],
)
def test_garbage_and_negative_are_none(text: object) -> None:
    assert parse_exact(text) is None
    assert parse_value(text) is None


@given(st.integers(min_value=0, max_value=MAX_VALUE))
def test_integers_round_trip(n: int) -> None:
    assert parse_exact(str(n)) == n
    assert parse_value(str(n)) == n


@given(st.integers(min_value=0, max_value=10**15))
def test_millis_round_trip_and_round_up(millis: int) -> None:
    assert parse_exact(f"{millis}m") == Fraction(millis, 1000)
    assert parse_value(f"{millis}m") == -(-millis // 1000)


@given(st.integers(min_value=0, max_value=2**20), st.sampled_from(["Ki", "Mi", "Gi"]))
def test_binary_suffixes_multiply(n: int, suffix: str) -> None:
    assert parse_value(f"{n}{suffix}") == min(n * 1024 ** ["Ki", "Mi", "Gi"].index(suffix) * 1024, MAX_VALUE)


@given(st.text(max_size=12))
def test_any_text_gives_none_or_a_non_negative_number(text: str) -> None:
    value = parse_value(text)
    assert value is None or 0 <= value <= MAX_VALUE


@pytest.mark.parametrize(
    ("text", "exact"), [("1", 1), ("500m", Fraction(1, 2)), ("1k", 1000), ("lots", None)]
)
def test_a_remembered_text_gives_what_parsing_it_gave(text: str, exact: int | Fraction | None) -> None:
    quantity._PARSED.clear()
    assert parse_exact(text) == exact  # parsed, then remembered
    assert text in quantity._PARSED
    assert parse_exact(text) == exact  # remembered
    assert parse_value(text) == (None if exact is None else -(-exact // 1))


def test_the_parsed_memo_is_bounded() -> None:
    for n in range(PARSED_MEMO_LIMIT + 5):
        assert parse_exact(f"{n}m") == Fraction(n, 1000)
    assert len(quantity._PARSED) <= PARSED_MEMO_LIMIT
