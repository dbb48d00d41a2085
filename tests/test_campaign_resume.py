"""Crash-consistent resume: ``evolane optimize`` killed with SIGKILL at several journal
positions, then ``--resume``, reaches the uninterrupted run's decisions, re-running at most
the units that were in flight."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import pytest
import trio

from evolane.campaign._config import CampaignConfig
from evolane.campaign._run import RunRequest, run_campaign
from evolane.campaign._runs import StoreLayout, load_run
from evolane.measure import replay_names
from evolane.store import read_journal
from tests.campaign_helpers import publishing_config, toy_config, toy_flags, with_flag, write_toy

# iteration 0 accepts nothing (the stall count rises); 1 and 2 accept
PLAN = {"0.0": "harm:1", "0.1": "noop", "1.0": "fix:2", "1.1": "harm:2", "2.0": "fix:1"}
LANES = 3


def _optimize(args: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "evolane", "optimize", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _finish(process: subprocess.Popen[bytes]) -> int:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, (out.decode(), err.decode())
    return process.returncode


def _report(store: Path) -> dict:
    (path,) = (store / "runs").glob("*/report.json")
    return json.loads(path.read_text())


def _decisions(report: dict) -> list[tuple]:
    return [
        (d["iteration"], d["slot"], d["digest"], d["decision"], d["reason"])
        for d in report["decisions"]
    ]


def _journal_records(store: Path) -> list[dict]:
    journals = list((store / "runs").glob("*/journal.jsonl"))
    return read_journal(journals[0]).records if journals else []


@pytest.fixture(scope="module")
def reference_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder of the uninterrupted run (``store``, ``replays.log``): tests read it, and
    one that adds a run works on a copy of the store."""
    root = tmp_path_factory.mktemp("reference")
    paths = write_toy(root, PLAN)
    _finish(_optimize(toy_flags(paths, root / "store", root / "replays.log")))
    return root


@pytest.fixture(scope="module")
def reference(reference_root: Path) -> tuple[dict, int]:
    log = reference_root / "replays.log"
    return _report(reference_root / "store"), len(log.read_text().splitlines())


@pytest.mark.parametrize("kill_after", [1, 12, 40])
def test_resume_after_sigkill_reaches_the_same_decisions(
    tmp_path: Path, reference: tuple[dict, int], kill_after: int
) -> None:
    expected, _ = reference
    paths = write_toy(tmp_path, PLAN)
    store, log = tmp_path / "store", tmp_path / "replays.log"
    process = _optimize(toy_flags(paths, store, log))
    deadline = time.monotonic() + 60
    while len(_journal_records(store)) < kill_after:
        assert process.poll() is None, "the run ended before the kill point"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    (run_dir,) = (store / "runs").iterdir()
    assert not (run_dir / "report.json").exists()
    finished = set(replay_names(_journal_records(store)))  # the names the replays ran as
    before = set(log.read_text().split())
    resumed = _optimize(["--resume", run_dir.name, "--store", str(store), "--progress", "none"])
    _finish(resumed)
    report = _report(store)
    assert _decisions(report) == _decisions(expected)
    assert report["resumed"] == 1
    assert sum(m["units_restored"] for m in report["measurements"]) > 0
    launched = log.read_text().split()
    after = launched[len(before) :] if len(launched) >= len(before) else []
    assert not finished & set(after)  # a finished replay never runs again
    assert before & set(after) <= before - finished  # only replays in flight at the kill re-run
    again = _optimize(["--resume", run_dir.name, "--store", str(store)])
    _, err = again.communicate(timeout=60)
    assert again.returncode == 2 and b"already ended (finished)" in err  # nothing to resume


def test_rerun_evaluator_judges_stored_replays_and_replays_nothing(
    tmp_path: Path, reference_root: Path
) -> None:
    # The uninterrupted run, in a copy of its store; its replay command still logs to
    # reference_root's replays.log, so a replay run again would show there.
    store, log = tmp_path / "store", reference_root / "replays.log"
    shutil.copytree(reference_root / "store", store)
    (first,) = (store / "runs").iterdir()
    launches = len(log.read_text().splitlines())
    judge = tmp_path / "lenient.sh"
    judge.write_text("echo '{\"score\": 1.0}'\n")
    _finish(
        _optimize(
            [
                "--from-run",
                first.name,
                "--rerun-evaluator",
                "--judge",
                f"sh {judge}",
                "--store",
                str(store),
                "--progress",
                "none",
            ]
        )
    )
    assert len(log.read_text().splitlines()) == launches  # not one replay ran again
    (second,) = [p for p in (store / "runs").iterdir() if p.name != first.name]
    report = json.loads((second / "report.json").read_text())
    assert report["config"]["judge"] == f"sh {judge}"
    measured = [m for m in report["measurements"] if m["purpose"] == "paired"]
    assert measured and all(m["units_run"] == 0 for m in measured)
    assert sum(m["units_restored"] for m in report["measurements"]) > 0
    # every stored replay now scores 1.0: no candidate can beat its parent under a strict gate
    assert all(d["decision"] != "accept" for d in report["decisions"])
    # its estimate says so (found by estimate review: "at most 118 replays, 118 judge calls,
    # 6 optimizer calls" at the start of a re-judge that replayed nothing)
    events = [json.loads(line) for line in (second / "events.jsonl").read_text().splitlines()]
    (estimate,) = [e for e in events if e["kind"] == "event.estimate"]
    assert estimate["replays_max"] == estimate["optimizer_calls_max"] == 0
    judged = sum(m["units_restored"] for m in report["measurements"])
    assert estimate["judge_calls_max"] >= judged


# -- a kill right after run.json is first written -------------------------------------------

DIE_AFTER_RUN_RECORD = """
import os, sys, trio
from evolane.campaign import _prepare
from evolane.campaign._config import CampaignConfig
from evolane.campaign._run import RunRequest, run_campaign
from evolane.measure import replay_names

real = _prepare.save_run

def save_then_die(layout, record):
    real(layout, record)
    os._exit(9)  # no cleanup at all: as a SIGKILL right after the rename of run.json

_prepare.save_run = save_then_die
trio.run(run_campaign, RunRequest(CampaignConfig.model_validate_json(sys.argv[1])))
"""


async def test_a_run_killed_right_after_its_record_was_written_resumes(tmp_path: Path) -> None:
    """Found by crash-point enumeration (SIGKILL at the 2nd rename): run.json named a
    campaign whose campaign.json was not written yet, and ``--resume`` died on it with an
    internal error; the campaign's record is now written first."""
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, iterations=1, population=1)
    argv = [sys.executable, "-c", DIE_AFTER_RUN_RECORD, config.model_dump_json()]
    died = await trio.to_thread.run_sync(
        partial(subprocess.run, argv, capture_output=True, timeout=120)
    )
    assert died.returncode == 9, died.stderr.decode()
    (run_dir,) = (paths["store"] / "runs").iterdir()
    assert (run_dir / "run.json").is_file()
    with trio.fail_after(60):
        outcome = await run_campaign(RunRequest(config, resume_run=run_dir.name))
    assert outcome.report is not None and outcome.report.status == "finished"


# -- a crash in the middle of an apply, recovered at the next start -------------------------

DIE_MID_APPLY = """
import os, sys, trio
from evolane.campaign import _apply
from evolane.campaign._config import CampaignConfig
from evolane.campaign._run import RunRequest, run_campaign
from evolane.measure import replay_names

step, config = sys.argv[1], CampaignConfig.model_validate_json(sys.argv[2])
real = _apply._write_journal

def write_then_die(path, record):
    real(path, record)
    if record.state == step:
        os._exit(9)  # no cleanup at all: as a SIGKILL right after the step

_apply._write_journal = write_then_die
trio.run(run_campaign, RunRequest(config))
"""


def _answers(target: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(target.iterdir()) if p.is_file()}


async def _die_mid_apply(paths: dict[str, Path], step: str) -> tuple[CampaignConfig, str]:
    """Run a cycle with ``auto_verified`` in a child that dies once the apply reaches ``step``."""
    config = publishing_config(paths)
    argv = [sys.executable, "-c", DIE_MID_APPLY, step, config.model_dump_json()]
    died = await trio.to_thread.run_sync(
        partial(subprocess.run, argv, capture_output=True, timeout=120)
    )
    assert died.returncode == 9, died.stderr.decode()
    (run_dir,) = (paths["store"] / "runs").iterdir()
    assert json.loads((run_dir / "apply.json").read_text())["state"] == step
    return config, run_dir.name


async def test_resume_undoes_an_apply_killed_after_its_first_path_was_swapped(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    before = _answers(paths["target"])
    config, run_id = await _die_mid_apply(paths, "swapping")
    assert _answers(paths["target"]) != before  # the crash left it half published
    at_start: list[dict[str, str]] = []
    with trio.fail_after(60):
        outcome = await run_campaign(
            RunRequest(config, resume_run=run_id),
            on_bus=lambda _bus: at_start.append(_answers(paths["target"])),
        )
    assert at_start == [before]  # whole again before the resumed run did anything
    report = outcome.report
    assert report is not None and report.status == "finished" and report.resumed == 1
    assert "an interrupted apply was undone" in report.message and run_id in report.message
    stored = json.loads((paths["store"] / "runs" / run_id / "report.json").read_text())
    assert stored["message"] == report.message
    assert report.apply is not None and report.apply.status == "applied"
    assert all(v == '"yes"' for k, v in _answers(paths["target"]).items() if k.startswith("val"))
    events = (paths["store"] / "runs" / run_id / "events.jsonl").read_text()
    assert "swapping" in events  # the recovery is told as a warning


async def test_a_new_campaign_never_takes_an_unchecked_swapped_candidate_as_its_seed(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    before = _answers(paths["target"])
    _, crashed = await _die_mid_apply(paths, "swapped")
    assert _answers(paths["target"]) != before  # the candidate is in, never checked
    seed = load_run(StoreLayout(paths["store"]), crashed).seed_ref
    at_start: list[dict[str, str]] = []
    with trio.fail_after(60):
        outcome = await run_campaign(
            RunRequest(toy_config(paths, iterations=1, population=1)),
            on_bus=lambda _bus: at_start.append(_answers(paths["target"])),
        )
    assert at_start == [before]
    assert outcome.report is not None and outcome.report.seed == seed
    assert outcome.report.campaign_id != load_run(StoreLayout(paths["store"]), crashed).campaign_id
    journal = json.loads((paths["store"] / "runs" / crashed / "apply.json").read_text())
    assert journal["state"] == "recovered"


# -- a journal written before its records were typed resumes as it is ----------------------

# Lines as the untyped journal wrote them (dicts, key for key); BASE and CAND stand for the
# trees' digests, OUTPUT for a replay's output tree. m.0.0.c is older still: no "tree".
# m.2.0.b was replayed on another tree than this run plans.
TODAYS_JOURNAL = """\
{"type":"unit","measurement":"m","unit":"m.0.0.b","tree":"BASE","status":"succeeded","reused":false,"replay":{"kind":"replay.result","unit_id":"m.0.0.b","case_id":"c0","arm":"baseline","repetition":0,"status":"succeeded","failure":null,"output_ref":OUTPUT,"stdout_ref":null,"stderr_ref":null,"usage":{"tokens":null,"cost_usd":null,"wall_seconds":0.01},"usage_complete":false,"wall_seconds":0.01,"attempts":1,"blocked_by":null},"judge":{"kind":"judge.result","unit_id":"m.0.0.b","status":"succeeded","score":1.0,"source":"exact_match","failure":null,"detail_ref":null,"attempts":1,"wall_seconds":0.0}}
{"type":"unit","measurement":"m","unit":"m.0.0.c","status":"succeeded","reused":false,"replay":{"kind":"replay.result","unit_id":"m.0.0.c","case_id":"c0","arm":"candidate","repetition":0,"status":"succeeded","failure":null,"output_ref":OUTPUT,"stdout_ref":null,"stderr_ref":null,"usage":{"tokens":null,"cost_usd":null,"wall_seconds":0.01},"usage_complete":false,"wall_seconds":0.01,"attempts":1,"blocked_by":null},"judge":{"kind":"judge.result","unit_id":"m.0.0.c","status":"succeeded","score":1.0,"source":"exact_match","failure":null,"detail_ref":null,"attempts":1,"wall_seconds":0.0}}
{"type":"replay","measurement":"m","unit":"m.1.0.b","tree":"BASE","replay":{"kind":"replay.result","unit_id":"m.1.0.b","case_id":"c1","arm":"baseline","repetition":0,"status":"succeeded","failure":null,"output_ref":OUTPUT,"stdout_ref":null,"stderr_ref":null,"usage":{"tokens":null,"cost_usd":null,"wall_seconds":0.01},"usage_complete":false,"wall_seconds":0.01,"attempts":1,"blocked_by":null}}
{"type":"unit","measurement":"m","unit":"m.1.0.c","tree":"CAND","status":"cancelled","reused":false,"replay":{"kind":"replay.result","unit_id":"m.1.0.c","case_id":"c1","arm":"candidate","repetition":0,"status":"cancelled","failure":null,"output_ref":null,"stdout_ref":null,"stderr_ref":null,"usage":{"tokens":null,"cost_usd":null,"wall_seconds":0.01},"usage_complete":false,"wall_seconds":0.01,"attempts":1,"blocked_by":null},"judge":null}
{"type":"unit","measurement":"m","unit":"m.2.0.b","tree":"CAND","status":"succeeded","reused":false,"replay":{"kind":"replay.result","unit_id":"m.2.0.b","case_id":"c2","arm":"baseline","repetition":0,"status":"succeeded","failure":null,"output_ref":OUTPUT,"stdout_ref":null,"stderr_ref":null,"usage":{"tokens":null,"cost_usd":null,"wall_seconds":0.01},"usage_complete":false,"wall_seconds":0.01,"attempts":1,"blocked_by":null},"judge":{"kind":"judge.result","unit_id":"m.2.0.b","status":"succeeded","score":1.0,"source":"exact_match","failure":null,"detail_ref":null,"attempts":1,"wall_seconds":0.0}}
{"type":"proposal","slot":"c0.i0.s0","result":{"kind":"optimizer.result","slot_id":"c0.i0.s0","status":"failed","tree_ref":null,"gate":null,"failure":null,"stdout_ref":null,"stderr_ref":null,"summary":"","usage":{"tokens":null,"cost_usd":null,"wall_seconds":null},"wall_seconds":0.0}}
"""
UNIT_KEYS = ["type", "measurement", "unit", "tree", "status", "reused", "replay", "judge", "key"]
REPLAY_KEYS = ["type", "measurement", "unit", "tree", "replay"]


async def test_a_journal_in_the_untyped_format_resumes_without_paying_twice(
    tmp_path: Path,
) -> None:
    from evolane.campaign import read_resume_state
    from evolane.inputs import load_dataset
    from evolane.measure import (
        CommandSettings,
        MeasureContext,
        MeasureSettings,
        RunJournal,
        open_pipeline,
    )
    from evolane.messages import GateConfig, MeasureRequest
    from evolane.sandbox import open_sandbox
    from evolane.store import BlobStore, snapshot_tree
    from evolane.supervisors import open_runtime

    rows = [{"id": f"c{i}", "input": i, "expected_output": "yes", "split": "val"} for i in range(4)]
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    store = BlobStore(tmp_path / "store")
    trees = {}
    for name in ("base", "cand"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "agent.txt").write_text(name)
        trees[name] = snapshot_tree(store, tmp_path / name)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "output.json").write_text('"yes"\n')  # what the stored replays wrote
    output = snapshot_tree(store, tmp_path / "out").model_dump_json()
    journal = tmp_path / "journal.jsonl"
    lines = TODAYS_JOURNAL.replace("BASE", trees["base"].digest)
    written = lines.replace("CAND", trees["cand"].digest).replace("OUTPUT", output)
    journal.write_text(written)

    state = read_resume_state(journal)
    assert set(state.units) == {"m.0.0.b", "m.0.0.c", "m.1.0.c", "m.2.0.b"}
    assert set(state.replays) == {"m.1.0.b"} and set(state.proposals) == {"c0.i0.s0"}
    assert state.proposals["c0.i0.s0"].result.status == "failed"

    log = tmp_path / "replays.log"
    replay = f'sh -c \'echo "$EVOLANE_UNIT" >> {log}; echo \\"yes\\" > "$1"/output.json\''
    settings = MeasureSettings(replay=f"{replay} replay {{output_dir}}")
    context = MeasureContext(
        journal=RunJournal(journal), restored=state.units, restored_replays=state.replays
    )
    request = MeasureRequest(
        measurement_id="m",
        baseline_ref=trees["base"],
        candidate_ref=trees["cand"],
        baseline_repetitions=1,
        candidate_repetitions=1,
        gate=GateConfig(sequential=False, min_cases=2),
    )
    try:
        async with open_sandbox(tmp_path / "sb", store=store) as host, open_runtime() as rt:
            dataset = load_dataset(tmp_path / "d.jsonl")
            async with open_pipeline(
                rt,
                host,
                store,
                dataset,
                settings,
                commands=CommandSettings(kill_grace=0.2, expose_rw=(str(tmp_path),)),
                context=context,
            ) as pipeline:
                summary = await pipeline.measure(request)
    finally:
        assert context.journal is not None
        context.journal.close()
    records = read_journal(journal).records
    replayed = {replay_names(records)[name] for name in log.read_text().split()}
    assert replayed == {"m.1.0.c", "m.2.0.b", "m.2.0.c", "m.3.0.b", "m.3.0.c"}
    assert summary.units_restored == 3 and summary.units_run == 5
    assert summary.status == "complete" and summary.gate.n == 4
    assert journal.read_text().startswith(written)  # the old lines stay as they were
    for record in records[6:]:  # what this run added: the same keys, in the same order
        assert list(record) == (UNIT_KEYS if record["type"] == "unit" else REPLAY_KEYS)
    assert {r["unit"] for r in records[6:] if r["type"] == "unit"} == replayed | {"m.1.0.b"}
    assert set(read_resume_state(journal).units) >= replayed


def test_a_journal_record_of_a_newer_evolane_is_one_clear_error(tmp_path: Path) -> None:
    from evolane.campaign import read_resume_state
    from evolane.inputs import InputError

    journal = tmp_path / "journal.jsonl"
    first = TODAYS_JOURNAL.splitlines()[5]  # the proposal: no digests to fill in
    journal.write_text(first + "\n" + '{"type": "checkpoint", "at": 3}\n')
    with pytest.raises(InputError) as caught:
        read_resume_state(journal)
    message = str(caught.value)
    assert message.startswith(f"{journal}:2: ") and "newer or older evolane" in message


# -- the books of a resume whose measurements end before they judge every stored replay ------

DIE_AS_THE_REPORT_IS_WRITTEN = """
import os, sys
from evolane.campaign import _finish
from evolane.cli import main

def die(*args, **kwargs):
    os._exit(9)  # every unit is journaled, none in flight: as a SIGKILL at the report

_finish._write_report = die
sys.argv = ["evolane", "optimize", *sys.argv[1:]]
main()
"""

JUDGE = """
import json, sys, time
case, answer = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
slow = sys.argv[4] == "*" or case.get("id") in sys.argv[4].split(",")
time.sleep(float(sys.argv[3]) if slow else 0.0)
print(json.dumps({"score": 1.0 if answer == "yes" else 0.0}))
"""


def _killed_at_the_report_then_resumed(
    tmp_path: Path, judges: int, slow: str
) -> tuple[list[dict], int, dict]:
    """The toy, one harmful candidate (an early stop), killed as the report is written (every
    unit ended), then resumed to its end: the killed session's journal, the replay commands
    that wrote their usage over both sessions and the resumed run's report. ``slow``: how
    long the judge takes and for which cases (``*``: every case)."""
    paths = write_toy(tmp_path, {"0.0": "harm:1"})
    store, log = tmp_path / "store", tmp_path / "logs" / "replays.log"
    log.parent.mkdir()
    flags = toy_flags(paths, store, log, lanes=3)
    flags = with_flag(flags, "--replay", usage_replay_logged(tmp_path, log))
    script = tmp_path / "judge.py"
    script.write_text(JUDGE)
    judging = f"{sys.executable} -I {script} {{case_file}} {{output_dir}}/output.json"
    judging += f" {slow}"
    flags += ["--judge", judging, "--judge-concurrency", str(judges)]
    flags += ["--iterations", "1", "--population", "1"]
    died = subprocess.run(
        [sys.executable, "-c", DIE_AS_THE_REPORT_IS_WRITTEN, *flags],
        capture_output=True,
        timeout=300,
    )
    assert died.returncode == 9, died.stderr.decode()
    records = _journal_records(store)
    launched = log.read_text().split()
    assert set(launched) == {r["replay"]["name"] for r in records if r.get("replay")}, records
    (run_dir,) = (store / "runs").iterdir()
    resumed = _optimize(["--resume", run_dir.name, "--store", str(store), "--progress", "none"])
    _finish(resumed)
    assert log.read_text().split() == launched  # every unit had ended: none is run again
    # Each time a command wrote its usage: a replay tried again in its session (the host
    # refused a fork) is charged each time it ran (found in two test workers: one more
    # launch than replays journaled; the names launched are the journal's, as checked).
    charged = len(Path(f"{log}.usage").read_text().split())
    return records, charged, _report(store)


def test_a_resume_charges_the_replays_an_early_stop_left_unjudged(tmp_path: Path) -> None:
    """Found by crash fuzzing (SIGKILL as the report was written, then ``--resume``): the
    replays an early stop cut off before their judgement (journaled on their own) were
    charged in the killed session, but the resume, which settles the same early stop from
    the journal and never judges them, charged none of them: 14,000 tokens for the 14,400
    the uninterrupted run spent. Each replay is charged once, as the run resumes."""
    records, charged, report = _killed_at_the_report_then_resumed(tmp_path, 2, "0.2 *")
    judged = {r["unit"] for r in records if r["type"] == "unit" and r["status"] == "succeeded"}
    unjudged = {r["unit"] for r in records if r["type"] == "replay"} - judged
    assert unjudged  # the early stop cut replays off before their judgement
    assert report["budget"]["spent"]["tokens"] == charged * 100
    assert report["budget"]["campaign_spent"]["tokens"] == charged * 100


def test_a_resume_charges_the_units_its_early_stop_never_reads_again(tmp_path: Path) -> None:
    """Found by crash fuzzing (SIGKILL during a later measurement, then ``--resume``): the
    killed session judged every unit of a measurement (all in flight at once) before the
    early stop; the resume reads the journal in order, stops as soon as the decision is
    settled and never reads the rest, which were charged only as they were read: 14,200
    tokens for 14,400. Every journaled unit is now charged once, as the run resumes."""
    solid = "val00,val01,val02,val03"  # the harmed case is one: judged last, every other first
    records, charged, report = _killed_at_the_report_then_resumed(tmp_path, 12, f"2 {solid}")
    (measured,) = [m for m in report["measurements"] if m["measurement_id"] == "c0.i0.s0"]
    journaled = [r for r in records if r["type"] == "unit" and r["measurement"] == "c0.i0.s0"]
    assert len([r for r in journaled if r["status"] == "succeeded"]) > measured["units_restored"]
    assert report["budget"]["spent"]["tokens"] == charged * 100
    assert report["budget"]["campaign_spent"]["tokens"] == charged * 100


def usage_replay_logged(root: Path, log: Path) -> str:
    """The toy replay, writing ``usage.json`` (100 tokens), a line per launch to ``log`` and
    one per usage written to ``log``.usage."""
    script = root / "replay.sh"
    script.write_text(
        f'echo "$EVOLANE_UNIT" >> {log}\n'
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
        'echo \'{"tokens": 100, "cost_usd": 0.01}\' > "$2/usage.json"\n'
        f'echo "$EVOLANE_UNIT" >> {log}.usage\n'
    )
    return f"sh {script} {{candidate}} {{output_dir}}"
