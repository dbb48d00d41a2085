"""Copies of the held-out cases in a folder the commands are shown (found by holdout review):
a real ``evolane optimize``, confined by bubblewrap, whose replay program sits in a project
folder beside the trajectory log the dataset was built from. The log's val/test answers
reach no command (masked as the dataset is) and the preflight names it; a folder over the
walk's caps is said in one line; a copy of train cases only is the optimizer's to see."""

from __future__ import annotations

import json
import re
import site
import subprocess
import sys
from pathlib import Path

import pytest

import evolane
from evolane.sandbox._confine import confinement_problem

pytestmark = pytest.mark.skipif(confinement_problem() is not None, reason="needs bubblewrap")

CASES = {"train": 6, "val": 10, "test": 4}


def _row(split: str, index: int) -> dict[str, object]:
    return {
        "id": f"{split}{index:02d}",
        "split": split,
        "input": {"question": f"Which harbour does ferry route {split}-{index} end at today?"},
        "expected_output": f"The route {split}-{index} ends at Harbour {index * 7919 + 13}",
    }


def _project(root: Path, copied: tuple[str, ...]) -> dict[str, Path]:
    """A target, its dataset, and a project folder holding the replay's program and a
    trajectory-style log of the ``copied`` splits' cases (a row per session)."""
    target = root / "target"
    target.mkdir()
    (target / "notes.md").write_text("answer the question\n")
    rows = [_row(split, i) for split, count in CASES.items() for i in range(count)]
    dataset = root / "dataset.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    proj, sink = root / "proj", root / "sink"
    proj.mkdir()
    sink.mkdir()
    sessions = [
        {"session_id": row["id"], "messages": [
            {"role": "user", "content": row["input"]["question"]},  # type: ignore[index]
            {"role": "assistant", "content": row["expected_output"]},
        ]}
        for row in rows if row["split"] in copied
    ]  # fmt: skip
    (proj / "traces.jsonl").write_text("".join(json.dumps(s) + "\n" for s in sessions))
    # The replay's program reads the log beside it, as a candidate's code could.
    (proj / "agent.sh").write_text(
        'cat "$(dirname "$0")/traces.jsonl" >> "$2/seen.txt" 2>&1\n'
        'echo \'"x"\' > "$1/output.json"\n'
    )
    return {"target": target, "dataset": dataset, "proj": proj, "sink": sink}


def _evolane(
    root: Path, paths: dict[str, Path], command: str = "optimize", isolation: str = "confined"
) -> subprocess.CompletedProcess[str]:
    flags = [
        "--target", str(paths["target"]), "--dataset", str(paths["dataset"]),
        "--store", str(root / "store"), "--optimizer", "true", "--iterations", "1",
        "--replay", f"sh {paths['proj'] / 'agent.sh'} {{output_dir}} {paths['sink']}",
        "--expose-rw", f"replay={paths['sink']}", "--isolation", isolation,
        "--progress", "plain", "--kill-grace", "0.3",
    ]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "evolane", command, *flags],
        capture_output=True, text=True, timeout=300, cwd=root,
    )  # fmt: skip


def test_a_log_of_test_answers_beside_the_replay_is_masked_and_named(tmp_path: Path) -> None:
    paths = _project(tmp_path, ("val", "test"))
    done = _evolane(tmp_path, paths)
    said = done.stdout + done.stderr
    seen = (paths["sink"] / "seen.txt").read_text()
    assert "Harbour" not in seen + said, seen  # no replay read an answer
    assert done.returncode == 0, said
    unwrapped = re.sub(r"\n\[ *[\d.]+s\] +", " ", said)  # the live view's wrapped lines
    cases = CASES["val"] + CASES["test"]
    assert f"holds {cases} val/test cases: masked from every command" in unwrapped, said
    estimate = _evolane(tmp_path, paths, "estimate").stdout  # its lines whole
    log = paths["proj"] / "traces.jsonl"
    assert f"preflight: {log} holds {cases} val/test cases: masked" in estimate, estimate
    report = next((tmp_path / "store").glob("runs/*/report.md")).read_text()
    assert f"- {log} holds {cases} val/test cases: masked from every command" in report, report


def test_a_copy_of_train_cases_only_stays_shown(tmp_path: Path) -> None:
    """Train cases are the optimizer's to see: their copy is no leak, and stays readable
    beside a masked copy of the val/test cases."""
    paths = _project(tmp_path, ("val", "test"))
    train = [_row("train", i) for i in range(CASES["train"])]
    (paths["proj"] / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in train))
    (paths["proj"] / "agent.sh").write_text(
        'cat "$(dirname "$0")/train.jsonl" "$(dirname "$0")/traces.jsonl" >> "$2/seen.txt"\n'
        'echo \'"x"\' > "$1/output.json"\n'
    )
    done = _evolane(tmp_path, paths)
    said = done.stdout + done.stderr
    seen = (paths["sink"] / "seen.txt").read_text()
    assert "route train-1 ends at Harbour" in seen, said
    assert "route val-1 ends" not in seen and "route test-1 ends" not in seen, seen
    assert "train.jsonl" not in said and done.returncode == 0, said


def test_a_folder_over_the_caps_is_said(tmp_path: Path) -> None:
    """A file over the walk's cap for one file (sparse: no disk taken) gets one preflight
    line naming its folder: a copy past the cap is not masked, and the user is told."""
    paths = _project(tmp_path, ("val", "test"))
    with open(paths["proj"] / "weights.bin", "wb") as big:
        big.truncate((128 << 20) + 1)
    estimate = _evolane(tmp_path, paths, "estimate")
    cut = [line for line in estimate.stdout.splitlines() if "not scanned whole" in line]
    assert cut == [
        f"preflight: {paths['proj']} was not scanned whole for copies of the val/test cases "
        "(weights.bin is over 128 MiB): a copy there is not masked"
    ], estimate.stdout + estimate.stderr


def test_the_reports_say_what_the_copy_scan_found(tmp_path: Path) -> None:
    """A user reading report.md or report.html after the run sees the preflight's lines on
    copies: the warning that every command could read one, the folder not scanned whole
    (they were in the live view, the estimate and events.jsonl alone)."""
    paths = _project(tmp_path, ("val", "test"))
    with open(paths["proj"] / "weights.bin", "wb") as big:
        big.truncate((128 << 20) + 1)
    done = _evolane(tmp_path, paths, isolation="process")
    assert done.returncode == 0, done.stdout + done.stderr
    run = next((tmp_path / "store").glob("runs/*/"))
    report, page = (run / "report.md").read_text(), (run / "report.html").read_text()
    log, proj = paths["proj"] / "traces.jsonl", paths["proj"]
    warned = f"{log} holds 14 val/test cases and every command can read it"
    cut = f"{proj} was not scanned whole for copies of the val/test cases"
    assert f"- **warning**: {warned}" in report and f"- {cut}" in report, report
    assert f"<th>preflight</th><td>warning: {warned}" in page and cut in page, page


def test_without_confinement_the_copy_is_warned_of(tmp_path: Path) -> None:
    """Nothing can be masked from an unconfined command: one warning line, with the advice."""
    paths = _project(tmp_path, ("val", "test"))
    estimate = _evolane(tmp_path, paths, "estimate", isolation="process").stdout
    log = paths["proj"] / "traces.jsonl"
    assert (
        f"preflight: warning: {log} holds 14 val/test cases and every command can read it"
    ) in estimate, estimate


def test_a_judge_naming_a_copy_is_refused(tmp_path: Path) -> None:
    """Masked, a judge reading its answers from a copy would read nothing: refused, exit 2,
    with where the expected outputs come from instead."""
    paths = _project(tmp_path, ("val", "test"))
    log = paths["proj"] / "traces.jsonl"
    refused = subprocess.run(
        [sys.executable, "-m", "evolane", "estimate", "--target", str(paths["target"]),
         "--dataset", str(paths["dataset"]), "--store", str(tmp_path / "store"),
         "--optimizer", "true", "--replay", f"sh {paths['proj'] / 'agent.sh'} {{output_dir}} x",
         "--judge", f"grep -c x {log} {{output_dir}}", "--isolation", "confined"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert f"--judge names {log}, which holds val/test cases" in refused.stderr, refused.stderr
    assert "{case_file}" in refused.stderr


def test_a_folder_of_one_session_a_file_is_masked(tmp_path: Path) -> None:
    """Trajectories kept a session a file hold one held-out case each: together they are
    the answers, so each file holding one is masked (a file of another folder with one
    case alone is not: a chance match)."""
    paths = _project(tmp_path, ())
    sessions = paths["proj"] / "sessions"
    sessions.mkdir()
    for split in ("val", "test"):
        for i in range(CASES[split]):
            row = _row(split, i)
            (sessions / f"{row['id']}.json").write_text(json.dumps(row, indent=2))
    lone = paths["proj"] / "notes"
    lone.mkdir()
    (lone / "one.txt").write_text(str(_row("val", 3)["expected_output"]) + "\n")
    estimate = _evolane(tmp_path, paths, "estimate").stdout
    named = [line for line in estimate.splitlines() if "val/test case" in line]
    assert f"preflight: {sessions}/" in named[0] and "holds 1 val/test case: masked" in named[0]
    held = CASES["val"] + CASES["test"]
    assert named[-1] == f"preflight: {held - 2} more files hold val/test cases: masked as well"
    assert "one.txt" not in estimate, estimate


def test_the_prefix_of_the_program_a_replay_runs_is_scanned(tmp_path: Path) -> None:
    """A confined ``/proj/bin/agent`` is shown all of ``/proj`` (its program's prefix), not
    only ``/proj/bin``: the log in ``/proj`` is found there too; the installed code of a
    virtual environment in it is not walked."""
    paths = _project(tmp_path, ("val", "test"))
    agent = paths["proj"] / "bin" / "agent"
    agent.parent.mkdir()
    agent.write_text('#!/bin/sh\necho \'"x"\' > "$1/output.json"\n')
    agent.chmod(0o755)
    venv = paths["proj"] / ".venv"
    installed = venv / "lib" / "python3.11" / "site-packages" / "pkg"
    installed.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
    (installed / "copy.jsonl").write_text((paths["proj"] / "traces.jsonl").read_text())
    estimate = subprocess.run(
        [sys.executable, "-m", "evolane", "estimate", "--target", str(paths["target"]),
         "--dataset", str(paths["dataset"]), "--store", str(tmp_path / "store"),
         "--optimizer", "true", "--replay", f"{agent} {{output_dir}}", "--isolation", "confined"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    log = paths["proj"] / "traces.jsonl"
    assert f"preflight: {log} holds 14 val/test cases: masked" in estimate.stdout, estimate
    assert "copy.jsonl" not in estimate.stdout


def _venv_with_editable(root: Path, project: Path) -> Path:
    """A virtual environment's Python that finds evolane and its dependencies, with
    ``project`` installed editable as pip installs a flat layout (its root in a .pth)."""
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    packages = next((venv / "lib").glob("python3*/site-packages"))
    ours = Path(evolane.__file__).resolve().parents[1]
    deps = [*site.getsitepackages(), site.getusersitepackages()]  # this test's own packages
    (packages / "_deps.pth").write_text(
        f"{ours}\nimport site; list(map(site.addsitedir, {deps!r}))\n"
    )
    (packages / "__editable__.proj-0.1.pth").write_text(f"{project}\n")
    return venv / "bin" / "python"


def test_the_root_of_a_project_installed_editable_is_scanned(tmp_path: Path) -> None:
    """A flat project installed editable has its root on the interpreter's path, which every
    confined command is shown: a replay importing the package read the log at its root
    (found by review); the log is masked and named, though no template names the root."""
    paths = _project(tmp_path, ("val", "test"))
    package = paths["proj"] / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "agent.py").write_text(
        "import sys\nfrom pathlib import Path\n"
        "log = Path(__file__).resolve().parents[1] / 'traces.jsonl'\n"
        "with open(Path(sys.argv[2]) / 'seen.txt', 'a') as seen:\n"
        "    try:\n        seen.write(log.read_text())\n"
        "    except OSError as error:\n        seen.write(str(error))\n"
        "(Path(sys.argv[1]) / 'output.json').write_text('\"x\"')\n"
    )
    python = _venv_with_editable(tmp_path, paths["proj"])
    flags = [
        "--target", str(paths["target"]), "--dataset", str(paths["dataset"]),
        "--store", str(tmp_path / "store"), "--optimizer", "true", "--iterations", "1",
        "--replay", f"{python} -m mypkg.agent {{output_dir}} {paths['sink']}",
        "--expose-rw", f"replay={paths['sink']}", "--isolation", "confined",
        "--progress", "plain", "--kill-grace", "0.3",
    ]  # fmt: skip
    done = subprocess.run(
        [python, "-m", "evolane", "optimize", *flags],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    said = done.stdout + done.stderr
    seen = (paths["sink"] / "seen.txt").read_text()
    assert "Harbour" not in seen + said, seen  # no replay read an answer
    assert done.returncode == 0, said
    report = json.loads(next((tmp_path / "store").glob("runs/*/report.json")).read_text())
    log = paths["proj"] / "traces.jsonl"
    said = f"{log} holds 14 val/test cases: masked from every command, as the dataset is"
    assert said in report["estimate"]["preflight"], report["estimate"]
