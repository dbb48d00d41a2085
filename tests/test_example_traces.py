"""The README section "Improve your agent from its own traces": its commands, run as
written (slow), and the same commands on a smaller scale (default run)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import trio

import evolane
from evolane.embed import EvolvePolicy, ServiceSettings, open_evolve_service
from evolane.examples.traces import task_record, write_traces_workspace
from evolane.examples.traces._service import job_settings
from evolane.examples.traces._workspace import campaign_settings

README = Path(__file__).resolve().parent.parent / "README.md"
SECTION = "## Improve your agent from its own traces"


def readme_commands() -> list[list[str]]:
    """The shell commands of the section's bash blocks, as argv lists (``cd`` included)."""
    text = README.read_text()
    section = text[text.index(SECTION) :]
    section = section[: section.index("\n## ", len(SECTION))]
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", section, re.S):
        for line in block.splitlines():
            line = line.split("#", 1)[0].strip()
            for part in filter(None, (p.strip() for p in line.split("&&"))):
                commands.append(shlex.split(part))
    return commands


def run_readme(tmp_path: Path, smaller: bool) -> list[str]:
    """Run the section's commands in ``tmp_path``; their outputs."""
    cwd, outputs = tmp_path, []
    for argv in readme_commands():
        if argv[0] == "cd":
            cwd = cwd / argv[1]
            continue
        if smaller:
            argv = [("20" if word == "40" else word) for word in argv]
            if argv[0] == "evolane" or "--evolve" in argv:
                argv += ["--iterations", "1"]
        head = {"python": [sys.executable], "evolane": [sys.executable, "-m", "evolane"]}
        full = [*head[argv[0]], *argv[1:]]
        if argv[0] == "evolane":
            full += ["--progress", "none"]
        result = subprocess.run(full, cwd=cwd, capture_output=True, text=True, timeout=1800)
        assert result.returncode == 0, f"{argv}: {result.stdout[-2000:]}{result.stderr[-2000:]}"
        outputs.append(result.stdout)
    return outputs


def test_the_live_agent_records_its_failures_with_reasons(tmp_path: Path) -> None:
    write_traces_workspace(tmp_path / "work")
    records = [task_record(tmp_path / "work" / "target", index) for index in range(12)]
    statuses = {record["outcome"]["status"] for record in records}
    assert statuses == {"success", "failure"}
    assert all(r["outcome"].get("reason") for r in records if r["outcome"]["status"] == "failure")
    assert not (tmp_path / "work" / "dataset.jsonl").exists()  # a run from traces needs none


def test_evolane_own_example_is_not_taken_for_a_copy_of_the_cases(tmp_path: Path) -> None:
    """The walk-through's cases come from evolane's own example, whose case generator
    (``examples/selfevolve/_cases.py``) holds their strings: installed editable, its folder
    is on the path commands are shown, and the copy scan masked it, so every replay failed to
    import evolane and the README's ``evolane optimize --from-trajectory`` failed (found by
    review). evolane's own package is installed code, never scanned."""
    work = tmp_path / "work"
    write_traces_workspace(work)
    agent = [sys.executable, "-m", "evolane.examples.traces", "agent", ".", "--tasks", "20"]
    subprocess.run([*agent, "--out", "traces.jsonl"], cwd=work, check=True, capture_output=True)
    estimate = subprocess.run(
        [sys.executable, "-m", "evolane", "estimate", "--from-trajectory", "traces.jsonl"],
        cwd=work, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert estimate.returncode == 0, estimate.stdout + estimate.stderr
    assert "val/test case" not in estimate.stdout, estimate.stdout


async def test_a_background_job_of_the_walk_through_holds_every_records(tmp_path: Path) -> None:
    """``agent --evolve ... --every 20``: each job holds 20 records. Records that came
    while a job was being made went into it (40 tasks made jobs of 25 and 15 records, the
    second too small for its gate: failed, exit 1; found by README user review). Here the
    queue holds 25 when the service opens: the job takes 20 and leaves 5 queued."""
    work = tmp_path / "work"
    write_traces_workspace(work)
    settings = campaign_settings(work)
    quiet = ServiceSettings(policy=EvolvePolicy(every=None), run_jobs=False)
    async with evolane.open_runtime(store=settings["store"]) as runtime:
        async with open_evolve_service(runtime, settings, quiet) as service:
            for index in range(25):
                await service.record(task_record(work / "target", index))
        made = job_settings("shadow", 20).model_copy(update={"run_jobs": False})
        async with open_evolve_service(runtime, settings, made) as service:
            with trio.fail_after(60):  # the job is written before its records leave the
                while service.queued == 25:  # queue (journal before state): wait for both
                    await trio.sleep(0.01)
            assert [job.records for job in service.pending()] == [20]
            assert service.queued == 5


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["agent", "work", "--tasks", "-5"], "argument --tasks: -5 is below 1"),
        (["agent", "work", "--every", "0", "--evolve", "shadow"], "--every: 0 is below 1"),
        (["agent", "missing", "--out", "out.jsonl"], "No such file or directory: missing/"),
        (["agent", "work", "--out", "work"], "Is a directory: work"),
    ],
)
def test_the_agent_refuses_bad_input_in_one_line(
    tmp_path: Path, args: list[str], said: str
) -> None:
    """The walk-through's agent took ``--tasks -5`` (ran nothing, said "-5 tasks", exit 0),
    and a missing workspace or an ``--out`` folder was a traceback; a missing workspace
    left an empty ``--out`` behind (found by README user review)."""
    write_traces_workspace(tmp_path / "work")
    done = subprocess.run(
        [sys.executable, "-m", "evolane.examples.traces", *args],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert said in done.stderr.splitlines()[-1] and "Traceback" not in done.stderr
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.slow
def test_the_readme_commands_run_end_to_end_on_a_small_scale(tmp_path: Path) -> None:
    outputs = run_readme(tmp_path, smaller=True)
    assert any("finished" in out for out in outputs)
    runs = list((tmp_path / "work" / ".evolane" / "runs").iterdir())
    assert len(runs) == 3  # optimize, one shadow job, one online job
    reports = [json.loads((run / "report.json").read_text()) for run in runs]
    assert {r["config"]["apply"] for r in reports} == {"proposal", "auto_verified"}
    assert all(r["status"] == "finished" for r in reports)
    online = next(out for out in outputs if "(online)" in out)
    assert "target unchanged" in online or "target: the best candidate published" in online


@pytest.mark.slow
def test_the_readme_commands_run_end_to_end_as_written(tmp_path: Path) -> None:
    run_readme(tmp_path, smaller=False)
    done = list((tmp_path / "work" / ".evolane" / "evolve" / "done").iterdir())
    assert len(done) == 4  # two shadow jobs, two online jobs
