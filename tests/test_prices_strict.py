"""A YAML price file is read strictly: a key set twice, deep nesting and an integer too long to
convert are refused with the line (found by review: the last duplicate won silently)."""

from __future__ import annotations

from pathlib import Path

import pytest

from evolane.inputs import InputError, load_prices


def _prices(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "prices.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("m: {input: 1, output: 1}\nm: {input: 9, output: 9}\n", ":2: duplicate key 'm'"),
        ("m:\n  input: 1\n  output: 2\n  input: 3\n", ":4: duplicate key 'input'"),
        ("m: {input: " + "9" * 5000 + ", output: 1}\n", ":1: a number of 5000 characters"),
        ("m: " + "[" * 100_000, ":1: nested over 32 levels deep"),
    ],
)
def test_a_strictly_bad_price_file_is_refused_at_its_line(
    tmp_path: Path, text: str, needle: str
) -> None:
    path = _prices(tmp_path, text)
    with pytest.raises(InputError, match=f"--prices {path}{needle}"):
        load_prices(path)


def test_merge_keys_may_be_overridden(tmp_path: Path) -> None:
    text = "base: &b {input: 1, output: 2}\nm:\n  <<: *b\n  input: 3\n"
    table = load_prices(_prices(tmp_path, text))
    assert (table.models["m"].input, table.models["m"].output) == (3.0, 2.0)
