"""A toy agent for background-evolution tests: a target folder with one answer file per task
(``"yes"`` is right), trajectory records of its tasks (the wrong ones recorded as
failures), and commands or in-process backends that replay, judge and fix it."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import trio

from evolane.embed import BackendCall

FIX_ALL = 'sh -c \'for f in "$1"/t*; do printf %s \\"yes\\" > "$f"; done\' fix {workdir}'
"""An optimizer command that makes every answer right."""
JUDGE = (
    'sh -c \'if grep -q yes "$1/output.json"; then echo {{\\"score\\": 1.0}}; '
    'else echo {{\\"score\\": 0.0}}; fi\' judge {output_dir}'
)


def replay_command(delay: float = 0.0) -> str:
    """The replay command: the candidate's answer file for the case (after ``delay`` s)."""
    pause = f"sleep {delay}; " if delay else ""
    script = f'{pause}cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"'
    return f"sh -c '{script}' replay {{candidate}} {{output_dir}}"


def failed(index: int) -> bool:
    """Whether task ``index`` is answered wrong at the seed (every fourth)."""
    return index % 4 == 0


def mostly_failed(index: int) -> bool:
    """Three tasks in four answered wrong: enough held-out failures to confirm a fix."""
    return index % 4 != 0


def write_trace_target(
    root: Path, tasks: int, wrong: Callable[[int], bool] = failed
) -> dict[str, Path]:
    """The target (answers for tasks 0..tasks-1, ``wrong`` ones wrong) and the store."""
    target = root / "target"
    target.mkdir(parents=True)
    (target / "REQUIRED").write_text("keep me\n")
    for index in range(tasks):
        (target / f"t{index:03d}").write_text('"no"' if wrong(index) else '"yes"')
    return {"target": target, "store": root / "store"}


def trace_record(index: int, *, failed: bool | None = None) -> dict[str, Any]:
    """The trajectory record of task ``index`` (a failure when its answer is wrong)."""
    wrong = (index % 4 == 0) if failed is None else failed
    return {
        "id": f"t{index:03d}",
        "session_id": f"s{index:03d}",
        "turn": 1,
        "target": "toy",
        "task": f"task {index}: answer yes",
        "messages": [
            {"role": "user", "content": f"task {index}: answer yes"},
            {"role": "assistant", "content": "no" if wrong else "yes"},
        ],
        "outcome": {"status": "failure" if wrong else "success"},
    }


def trace_config(paths: dict[str, Path], **overrides: Any) -> dict[str, Any]:
    """The flat campaign settings of the toy agent's jobs (commands; no input: each job's
    trajectories are its input)."""
    return {
        "target": str(paths["target"]),
        "store": str(paths["store"]),
        "replay": replay_command(),
        "judge": JUDGE,
        "optimizer": FIX_ALL,
        "required_files": ("REQUIRED",),
        "iterations": 1,
        "population": 1,
        "kill_grace": 0.3,
        "replay_timeout": 30.0,
        "judge_timeout": 30.0,
        "optimizer_timeout": 30.0,
        "isolation": "process",
        "gate": {"gate": "paired", "min_cases": 3},
        **overrides,
    }


def backend_config(paths: dict[str, Path], **overrides: Any) -> dict[str, Any]:
    """`trace_config` with in-process backends (see `BACKENDS`)."""
    names = {"replay": "backend:replay", "judge": "backend:judge", "optimizer": "backend:fix"}
    return trace_config(paths, **names, **overrides)


async def replay_backend(call: BackendCall) -> dict[str, Any]:
    """The candidate's answer for the case, in-process."""
    assert call.candidate is not None and call.output_dir is not None and call.case is not None
    (call.output_dir / "output.json").write_text((call.candidate / call.case["id"]).read_text())
    return {"tokens": 1, "cost_usd": 0.0}


async def judge_backend(call: BackendCall) -> float:
    """1 for a right answer."""
    assert call.output_dir is not None
    return 1.0 if json.loads((call.output_dir / "output.json").read_text()) == "yes" else 0.0


async def fix_backend(call: BackendCall) -> str:
    """Make every answer right."""
    assert call.workdir is not None
    for path in call.workdir.glob("t*"):
        path.write_text('"yes"')
    return "fixed all"


PYTHON = sys.executable


REPO = Path(__file__).resolve().parent.parent


def agent_report(source: str, *args: str) -> dict[str, Any]:
    """Run ``source`` as an agent's own Python process (from the repository, its
    RuntimeWarnings silenced) and return the JSON object its last stdout line prints; the
    process must exit 0."""
    result = subprocess.run(
        [sys.executable, "-W", "ignore::RuntimeWarning", "-c", source, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.splitlines()[-1])


async def until(predicate: Callable[[], bool], seconds: float = 300) -> None:
    """Poll ``predicate`` (a guard against a hang, not a timing figure)."""
    with trio.fail_after(seconds):
        while not predicate():
            await trio.sleep(0.05)
