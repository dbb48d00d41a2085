"""Honest splits: the optimizer is shown train only (the dataset's, or one carved from val by
the run's seed), val decides, test confirms; ``--feedback-split val`` and a dataset too small
to carve feed back val and say val is optimistic. Through the real CLI where it is concerned."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.campaign import Report, RunRecord
from evolane.campaign._estimate import estimate_run
from evolane.campaign._run import RunRequest, run_campaign
from evolane.campaign._splits import (
    MIN_TRAIN_CASES,
    SplitPlan,
    carve,
    plan_splits,
    repeated_input,
)
from evolane.inputs import InputError
from evolane.messages import GateConfig
from evolane.store import read_journal
from tests.audit_oracle import blob
from tests.campaign_helpers import toy_config, toy_flags, write_toy
from tests.test_campaign_config import OLD_RUN_JSON

EVOLANE = [sys.executable, "-m", "evolane"]
VAL = tuple(f"val{i:02d}" for i in range(30))
TEST = tuple(f"test{i:02d}" for i in range(6))
_PROMPT_LISTS = ("solid", "infra_errored", "flaky", "always_failing")


def _in_file(val: int = 30, train: int = 0) -> dict[str, tuple[str, ...]]:
    return {"train": tuple(f"train{i:02d}" for i in range(train)), "val": VAL[:val], "test": TEST}


def _config(tmp_path: Path, **overrides: Any) -> Any:
    paths = write_toy(tmp_path, {})
    return toy_config(paths, feedback_split=overrides.pop("feedback_split", "train"), **overrides)


# -- the carve ---------------------------------------------------------------------------------


def test_the_carve_is_seeded_disjoint_covering_and_leaves_test_alone(tmp_path: Path) -> None:
    config, in_file = _config(tmp_path), _in_file()
    plan = plan_splits(config, in_file, seed=7)
    assert plan.carved and plan.feedback == "train" and plan.carve_seed == 7
    assert plan == plan_splits(config, in_file, seed=7)  # deterministic for a seed
    assert plan.carved_ids != plan_splits(config, in_file, seed=8).carved_ids
    splits = plan.splits(in_file)
    train, val = set(splits["train"]), set(splits["val"])
    assert len(train) == len(VAL) // 3 == plan.train_cases and len(val) == plan.val_cases == 20
    assert not train & val and train | val == set(VAL)  # disjoint and covering
    assert splits["test"] == TEST and plan.test_cases == len(TEST)  # test untouched
    assert list(splits["train"]) == [c for c in VAL if c in train]  # in file order
    reordered = carve(tuple(reversed(VAL)), 7)  # the ids and the seed alone decide
    assert set(reordered) == train


def test_the_carve_moves_whole_clusters(tmp_path: Path) -> None:
    """A session split across train and val would show the optimizer turns of a
    conversation the gate decides on (found: 11 of 12 sessions of 4 turns were split)."""
    val = tuple(f"val{i:02d}" for i in range(48))
    in_file = {"val": val, "test": TEST}
    clusters = {case: f"session:{index // 4}" for index, case in enumerate(val)}
    config = _config(tmp_path, gate=GateConfig(min_cases=4))  # paired: it counts clusters
    plan = plan_splits(config, in_file, seed=7, clusters=clusters)
    assert plan.carved and plan.train_cases == 16  # 4 whole sessions: a third of the cases
    splits = plan.splits(in_file)
    train = {clusters[case] for case in splits["train"]}
    assert not train & {clusters[case] for case in splits["val"]}
    assert plan == plan_splits(config, in_file, seed=7, clusters=clusters)  # seeded
    assert carve(val, 7, {}) == carve(val, 7)  # no cluster: the carve as before
    # Too few clusters left for the gate: no carve (val feeds the optimizer, said so).
    forty = {"val": val[:40], "test": TEST}  # 10 sessions: 6 left after a carve, min_cases 8
    few = plan_splits(_config(tmp_path / "b", gate=GateConfig()), forty, seed=7, clusters=clusters)
    assert not few.carved and "with 6 val clusters" in few.note, few.note
    assert "8 comparable clusters" in few.note


def test_a_dataset_with_train_is_not_carved(tmp_path: Path) -> None:
    in_file = _in_file(train=5)
    plan = plan_splits(_config(tmp_path), in_file, seed=0)
    assert (plan.feedback, plan.carved, plan.train_cases, plan.val_cases) == ("train", False, 5, 30)
    assert plan.splits(in_file) == in_file and not plan.note


def test_too_few_cases_to_carve_fall_back_to_val_feedback_with_a_warning(tmp_path: Path) -> None:
    few = plan_splits(_config(tmp_path), _in_file(val=3 * MIN_TRAIN_CASES - 1), seed=0)
    assert few.feedback == "val" and not few.carved and few.requested == "train"
    assert f"fewer than {MIN_TRAIN_CASES}" in few.note and "optimistic" in few.note
    gate = GateConfig(gate="strict", min_cases=10)  # 12 cases: 4 to train would leave 8 < 10
    small = plan_splits(_config(tmp_path / "b", gate=gate), _in_file(val=12), seed=0)
    assert small.feedback == "val" and "8 val cases left" in small.note
    assert small.splits(_in_file(val=12))["val"] == VAL[:12]


def test_feedback_split_val_is_never_carved_and_says_val_is_optimistic(tmp_path: Path) -> None:
    plan = plan_splits(_config(tmp_path, feedback_split="val"), _in_file(), seed=0)
    assert (plan.requested, plan.feedback, plan.carved, plan.val_cases) == ("val", "val", False, 30)
    assert "optimistic" in plan.note and plan.optimistic


# -- repeated inputs ---------------------------------------------------------------------------


def _rows(*cases: tuple[str, object]) -> list[tuple[str, bytes]]:
    return [
        (case_id, json.dumps({"id": case_id, "input": value}).encode()) for case_id, value in cases
    ]


def test_a_repeated_input_outside_train_is_warned_of_naming_both_cases() -> None:
    split_of = {"t1": "train", "t2": "train", "v1": "val", "v2": "val", "x1": "test"}
    assert repeated_input(_rows(("t1", {"q": 1}), ("t2", {"q": 1})), split_of) == ""
    distinct = _rows(("t1", {"q": 1}), ("v1", {"q": 2}), ("x1", {"q": [1]}))
    assert repeated_input(distinct, split_of) == ""
    across = repeated_input(_rows(("t1", {"a": 1, "b": 2}), ("v1", {"b": 2, "a": 1})), split_of)
    assert across.startswith("val case 'v1' has the same input as train case 't1':")
    assert "the optimizer sees cases the gate judges" in across
    within = repeated_input(_rows(("v1", "hi"), ("x1", "other"), ("v2", "hi")), split_of)
    assert within.startswith("val cases 'v1' and 'v2' have the same input:")
    many = repeated_input(_rows(("t1", 0), ("t2", 0), ("v1", 0), ("x1", 0)), split_of)
    assert "(2 such cases)" in many  # v1 and x1 repeat train's t1; t2 is train's own


def test_a_carve_that_splits_a_repeated_input_is_warned_of(tmp_path: Path) -> None:
    """Found by review: a carve moves val cases to train by id, so two val cases with one
    input can land in train and val; the plan's note says so (val and train)."""
    in_file, config = _in_file(), _config(tmp_path)
    carved = plan_splits(config, in_file, seed=7).carved_ids[0]
    kept = next(case_id for case_id in VAL if case_id not in carved)
    rows = [(c, json.dumps({"input": "one" if c in (carved, kept) else c}).encode()) for c in VAL]
    plan = plan_splits(config, in_file, seed=7, rows=rows)
    first, later = sorted((carved, kept), key=VAL.index)
    splits = {carved: "train", kept: "val"}
    assert plan.carved and plan.repeats.startswith(
        f"{splits[later]} case '{later}' has the same input as {splits[first]} case '{first}'"
    )
    plain = [(case_id, json.dumps({"input": case_id}).encode()) for case_id in VAL]
    assert not plan_splits(config, in_file, seed=7, rows=plain).repeats


def test_old_records_without_the_key_ran_and_resume_with_val_feedback() -> None:
    record = RunRecord.model_validate(OLD_RUN_JSON)
    assert record.config.feedback_split == "val" and record.splits is None
    old_report = {
        "run_id": "r-1", "campaign_id": "c-1", "cycle": 0, "status": "finished",
        "campaign_status": "complete", "started": 0.0, "finished": 1.0, "wall_seconds": 1.0,
        "config": OLD_RUN_JSON["config"], "seed": OLD_RUN_JSON["seed_ref"],
        "best": OLD_RUN_JSON["seed_ref"],
        "budget": {"ceilings": {}, "spent": {}, "campaign_spent": {}},
    }  # fmt: skip
    assert Report.model_validate(old_report).config.feedback_split == "val"


def test_the_estimate_counts_the_parents_train_measurement(tmp_path: Path) -> None:
    config = _config(tmp_path)
    without = estimate_run(config, val_cases=20, test_cases=6)
    with_train = estimate_run(config, val_cases=20, test_cases=6, train_cases=10)
    b = with_train.baseline_repetitions
    assert with_train.replays_max - without.replays_max == config.iterations * 10 * b
    assert with_train.train_cases == 10


# -- through the CLI ---------------------------------------------------------------------------


def _run(args: list[str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=timeout)


def _optimize(args: list[str]) -> subprocess.CompletedProcess[str]:
    return _run(["optimize", *args])


def _flags(paths: dict[str, Path], feedback: str | None, *extra: str) -> list[str]:
    """The toy's flags with ``--feedback-split feedback`` (none: the default)."""
    flags = toy_flags(paths, paths["store"])
    flags = flags[:-2] if feedback is None else [*flags[:-1], feedback]
    return [*flags, *extra]


def _run_dir(store: Path) -> Path:
    (run_dir,) = (store / "runs").iterdir()
    return run_dir


def _shown(record: Path) -> list[dict[str, Any]]:
    """What the optimizer was given, one entry per proposal (the toy's ``_record`` lines)."""
    return [json.loads(line) for line in record.read_text().splitlines()]


def _ids_shown(entry: dict[str, Any]) -> set[str]:
    prompt = json.loads(entry["prompt"])
    ids = {item["id"] for item in prompt.get("failing", [])}
    for name in _PROMPT_LISTS:
        ids |= set(prompt.get(name, []))
    return ids | set(entry["context"])


def _never_mentioned(entries: list[dict[str, Any]], hidden: set[str]) -> None:
    """No id of ``hidden`` appears anywhere in the prompts or the context files."""
    pattern = re.compile("|".join(rf"\b{re.escape(case)}\b" for case in sorted(hidden)))
    for entry in entries:
        assert not pattern.search(entry["prompt"]), entry["key"]
        assert not pattern.search(entry["context_text"]), entry["key"]
        assert not set(entry["context"]) & hidden


PLAN = {"0.0": "cure", "0.1": "harm:1", "default": "noop"}


@pytest.fixture(scope="module")
def train_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Any]:
    """One campaign on the toy with 6 train cases (read-only for the tests that share it):
    val03 repeats train02's input; the optimizer records what it was shown. Its folder,
    the record and the finished `evolane optimize --progress plain`."""
    root = tmp_path_factory.mktemp("train-run")
    record = root / "shown.jsonl"
    paths = write_toy(root, {**PLAN, "_record": str(record)}, train=6)
    rows = [json.loads(line) for line in paths["dataset"].read_text().splitlines()]
    val03 = next(row for row in rows if row["id"] == "val03")
    val03["input"] = next(row["input"] for row in rows if row["id"] == "train02")
    paths["dataset"].write_text("".join(json.dumps(row) + "\n" for row in rows))
    done = _optimize([*_flags(paths, None), "--progress", "plain"])
    assert done.returncode == 0, done.stderr
    return root, record, done


def test_the_optimizer_sees_only_the_datasets_train_cases(
    train_run: tuple[Path, Path, Any],
) -> None:
    root, record, _ = train_run
    entries = _shown(record)
    assert entries and all(_ids_shown(e) <= {f"train{i:02d}" for i in range(6)} for e in entries)
    assert any("train00" in e["context"] for e in entries)  # the failing train case is shown
    hidden = {f"val{i:02d}" for i in range(12)} | {f"test{i:02d}" for i in range(6)}
    _never_mentioned(entries, hidden)
    report = json.loads((_run_dir(root / "store") / "report.json").read_text())
    splits = report["splits"]
    assert (splits["feedback"], splits["carved"], splits["train_cases"]) == ("train", False, 6)
    assert not splits["note"]
    train = [m for m in report["measurements"] if m["split"] == "train"]
    assert train and all(m["purpose"] == "baseline" for m in train)
    assert report["selected"] is not None  # val decided for the fix the train failure prompted


def test_a_val_case_repeating_a_train_input_is_warned_of_at_the_start_and_in_the_report(
    train_run: tuple[Path, Path, Any],
) -> None:
    root, _, done = train_run
    said = "val case 'val03' has the same input as train case 'train02'"
    assert "preflight: val case 'val03' has the same input as train case" in done.stdout
    run_dir = _run_dir(root / "store")
    assert said in json.loads((run_dir / "report.json").read_text())["splits"]["repeats"]
    assert said in (run_dir / "report.md").read_text()


def test_fast_verified_screens_on_a_train_case_recorded_as_train(tmp_path: Path) -> None:
    """Its screening case is the parent's hardest failing case of the feedback split: a
    train case, never one the gate judges on val (found by audit: the report recorded the
    screening measurement under split val, though its case was train)."""
    paths = write_toy(tmp_path, PLAN, train=6)
    done = _optimize([*_flags(paths, None), "--fast-verified"])
    assert done.returncode == 0, done.stderr
    report = json.loads((_run_dir(paths["store"]) / "report.json").read_text())
    screens = [m for m in report["measurements"] if m["purpose"] == "screening"]
    assert screens and {m["split"] for m in screens} == {"train"}
    for m in screens:
        units = json.loads(blob(paths["store"], m["units_ref"]["digest"]))
        assert {u["case"] for u in units} == {"train00"}


def test_a_carved_train_feeds_the_optimizer_and_is_announced(tmp_path: Path) -> None:
    record = tmp_path / "shown.jsonl"
    paths = write_toy(tmp_path, {**PLAN, "_record": str(record)})
    done = _optimize([*_flags(paths, None), "--progress", "plain", "--seed", "3"])
    assert done.returncode == 0, done.stderr
    run_dir = _run_dir(paths["store"])
    plan = SplitPlan.model_validate(json.loads((run_dir / "run.json").read_text())["splits"])
    assert plan.carved and plan.carve_seed == 3 and plan.carve_share == "one third"
    assert (plan.train_cases, plan.val_cases, plan.test_cases) == (4, 8, 6)
    carved = set(plan.carved_ids)
    entries = _shown(record)
    assert entries and all(_ids_shown(e) <= carved for e in entries)
    _never_mentioned(entries, {f"val{i:02d}" for i in range(12)} - carved)
    _never_mentioned(entries, {f"test{i:02d}" for i in range(6)})
    output = re.sub(
        r"\n\[ *\d+\.\ds\]     ", " ", done.stdout + done.stderr
    )  # plain lines fit 80 columns
    assert "splits: train feeds the optimizer; train 4 (carved from val: one third, seed 3)" in (
        output
    )
    report = json.loads((run_dir / "report.json").read_text())
    assert report["splits"] == plan.model_dump(mode="json")
    val = [m for m in report["measurements"] if m["split"] == "val"]
    assert val and all(m["n_planned"] <= 8 for m in val)  # the carved cases never decide
    markdown = (run_dir / "report.md").read_text()
    assert "- splits: train feeds the optimizer; train 4 (carved from val" in markdown


def test_feedback_split_val_shows_val_and_the_report_warns(tmp_path: Path) -> None:
    record = tmp_path / "shown.jsonl"
    paths = write_toy(tmp_path, {**PLAN, "_record": str(record)})
    done = _optimize([*_flags(paths, "val"), "--progress", "plain"])
    assert done.returncode == 0, done.stderr
    entries = _shown(record)
    shown = set().union(*(_ids_shown(e) for e in entries))
    assert shown and shown <= {f"val{i:02d}" for i in range(12)}
    assert "warning: --feedback-split val: the optimizer saw the val cases" in done.stdout
    assert "(optimistic: val fed the optimizer)" in done.stdout  # the final summary
    run_dir = _run_dir(paths["store"])
    report = json.loads((run_dir / "report.json").read_text())
    assert report["splits"]["feedback"] == "val" and "optimistic" in report["splits"]["note"]
    assert "**warning**: --feedback-split val" in (run_dir / "report.md").read_text()
    assert not [m for m in report["measurements"] if m["split"] == "train"]


def test_a_dataset_too_small_to_carve_warns_and_the_estimate_counts_train(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, PLAN, val=9)
    small = _run(["estimate", *_flags(paths, None)])
    assert small.returncode == 0, small.stderr
    assert "splits: val feeds the optimizer; train 0, val 9 decides" in small.stdout
    assert "preflight: no train split, and carving one from 9 val cases" in small.stdout
    big = write_toy(tmp_path / "big", PLAN, val=30)
    estimates = {
        feedback: json.loads(_run(["estimate", *_flags(big, feedback), "--json"]).stdout)
        for feedback in ("train", "val")
    }
    train, val = estimates["train"], estimates["val"]
    assert (train["train_cases"], train["val_cases"], val["val_cases"]) == (10, 20, 30)
    assert "carved from val" in train["splits"]


def test_a_bad_feedback_split_is_one_line_naming_the_flag(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    done = _optimize(_flags(paths, "foo"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--feedback-split foo: choose from train, val" in lines[0]
    assert not (paths["store"] / "runs").exists()


def _journal_records(store: Path) -> list[dict[str, Any]]:
    journals = list((store / "runs").glob("*/journal.jsonl"))
    return read_journal(journals[0]).records if journals else []


@pytest.mark.parametrize("kill_after", [3])
def test_a_resumed_run_keeps_its_carve_and_its_decisions(tmp_path: Path, kill_after: int) -> None:
    reference = write_toy(tmp_path / "ref", PLAN)
    assert _optimize(_flags(reference, None, "--seed", "5")).returncode == 0
    expected = json.loads((_run_dir(reference["store"]) / "report.json").read_text())
    record = tmp_path / "shown.jsonl"
    paths = write_toy(tmp_path / "run", {**PLAN, "_record": str(record)})
    args = [*EVOLANE, "optimize", *_flags(paths, None, "--seed", "5")]
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while len(_journal_records(paths["store"])) < kill_after:
        assert process.poll() is None, "the run ended before the kill point"
        assert time.monotonic() < deadline
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    run_dir = _run_dir(paths["store"])
    carved = json.loads((run_dir / "run.json").read_text())["splits"]
    assert carved["carved"] and carved == expected["splits"]  # the seed alone decides it
    resumed = _run(["optimize", "--resume", run_dir.name, "--store", str(paths["store"])])
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["resumed"] == 1 and report["splits"] == carved
    assert json.loads((run_dir / "run.json").read_text())["splits"] == carved
    assert [
        (d["iteration"], d["slot"], d["digest"], d["decision"]) for d in report["decisions"]
    ] == [(d["iteration"], d["slot"], d["digest"], d["decision"]) for d in expected["decisions"]]
    assert all(_ids_shown(e) <= set(carved["carved_ids"]) for e in _shown(record))


@pytest.mark.parametrize("feedback", [None, "val"])
def test_the_optimizer_is_told_a_rejections_val_numbers_only_when_val_feeds_it(
    tmp_path: Path, feedback: str | None
) -> None:
    """Found by review: a rejected edit's reason ("the mean +0.007 could not exceed 0.0094")
    reached the optimizer's prompt, a channel for fitting the held-out val cases."""
    record = tmp_path / "shown.jsonl"
    plan = {"0.0": "harm:1", "default": "noop", "_record": str(record)}
    paths = write_toy(tmp_path, plan, train=6)
    done = _optimize(_flags(paths, feedback, "--population", "1"))
    assert done.returncode == 0, done.stderr
    told = [r["reason"] for e in _shown(record) for r in json.loads(e["prompt"])["rejected"]]
    assert told, "the harmful edit was rejected and shown to the next proposal"
    withheld = all("withheld" in reason for reason in told)
    assert withheld == (feedback is None), told


def test_under_val_feedback_the_gate_leaves_out_the_val_case_screening_chose_on(
    tmp_path: Path,
) -> None:
    """When val feeds the optimizer, screening's case is a val case, chosen for a gain: the
    gate's measurements leave it out (found by audit: its screening pair, reused in the gate,
    gave every screened-in candidate one pair selected for candidate > parent)."""
    paths = write_toy(tmp_path, PLAN)
    done = _optimize([*_flags(paths, "val"), "--fast-verified"])
    assert done.returncode == 0, done.stderr
    report = json.loads((_run_dir(paths["store"]) / "report.json").read_text())
    screened = {
        u["case"]
        for m in report["measurements"]
        if m["purpose"] == "screening"
        for u in json.loads(blob(paths["store"], m["units_ref"]["digest"]))
    }
    assert len(screened) == 1 and screened <= {f"val{i:02d}" for i in range(30)}
    paired = [m for m in report["measurements"] if m["purpose"] == "paired"]
    assert paired
    for m in paired:
        cases = {u["case"] for u in json.loads(blob(paths["store"], m["units_ref"]["digest"]))}
        assert cases and not cases & screened, (m["measurement_id"], screened)


def test_a_campaign_cannot_change_its_feedback_split_between_cycles(tmp_path: Path) -> None:
    # Found by review: a cycle run with --feedback-split val, its best fitted to the val
    # outcomes it was shown (and its rejected edits remembered with the gate's val numbers),
    # was continued by --resume-campaign with train feedback: that cycle carved train out of
    # the very val cases, called val honest, and online control claimed its guarantee.
    paths = write_toy(tmp_path, PLAN, test=0)
    flags = [*_flags(paths, "val", "--iterations", "1"), "--max-improvement-cycles", "3"]
    first = _optimize(flags)
    assert first.returncode == 0, first.stderr
    campaign = first.stdout.split()[2].rstrip(":")
    refused = _optimize([*_flags(paths, None, "--iterations", "1"), "--resume-campaign", campaign])
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "the feedback_split changed ('val' -> 'train')" in refused.stderr, refused.stderr
    same = _optimize([*flags, "--resume-campaign", campaign])
    assert same.returncode == 0, same.stderr


async def test_a_campaign_cannot_carve_from_val_its_earlier_cycle_fed_the_optimizer(
    tmp_path: Path,
) -> None:
    # Found by review: the same --feedback-split train fed val in a cycle whose gate left
    # too few val cases to carve (min_cases 9 of 8 left), and a next cycle whose gate could
    # carved its train out of the very val cases the optimizer had been shown.
    paths = write_toy(tmp_path, PLAN, test=0)
    wary = GateConfig(gate="strict", min_cases=9)
    config = toy_config(
        paths, feedback_split="train", gate=wary, iterations=1, max_improvement_cycles=3
    )
    with trio.fail_after(60):
        first = await run_campaign(RunRequest(config))
    assert first.report is not None and first.report.splits is not None
    assert first.report.splits.feedback == "val" and not first.report.splits.carved
    campaign = first.report.campaign_id
    carving = config.model_copy(update={"gate": GateConfig(gate="strict", min_cases=4)})
    with pytest.raises(InputError, match=r"the splits changed \(val feeds the optimizer"):
        await run_campaign(RunRequest(carving, resume_campaign=campaign))
    with trio.fail_after(60):
        same = await run_campaign(RunRequest(config, resume_campaign=campaign))
    assert same.report is not None and same.report.cycle == 1
