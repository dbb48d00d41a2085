"""The exact-match judge compares JSON values, not Python ones: found by review, an answer
``true`` matched an expected ``1`` (Python's ``True == 1``), and a candidate answering
``true`` everywhere went from 0.000 to 1.000 and was accepted."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given
from hypothesis import strategies as st

from evolane.lanes._judge import _exact_match, same_json

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=20,
)  # fmt: skip


def _tagged(value: Any) -> Any:
    """``value`` with every boolean told apart from the numbers (what JSON equality is)."""
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, list):
        return ("list", [_tagged(item) for item in value])
    if isinstance(value, dict):
        return ("dict", {key: _tagged(item) for key, item in value.items()})
    return value


@given(JSON, JSON)
def test_same_json_is_equality_of_json_values(one: Any, other: Any) -> None:
    assert same_json(one, one)
    assert same_json(one, other) == (_tagged(one) == _tagged(other))


def test_a_boolean_matches_only_a_boolean() -> None:
    for answer, expected in ((True, 1), (False, 0), ([True], [1]), ({"a": False}, {"a": 0})):
        assert not same_json(answer, expected) and not same_json(expected, answer)
    assert same_json(1, 1.0) and same_json({"a": [1, None]}, {"a": [1.0, None]})
    nested: list[Any] = []
    for inner in (1, 1.0, True):
        deep: Any = inner
        for _ in range(5000):  # deeper than Python's recursion limit
            deep = [deep]
        nested.append(deep)
    assert same_json(nested[0], nested[1]) and not same_json(nested[0], nested[2])


def test_the_exact_match_judge_scores_true_against_1_as_a_miss() -> None:
    verdict = _exact_match({"expected_output": 1}, lambda: b"true")
    assert verdict.score == 0.0 and orjson.loads(verdict.detail) == {"match": False}
    assert _exact_match({"expected_output": 1}, lambda: b"1.0").score == 1.0
