"""What a coding-agent preset is made of (`AgentPreset`, `AgentCall`) and the small parsing
helpers the presets share: JSON objects out of captured output, counts and costs checked,
and the usage document the optimizer lane reads (`read_usage`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

_LINE_MAX = 1 << 20
"""Longest output line parsed as JSON (the capture is bounded anyway)."""
SUMMARY_CHARS = 256
"""Characters of a one-line summary."""


@dataclass(frozen=True)
class AgentCall:
    """What one run of a coding-agent CLI is given (all paths absolute, fresh per job)."""

    executable: str
    """The CLI's absolute path (looked up on PATH when the preset was resolved)."""
    prompt_text: str
    """The optimizer prompt as text (bounded: `evolane.lanes.AGENT_PROMPT_BYTES`)."""
    prompt_file: Path
    """The same text in a file in the job's directory (``prompt.md``)."""
    workdir: Path
    """The tree to edit in place; the CLI's working directory."""
    context_dir: Path
    """The job's read-only context folder."""


UsageParser = Callable[[bytes], dict[str, Any] | None]
"""Captured stdout -> a usage document, or None when the output reports none (never raises)."""


@dataclass(frozen=True)
class AgentPreset:
    """A coding-agent CLI as an optimizer: how to call it non-interactively and how to read
    what it reports. ``interface`` says, in a few lines, which documented interface of the
    CLI the preset assumes (shown by the registry's docs and errors)."""

    name: str
    """The name after ``agent:`` (``claude-code``)."""
    program: str
    """The executable looked up on PATH (``claude``)."""
    argv: Callable[[AgentCall], tuple[str, ...]]
    """The full command line, ``call.executable`` first; deterministic in its inputs."""
    usage: UsageParser
    """The usage document from the CLI's stdout (`usage_document`), None when unknown."""
    summary: Callable[[bytes], str]
    """A one-line summary of the change from the CLI's stdout ("" when there is none)."""
    interface: str = ""
    env: Mapping[str, str] = field(default_factory=dict)
    """Fixed environment entries for the CLI (never secrets: those come via ``--pass-env
    optimizer=NAME``, which no replay sees)."""


def json_objects(data: bytes) -> list[dict[str, Any]]:
    """The JSON objects in ``data``: the whole of it if it is one object, else each line
    that is one (JSONL); anything else is skipped. Never raises."""
    try:
        whole = orjson.loads(data)
    except orjson.JSONDecodeError:
        whole = None
    if isinstance(whole, dict):
        return [whole]
    found: list[dict[str, Any]] = []
    for line in data.splitlines():
        line = line.strip()
        if not line.startswith(b"{") or len(line) > _LINE_MAX:
            continue
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


def count(value: object) -> int | None:
    """``value`` as a token count: a non-negative finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if not math.isfinite(value) or value < 0:
        return None
    return int(value)


def cost(value: object) -> float | None:
    """``value`` as a cost in USD: a non-negative finite number, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value >= 0 else None


def field_of(value: object, *path: str) -> object:
    """``value[path[0]][path[1]]...`` through dicts, None where a step is missing."""
    for key in path:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    return value


def one_line(text: object) -> str:
    """The first non-empty line of ``text`` (a str), stripped and cut; "" otherwise."""
    if not isinstance(text, str):
        return ""
    for line in text.splitlines():
        if line.strip():
            return line.strip()[:SUMMARY_CHARS]
    return ""
