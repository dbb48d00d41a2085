"""The example workspace: the target tree (skill, grader, data) and the campaign settings.

The target holds no case: every candidate gets a copy of it, and a copy of the dataset in
``data/`` (as this example once had, protected from edits but readable) handed a model
optimizer every val and test answer; a campaign now refuses such a target."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from evolane.examples.selfevolve._cases import dataset_jsonl, make_dataset
from evolane.examples.selfevolve._reward import WEIGHTS
from evolane.examples.selfevolve._seed import SEED_SKILL

MODULE = "evolane.examples.selfevolve"
PROTECTED = ("grader/**", "data/**")


def commands(python: str = sys.executable, cases_module: str = MODULE) -> dict[str, str]:
    """The replay, judge, optimizer and validator command templates (DESIGN §8);
    ``cases_module`` replays and judges (another example's cases: the traces example)."""
    base, cases = f"{python} -m {MODULE}", f"{python} -m {cases_module}"
    return {
        "replay": f"{cases} replay --case-file {{case_file}} --candidate {{candidate}} "
        "--output-dir {output_dir}",
        "judge": f"{cases} judge --case-file {{case_file}} --output-dir {{output_dir}}",
        "optimizer": f"{base} optimize --workdir {{workdir}} --prompt-file {{prompt_file}} "
        "--seed {seed}",
        "validator": f"{base} validate {{candidate}}",
    }


def write_workspace(directory: Path) -> Path:
    """Create ``directory`` with ``target/``, ``dataset.jsonl`` and ``example.json``."""
    target = directory / "target"
    for sub in ("skill", "grader", "data"):
        (target / sub).mkdir(parents=True, exist_ok=True)
    dataset = dataset_jsonl(make_dataset())
    (target / "skill" / "SKILL.md").write_text(SEED_SKILL)
    rubric = {"weights": WEIGHTS, "note": "the judge's rubric; protected from candidates"}
    (target / "grader" / "rubric.json").write_text(
        json.dumps(rubric, indent=2, sort_keys=True) + "\n"
    )
    fields = {"fields": list(WEIGHTS), "note": "the answer's fields; protected from candidates"}
    (target / "data" / "answer_format.json").write_text(json.dumps(fields, indent=2) + "\n")
    (directory / "dataset.jsonl").write_text(dataset)
    settings = {
        "target": "target",
        "dataset": "dataset.jsonl",
        "protected": list(PROTECTED),
        "required_files": ["skill/SKILL.md"],
        **commands(),
    }
    (directory / "example.json").write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return directory
