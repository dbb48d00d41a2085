"""The traces example's workspace: the self-evolution target and an ``evolane.toml`` whose
commands replay and judge cases derived from the agent's trajectory records."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from evolane.examples.selfevolve import commands as selfevolve_commands
from evolane.examples.selfevolve import write_workspace

MODULE = "evolane.examples.traces"
SEARCH = {"iterations": 4, "population": 2, "stall": 4, "seed": 56}
"""A small search: each background job is a short campaign."""


def commands(python: str = sys.executable) -> dict[str, str]:
    """Replay and judge for trajectory cases; the self-evolution optimizer and validator."""
    return selfevolve_commands(python, cases_module=MODULE)


def campaign_settings(directory: Path, python: str = sys.executable) -> dict[str, Any]:
    """The flat campaign settings of the example (no input: a run or job names its traces)."""
    root = directory.absolute()
    return {
        "target": str(root / "target"),
        "store": str(root / ".evolane"),
        "protected": ("grader/**", "data/**"),
        "required_files": ("skill/SKILL.md",),
        "replay_timeout": 30.0,
        "judge_timeout": 30.0,
        "optimizer_timeout": 60.0,
        "kill_grace": 0.5,
        **SEARCH,
        **commands(python),
    }


def write_traces_workspace(directory: Path) -> Path:
    """Create ``directory`` with ``target/`` (the seed skill) and ``evolane.toml``."""
    write_workspace(directory)
    for stale in ("dataset.jsonl", "example.json"):  # a run from traces needs no dataset
        (directory / stale).unlink()
    settings = campaign_settings(directory)
    lines = ["# evolane optimize reads these settings (flags win); see the README"]
    lines += ['target = "target"', 'store = ".evolane"']  # relative to this file's folder
    for key in (*SEARCH, "replay", "judge", "optimizer", "validator"):
        lines.append(f"{key.replace('_', '-')} = {_toml(settings[key])}")
    lines.append(f"protected = {_toml(list(settings['protected']))}")
    lines.append(f"required-file = {_toml(list(settings['required_files']))}")
    (directory / "evolane.toml").write_text("\n".join(lines) + "\n")
    return directory


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, list):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    return str(value)
