"""The flags of models in the loop, read into config values: ``--rubric FILE`` (its text),
``--prices FILE`` (the table), and the per-role endpoint flags (``[judge=|optimizer=]VALUE``,
repeatable; a value without a role sets both)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from evolane.cli._exits import flag_problem
from evolane.inputs import InputError, load_prices
from evolane.store import read_at_most

ROLES = ("judge", "optimizer")
_PER_ROLE: dict[str, Callable[[str], Any]] = {
    "llm_base_url": str,
    "llm_api_key_env": str,
    "llm_temperature": float,
    "llm_max_tokens": int,
    "llm_timeout": float,
    "llm_retries": int,
}
RUBRIC_BYTES = 32 << 10


def model_flags(flags: dict[str, Any]) -> dict[str, Any]:
    """Config values for the model flags given in ``flags`` (`InputError` on bad input)."""
    values: dict[str, Any] = {}
    for key, convert in _PER_ROLE.items():
        if flags.get(key):
            values[key] = per_role(key, flags[key], convert)
    if flags.get("llm_cache"):
        values["llm_cache"] = True
    if flags.get("rubric") is not None:
        values["rubric"] = read_rubric(Path(flags["rubric"]))
    if flags.get("prices") is not None:
        values["prices"] = load_prices(flags["prices"])
    return values


def per_role(key: str, given: list[str], convert: Callable[[str], Any]) -> dict[str, Any]:
    """``ROLE=VALUE`` sets one role, ``VALUE`` both; later flags win."""
    flag = "--" + key.replace("_", "-")
    chosen: dict[str, Any] = {}
    for text in given:
        role, _, value = text.partition("=")
        roles: tuple[str, ...] = (role,) if role in ROLES and value else ROLES
        value = value if role in ROLES and value else text
        try:
            converted = convert(value)
        except ValueError:
            raise InputError(f"{flag} {text}: not a {convert.__name__}") from None
        chosen.update(dict.fromkeys(roles, converted))
    return chosen


def read_rubric(path: Path) -> str:
    """The rubric's text (UTF-8, at most `RUBRIC_BYTES`)."""
    try:
        with path.open("rb") as source:
            data = read_at_most(source, RUBRIC_BYTES)
    except OSError as error:
        raise InputError(f"--rubric {path}: {error.strerror or error}") from None
    if len(data) > RUBRIC_BYTES:
        raise InputError(f"--rubric {path}: over {RUBRIC_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InputError(f"--rubric {path}: not UTF-8 text ({error.reason})") from None
    if not text.strip():
        raise InputError(f"--rubric {path}: empty")
    return text


def rejudge_models(flags: dict[str, Any]) -> Any:
    """The model settings a re-judge (``--from-run``) gives its new judge, or None when no
    model flag is given (the run's own are kept)."""
    from evolane.measure import ModelSettings

    values = model_flags(flags)
    for key in ("judge_samples", "unknown_price"):
        if flags.get(key) is not None:
            values[key] = flags[key]
    if not values:
        return None
    try:
        return ModelSettings(**values)
    except ValidationError as error:
        raise InputError(flag_problem(error)) from None
