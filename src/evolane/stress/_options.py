"""Command-line helpers: ``KEY=VALUE`` settings and one-line explanations of bad ones."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic import ValidationError


class SettingError(ValueError):
    """A malformed or unknown ``--set`` entry."""


def parse_settings(pairs: Iterable[str]) -> dict[str, str]:
    """``["trees=500", "concurrency=100"]`` -> ``{"trees": "500", ...}`` (the scenario's config
    model converts the values); raises `SettingError` for an entry without ``=``."""
    settings: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise SettingError(f"--set takes KEY=VALUE, got {pair!r}")
        settings[key] = value.strip()
    return settings


def explain(error: ValidationError, flags: Iterable[str] = (), known: Iterable[str] = ()) -> str:
    """One line for the first problem: which option or setting, and what is wrong with it."""
    first: dict[str, Any] = error.errors()[0]
    if not first["loc"]:  # a check of the whole config names its settings itself
        return str(first["msg"]).removeprefix("Value error, ")
    name = str(first["loc"][0])
    where = f"--{name}" if name in set(flags) else f"--set {name}"
    if first["type"] == "extra_forbidden":
        return f"{where}: not a setting of this scenario (known: {', '.join(known)})"
    value = first.get("input")
    return f"{where}: {first['msg'].lower()}, got {value!r}"


def report_rows(counts: dict[str, int], measures: dict[str, float]) -> list[tuple[str, str]]:
    """The figures as (name, text) rows: counts with thousands separators, then measures."""
    rows = [(name.replace("_", " "), f"{value:,}") for name, value in counts.items()]
    rows += [(name.replace("_", " "), f"{value:,.3f}".rstrip("0").rstrip(".")) for name, value
             in measures.items()]  # fmt: skip
    return rows
