"""The built-in example workloads of ``--example``: their workspaces and their presets.

Read by the flag parsing of an ``optimize`` session (`evolane.cli._session`); a workspace's
example modules are imported only when that example is asked for.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

EXAMPLES = ("self-evolution", "sleeper")
"""The names ``--example`` accepts."""


def example_settings(name: str, directory: Path) -> dict[str, Any]:
    """Create (or reuse) an example's workspace and return its preset flags."""
    from evolane.inputs import InputError

    marker = directory / "example.json"
    if directory.exists() and not directory.is_dir():
        raise InputError(f"--example-dir {directory}: is not a directory")
    if marker.is_file():
        try:
            settings = json.loads(marker.read_text())
        except (OSError, ValueError) as error:
            raise InputError(f"{marker}: not an evolane example ({error})") from None
        if not isinstance(settings, dict) or settings.get("example") not in (None, name):
            held = settings.get("example") if isinstance(settings, dict) else "?"
            raise InputError(
                f"--example-dir {directory}: holds the {held} example; choose another directory"
            )
    elif directory.exists() and any(directory.iterdir()):
        raise InputError(f"--example-dir {directory}: exists and is not an evolane example")
    else:
        try:
            _write_example(name, directory)
        except OSError as error:  # /proc, /sys: one line, not an internal error (review)
            reason = error.strerror or type(error).__name__
            message = f"--example-dir {directory}: cannot write the example there: {reason}"
            raise InputError(message) from None
        settings = json.loads(marker.read_text())
    base = directory.resolve()
    settings["target"] = str(base / settings["target"])
    settings["dataset"] = str(base / settings["dataset"])
    return settings


def _write_example(name: str, directory: Path) -> None:
    if name == "self-evolution":
        from evolane.examples.selfevolve import write_workspace

        write_workspace(directory)
        settings = json.loads((directory / "example.json").read_text())
        settings.update(example=name)
    else:
        from evolane.examples.sleeper.commands import main as sleeper

        if sleeper(["init", str(directory), "--cases", "24", "--median-seconds", "0.05"]) != 0:
            raise ValueError(f"--example-dir {directory}: could not write the sleeper example")
        py = f"{sys.executable} -m evolane.examples.sleeper"
        settings = {
            "example": name,
            "target": "target",
            "dataset": "dataset.jsonl",
            "replay": f"{py} replay --case-file {{case_file}} --candidate {{candidate}} "
            "--output-dir {output_dir} --seed {seed}",
            "judge": f"{py} judge --case-file {{case_file}} --output-dir {{output_dir}} "
            "--seed {seed}",
            "optimizer": f"{py} optimize --workdir {{workdir}} --prompt-file {{prompt_file}} "
            "--seed {seed} --relative",
            "required_files": ["effect.json"],
        }
        _split_sleeper(directory)
    (directory / "example.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")


def _split_sleeper(directory: Path) -> None:
    """The sleeper writes every case to one split; give it val and test splits."""
    path = directory / "dataset.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for index, row in enumerate(rows):
        row["split"] = "test" if index % 3 == 2 else "val"
    path.write_text("".join(json.dumps(row, sort_keys=True) + "\n" for row in rows))


SELF_EVOLUTION_DEFAULTS = {
    "iterations": 10,
    "population": 3,
    "stall": 5,
    "replay_concurrency": 4,
    "judge_concurrency": 2,
    "optimizer_concurrency": 2,
    "kill_grace": 0.5,
    "replay_timeout": 30.0,
    "judge_timeout": 30.0,
    "optimizer_timeout": 60.0,
    "optimizer_idle": 20.0,
    "seed": 56,
}
"""The self-evolution example's presets: seconds-long units, so short deadlines; a seed under
which the example optimizer's faults reach every local gate within the run."""

SLEEPER_DEFAULTS = {"iterations": 4, "population": 2, "replay_concurrency": 8, "kill_grace": 0.5}
"""The sleeper example's presets."""

EXAMPLE_DEFAULTS = {"self-evolution": SELF_EVOLUTION_DEFAULTS, "sleeper": SLEEPER_DEFAULTS}
