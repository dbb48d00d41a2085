"""Campaigns from trajectory files: a real ``evolane optimize --from-trajectory`` run whose
report lists the groups and the excluded turns, the optimizer's failure index from the
recorded traces, the config file, and a resume that replays the same cases after the
trajectory files changed or vanished."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from evolane.campaign import CampaignConfig
from evolane.campaign._prepare import prepare_run
from evolane.inputs import InputError
from tests.campaign_helpers import OPTIMIZER, REPLAY

JUDGE = (
    'if grep -q yes "$1/output.json"; then echo \'{"score": 1}\'; else echo \'{"score": 0}\'; fi\n'
)
CASES = 20
PASSING = 6


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "evolane", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=cwd)


def _workload(root: Path, plan: dict[str, str]) -> dict[str, Path]:
    """A toy agent's target (one answer file per case), its trajectory log (a few cases
    failed, one follow-up lost its context, another task family), a judge and an optimizer."""
    target = root / "target"
    target.mkdir(parents=True)
    rows: list[dict[str, Any]] = []
    for i in range(CASES):
        good = i < PASSING
        (target / f"c{i:02d}").write_text('"yes"' if good else '"no"')
        rows.append(
            {
                "session_id": f"s{i}",
                "turn": 0,
                "id": f"c{i:02d}",
                "target": "toy",
                "messages": [
                    {"role": "user", "content": f"question {i}"},
                    {"role": "tool", "content": f"lookup {i}: ok"},
                    {"role": "assistant", "content": "yes" if good else "no"},
                ],
                "outcome": {"status": "success" if good else "failure", "reason": f"bad {i}"},
            }
        )
    rows.append({"session_id": "s3", "turn": 2, "id": "lost", "target": "toy", "task": "and?"})
    logs = root / "logs"
    logs.mkdir()
    other = {"session_id": "o", "turn": 0, "target": "other", "task": "x"}
    (logs / "other.jsonl").write_text(json.dumps(other) + "\n")
    trajectory = root / "agent.jsonl"
    trajectory.write_text("".join(json.dumps(row) + "\n" for row in rows))
    (root / "judge.sh").write_text(JUDGE)
    (root / "optimizer.py").write_text(OPTIMIZER)
    (root / "plan.json").write_text(json.dumps(plan))
    (root / "record").mkdir(exist_ok=True)
    return {"root": root, "target": target, "trajectory": trajectory, "logs": logs}


def _flags(paths: dict[str, Path]) -> list[str]:
    root = paths["root"]
    optimizer = f"{sys.executable} -I {root / 'optimizer.py'} {{workdir}} {{prompt_file}} "
    return [
        "--target", str(paths["target"]), "--store", str(root / "store"),
        "--replay", REPLAY, "--judge", f"sh {root / 'judge.sh'} {{output_dir}}",
        "--optimizer", optimizer + str(root / "plan.json"), "--gate", "strict",
        "--iterations", "1", "--population", "1", "--progress", "none", "--kill-grace", "0.3",
        "--expose-rw", str(root / "record"),
    ]  # fmt: skip


def test_optimize_from_trajectory_runs_and_reports_groups_and_excluded_turns(
    tmp_path: Path,
) -> None:
    record = tmp_path / "record"
    paths = _workload(tmp_path, {"default": "cure", "_record": str(record / "prompts.jsonl")})
    flags = [*_flags(paths), "--from-trajectory", str(paths["trajectory"])]
    done = _run(["optimize", *flags, "--from-trajectory", str(paths["logs"])], tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    (run_dir,) = (tmp_path / "store" / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    summary = report["trajectories"]
    assert summary["chosen"] == "toy" and "largest group with failures" in summary["choice"]
    groups = {g["name"]: g for g in summary["groups"]}
    assert groups["toy"]["cases"] == CASES and groups["toy"]["chosen"] is True
    assert groups["toy"]["failures"] == CASES - PASSING and groups["other"]["chosen"] is False
    assert [(e["id"], e["reason"]) for e in summary["excluded"]] == [
        ("lost", "context_incomplete: turn 1 of session 's3' is missing")
    ]
    assert report["selected"] is not None  # the cure was accepted on val
    markdown = (run_dir / "report.md").read_text()
    assert "## Trajectories" in markdown and "| toy | 20 | 14 | 1 | 95% | yes |" in markdown
    assert "- `lost` (toy, " in markdown
    stored = Path(report["config"]["dataset"])
    assert stored.parent.parent == tmp_path / "store" / "trajectories"
    # the optimizer saw the recorded failures of the cases it is shown (train), no others
    prompt = json.loads(
        json.loads((record / "prompts.jsonl").read_text().splitlines()[0])["prompt"]
    )
    splits = {json.loads(line)["id"]: json.loads(line)["split"] for line in stored.open()}
    recorded = {item["id"]: item["reason"] for item in prompt["recorded_failures"]}
    assert recorded and {splits[case] for case in recorded} == {"train"}
    case = next(iter(recorded))
    assert recorded[case] == f"bad {int(case[1:])} | assistant: no"


def test_the_choice_is_printed_and_dataset_and_from_trajectory_are_exclusive(
    tmp_path: Path,
) -> None:
    paths = _workload(tmp_path, {})
    flags = [*_flags(paths), "--from-trajectory", str(paths["trajectory"])]
    done = _run(["optimize", *flags, "--dry-run"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert "preflight: trajectories: group toy: the largest group with failures" in done.stdout
    assert "1 turns left out (context_incomplete)" in done.stdout
    done = _run(["optimize", *flags, "--dataset", str(paths["trajectory"])], tmp_path)
    assert done.returncode == 2
    assert "--dataset and --from-trajectory: give one of them" in done.stderr
    done = _run(["optimize", *flags, "--group", "nope", "--dry-run"], tmp_path)
    assert done.returncode == 2 and "--group nope: no such group" in done.stderr


def test_the_config_file_takes_from_trajectory_and_group(tmp_path: Path) -> None:
    paths = _workload(tmp_path, {})
    (tmp_path / "evolane.toml").write_text(
        'from-trajectory = ["logs", "agent.jsonl"]\ngroup = "toy"\n'
    )
    done = _run(["config", "show", "--json", *_flags(paths)], tmp_path)
    assert done.returncode == 0, done.stderr
    settings = json.loads(done.stdout)["settings"]
    assert settings["from_trajectory"]["value"] == [str(paths["logs"]), str(paths["trajectory"])]
    assert settings["group"]["value"] == "toy"
    assert settings["group"]["source"].endswith("evolane.toml:2")


def _config(paths: dict[str, Path]) -> CampaignConfig:
    root = paths["root"]
    return CampaignConfig(
        target=str(paths["target"]),
        from_trajectory=(str(paths["trajectory"]),),
        store=str(root / "store"),
        replay=REPLAY,
        judge=f"sh {root / 'judge.sh'} {{output_dir}}",
        optimizer="true",
        gate={"gate": "strict"},
    )


async def test_the_embedded_api_runs_a_campaign_from_trajectories(tmp_path: Path) -> None:
    import evolane
    from evolane.embed import OptimizeRequest

    paths = _workload(tmp_path, {"default": "cure"})
    root = paths["root"]
    optimizer = f"{sys.executable} -I {root / 'optimizer.py'} {{workdir}} {{prompt_file}} "
    config = _config(paths).model_copy(
        update={"optimizer": optimizer + str(root / "plan.json"), "iterations": 1,
                "population": 1, "from_trajectory": (str(paths["trajectory"]), str(paths["logs"]))}
    )  # fmt: skip
    async with evolane.open_runtime(store=root / "store") as runtime:
        handle = await runtime.start_optimize(OptimizeRequest(config=config))
        outcome = await handle.result()
    report = outcome.report
    assert report is not None and report.status == "finished" and report.selected is not None
    assert report.trajectories is not None and report.trajectories.chosen == "toy"
    assert [e.id for e in report.trajectories.excluded] == ["lost"]
    assert report.config.from_trajectory == config.from_trajectory


@pytest.mark.parametrize("change", ["edited", "removed"])
def test_a_resume_replays_the_cases_of_its_start(tmp_path: Path, change: str) -> None:
    paths = _workload(tmp_path, {})
    first = prepare_run(_config(paths))
    first.persist()
    cases = first.dataset.canonical_jsonl()
    if change == "edited":
        text = paths["trajectory"].read_text().replace('"no"', '"maybe"')
        paths["trajectory"].write_text(text.replace("question 1", "question one"))
    else:
        os.remove(paths["trajectory"])
    resumed = prepare_run(_config(paths), resume_run=first.run.run_id)
    assert resumed.dataset.canonical_jsonl() == cases
    assert resumed.dataset.digest == first.run.dataset_digest
    if change == "edited":  # a new run reads the trajectories as they are now
        assert prepare_run(_config(paths)).dataset.digest != first.dataset.digest
    else:
        with pytest.raises(InputError, match="no such file or directory"):
            prepare_run(_config(paths))


def test_many_trajectory_files_are_each_hidden_from_commands(tmp_path: Path) -> None:
    """Found by review: each trajectory file is hidden from every command, and more than 13
    of them overflowed the hidden paths' bound: the run died on a validation error."""
    files = []
    for i in range(20):
        record = {
            "session_id": f"s{i}", "turn": 0, "target": "g",
            "messages": [{"role": "user", "content": f"task {i}"},
                         {"role": "assistant", "content": "no"}],
            "outcome": {"status": "failure", "reason": "wrong"},
        }  # fmt: skip
        files.append(tmp_path / f"t{i:02d}.jsonl")
        files[-1].write_text(json.dumps(record) + "\n")
    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "notes.md").write_text("rules\n")
    run = [sys.executable, "-m", "evolane", "optimize", "--target", str(tmp_path / "target"),
           *(w for f in files for w in ("--from-trajectory", str(f))),
           "--optimizer", "true", "--iterations", "1", "--progress", "none"]  # fmt: skip
    peek = f"sh -c 'cat {files[-1]}; echo 1 > \"$1/output.json\"' r {{output_dir}}"
    refused = subprocess.run(
        [*run, "--store", str(tmp_path / "a"), "--replay", peek, "--isolation", "confined"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    if refused.returncode != 2 or "never sees" not in refused.stderr:  # no bubblewrap here?
        assert "confine" in refused.stderr, refused.stdout + refused.stderr
    else:  # the 20th file is hidden like the first
        assert str(files[-1]) in refused.stderr
    write = "sh -c 'echo 1 > \"$1/output.json\"' r {output_dir}"
    done = subprocess.run(
        [*run, "--store", str(tmp_path / "b"), "--replay", write],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert "validation error" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert list((tmp_path / "b" / "runs").glob("*/report.json")), done.stdout + done.stderr
