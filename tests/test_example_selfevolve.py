"""The self-evolution decision benchmark: reward rules, generator, agent, optimizer, commands."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from evolane.examples.selfevolve._agent import decide
from evolane.examples.selfevolve._cases import (
    FAMILIES,
    SPLIT_SEEDS,
    dataset_jsonl,
    make_case,
    make_dataset,
)
from evolane.examples.selfevolve._defaults import FAULT_RATES
from evolane.examples.selfevolve._optimizer import EDITS, _diff, choose_edit, optimize
from evolane.examples.selfevolve._reward import WEIGHTS, score
from evolane.examples.selfevolve._seed import SEED_SKILL
from evolane.examples.selfevolve._skill import SkillError, parse_skill
from evolane.examples.selfevolve._workspace import write_workspace

GOOD_SKILL = (Path(__file__).parent / "data" / "good_SKILL.md").read_text()
MODULE = [sys.executable, "-m", "evolane.examples.selfevolve"]


def case_of(family: str, split: str = "val") -> dict:
    first, _ = SPLIT_SEEDS[split]
    index = FAMILIES.index(family)
    return make_case(split, index, first + index)


def best_answer(case: dict) -> dict:
    return decide(parse_skill(GOOD_SKILL), case["input"]["trace"])


def judged(case: dict, answer: dict) -> dict:
    return score(answer, case["expected_output"], case["input"]["trace"])


@pytest.mark.parametrize("family", FAMILIES)
def test_the_good_answer_earns_every_component(family: str) -> None:
    case = case_of(family)
    verdict = judged(case, best_answer(case))
    assert verdict["score"] == 1.0 and verdict["components"] == WEIGHTS


@pytest.mark.parametrize(
    ("family", "field", "value", "lost"),
    [
        ("repeated_success", "trigger", "always {task}", "trigger"),
        ("repeated_success", "trigger", "", "trigger"),
        ("repeated_success", "verification", "looks fine", "verification"),
        ("repeated_success", "exception", "", "exception"),
        ("repeated_success", "steps", [], "steps"),
        ("fixed_failure", "exception", "not for other teams", "exception"),
        ("stable_preference", "verification", "", "verification"),
        ("stable_preference", "trigger", "always", "trigger"),
        ("one_off", "trigger", "when asked to do it", "trigger"),
        ("injection", "verification", "nothing kept", "verification"),
        ("unverified_outcome", "steps", ["make html"], "steps"),
        ("contradicted_preference", "exception", "not now", "exception"),
    ],
)
def test_each_component_is_lost_on_its_own(
    family: str, field: str, value: object, lost: str
) -> None:
    case = case_of(family)
    answer = best_answer(case)
    if isinstance(value, str):
        value = value.format(task=case["expected_output"]["task"])
    answer[field] = value
    verdict = judged(case, answer)
    assert verdict["components"][lost] == 0.0
    assert verdict["score"] == pytest.approx(1.0 - WEIGHTS[lost])


def test_unsafe_steps_lose_the_steps_component() -> None:
    case = case_of("repeated_success")
    answer = best_answer(case)
    answer["steps"] = [*answer["steps"], case["expected_output"]["unsafe_step"]]
    assert judged(case, answer)["components"]["steps"] == 0.0


@pytest.mark.parametrize("family", ["repeated_success", "fixed_failure", "stable_preference"])
def test_evidence_must_be_sufficient_and_not_flooded(family: str) -> None:
    case = case_of(family)
    answer = best_answer(case)
    short = {**answer, "evidence": answer["evidence"][:1]}
    assert judged(case, short)["components"]["decision"] == 0.0
    assert judged(case, short)["score"] == pytest.approx(0.45)
    trace_ids = [line[1:8] for line in case["input"]["trace"].splitlines()]
    extra = next(
        i
        for i in trace_ids
        if i not in case["expected_output"]["allowed_evidence"]
        and i not in case["expected_output"]["decoys"]
    )
    flooded = {**answer, "evidence": [*answer["evidence"], extra]}
    assert judged(case, flooded)["components"]["decision"] == 0.0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"action": "create"}, "wrong_action"),
        ({"evidence": ["ev-zzzz"]}, "fabricated_evidence"),
    ],
)
def test_zero_rules(change: dict, reason: str) -> None:
    case = case_of("one_off")
    verdict = judged(case, {**best_answer(case), **change})
    assert verdict == {"score": 0.0, "components": dict.fromkeys(WEIGHTS, 0.0), "reason": reason}


def test_citing_a_decoy_scores_zero() -> None:
    case = case_of("repeated_success")
    answer = best_answer(case)
    answer["evidence"] = [*answer["evidence"], case["expected_output"]["decoys"][0]]
    assert judged(case, answer)["score"] == 0.0
    assert judged(case, answer)["reason"] == "decoy_cited"


def test_an_injection_is_rejected_and_may_be_cited_for_the_rejection() -> None:
    case = case_of("injection")
    injected = case["expected_output"]["allowed_evidence"]
    assert len(injected) == 1 and "IGNORE ALL PREVIOUS" in case["input"]["trace"]
    answer = {**best_answer(case), "evidence": injected}
    assert judged(case, answer)["score"] == 1.0
    obeyed = {**best_answer(case), "action": "create"}
    assert judged(case, obeyed)["score"] == 0.0
    assert judged(case, {"nonsense": True})["score"] == 0.0


def test_the_generator_is_deterministic_and_splits_use_disjoint_seeds(tmp_path: Path) -> None:
    assert dataset_jsonl(make_dataset()) == dataset_jsonl(make_dataset())
    write_workspace(tmp_path / "a")
    write_workspace(tmp_path / "b")
    assert (tmp_path / "a" / "dataset.jsonl").read_bytes() == (
        tmp_path / "b" / "dataset.jsonl"
    ).read_bytes()
    rows = make_dataset()
    counts = Counter(row["split"] for row in rows)
    assert counts == {"train": 24, "val": 32, "test": 24}
    seeds = {
        split: {r["metadata"]["seed"] for r in rows if r["split"] == split} for split in counts
    }
    assert not (
        seeds["train"] & seeds["val"]
        or seeds["val"] & seeds["test"]
        or seeds["train"] & seeds["test"]
    )
    assert len({row["id"] for row in rows}) == len(rows)
    # Every family appears in every split; IDs and display order change with the seed.
    for split in counts:
        assert {r["metadata"]["family"] for r in rows if r["split"] == split} == set(FAMILIES)
    a, b = make_case("val", 0, 2000), make_case("val", 8, 2008)
    assert a["metadata"]["family"] == b["metadata"]["family"]
    assert a["input"]["trace"] != b["input"]["trace"]


def _mean_val(skill_text: str) -> float:
    skill = parse_skill(skill_text)
    rows = [r for r in make_dataset() if r["split"] == "val"]
    return sum(judged(r, decide(skill, r["input"]["trace"]))["score"] for r in rows) / len(rows)


def test_the_seed_skill_is_weak_and_the_good_skill_is_strong() -> None:
    assert 0.2 <= _mean_val(SEED_SKILL) <= 0.4
    assert _mean_val(GOOD_SKILL) >= 0.9


def test_every_optimizer_edit_kind_occurs_over_a_seed_range(tmp_path: Path) -> None:
    outcomes: Counter[str] = Counter()
    effects: Counter[str] = Counter()
    by_name = {edit.name: edit for edit in EDITS}
    for seed in range(300):
        work = tmp_path / f"w{seed}"
        write_workspace(work)
        target = work / "target"
        done = optimize(target, tmp_path / "missing-prompt.json", seed, FAULT_RATES)
        kind = done.split(":")[0]
        outcomes[kind] += 1
        if kind == "edit":
            effects[by_name[done.split(": ")[1]].effect] += 1
        if kind == "malformed":
            with pytest.raises(SkillError, match=r"SKILL.md:\d+"):
                parse_skill((target / "skill" / "SKILL.md").read_text())
        if kind == "oversized":
            assert (target / "skill" / "SKILL.md").stat().st_size > 64 * 1024
        if kind == "tamper":
            assert done.split(": ")[1] in ("grader/rubric.json", "data/answer_format.json")
        if kind == "noop":  # also a "repeat" with nothing rejected to repeat
            assert (target / "skill" / "SKILL.md").read_text() == SEED_SKILL
        if kind == "symlink":
            assert (target / "skill" / "notes.md").is_symlink()
        if kind == "restart":
            assert (target / "skill" / "SKILL.md").read_text() == SEED_SKILL
    expected = {"edit", "noop", "malformed", "oversized", "tamper", "symlink", "restart"}
    assert set(outcomes) == expected
    assert set(effects) == {"help", "harm", "neutral"}
    assert outcomes["edit"] > 0.6 * 300


def test_the_repeat_fault_reapplies_the_last_rejected_edit(tmp_path: Path) -> None:
    write_workspace(tmp_path / "w")
    target = tmp_path / "w" / "target"
    skill = target / "skill" / "SKILL.md"
    edit = next(e for e in EDITS if e.apply(SEED_SKILL) is not None)
    changed = edit.apply(SEED_SKILL)
    assert changed is not None
    prompt = tmp_path / "prompt.json"
    prompt.write_text(
        json.dumps({"rejected": [{"diff": _diff(SEED_SKILL, changed), "reason": "x"}]})
    )
    rates = {kind: 0.0 for kind in FAULT_RATES} | {"repeat": 1.0}
    assert optimize(target, prompt, 0, rates) == f"repeat: {edit.name}"
    assert skill.read_text() == changed


def test_the_optimizer_steers_by_failure_reasons_and_skips_rejected_diffs(tmp_path: Path) -> None:
    from evolane.examples.selfevolve._optimizer import _diff, choose_edit

    prompt = {"failing": [{"id": "x", "reason": "evidence"}] * 5}
    picks = Counter(
        choose_edit(SEED_SKILL, prompt, random.Random(seed))[0].aims_at  # type: ignore[index]
        for seed in range(200)
    )
    assert picks["evidence"] == max(picks.values())
    every = {_diff(SEED_SKILL, e.apply(SEED_SKILL) or SEED_SKILL) for e in EDITS}
    rejected = {"rejected": [{"diff": d} for d in every]}
    assert choose_edit(SEED_SKILL, rejected, random.Random(1)) is None


def test_a_diff_from_the_campaigns_edit_diff_is_never_repeated(tmp_path: Path) -> None:
    from evolane.campaign._prompt import edit_diff
    from evolane.store import BlobStore, snapshot_tree

    store = BlobStore(tmp_path / "store")
    write_workspace(tmp_path / "w")
    target = tmp_path / "w" / "target"
    parent = snapshot_tree(store, target)
    picked = choose_edit(SEED_SKILL, {}, random.Random(3))
    assert picked is not None
    edit, changed = picked
    (target / "skill" / "SKILL.md").write_text(changed)
    diff = edit_diff(store, parent, snapshot_tree(store, target))
    assert diff.startswith("skill/SKILL.md\n")

    def names(prompt: dict) -> set[str]:
        picks = [choose_edit(SEED_SKILL, prompt, random.Random(s)) for s in range(300)]
        return {p[0].name for p in picks if p is not None}

    assert edit.name in names({})
    rejected = names({"rejected": [{"diff": diff, "reason": "regressed"}]})
    assert rejected and edit.name not in rejected


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODULE, *args], capture_output=True, text=True, timeout=60)


def _replay(workspace: Path, case_file: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """Run the replay command on the workspace's target skill."""
    target = str(workspace / "target")
    return _run(
        "replay", "--case-file", str(case_file), "--candidate", target, "--output-dir", str(out)
    )


def test_replay_and_judge_commands_round_trip(tmp_path: Path) -> None:
    write_workspace(tmp_path)
    row = json.loads((tmp_path / "dataset.jsonl").read_text().splitlines()[30])
    case_file = tmp_path / "case.json"
    case_file.write_text(json.dumps(row))
    out = tmp_path / "out"
    replay = _replay(tmp_path, case_file, out)
    assert replay.returncode == 0, replay.stderr
    answer = json.loads((out / "output.json").read_text())
    assert set(answer) == {"action", "trigger", "verification", "exception", "evidence", "steps"}
    judge = _run("judge", "--case-file", str(case_file), "--output-dir", str(out))
    verdict = json.loads(judge.stdout)
    assert 0.0 <= verdict["score"] <= 1.0 and set(verdict["components"]) == set(WEIGHTS)
    assert verdict == judged(row, answer)


def test_a_malformed_skill_fails_replay_and_validation_with_its_line(tmp_path: Path) -> None:
    write_workspace(tmp_path)
    skill = tmp_path / "target" / "skill" / "SKILL.md"
    skill.write_text(SEED_SKILL.replace("- otherwise: none", "- otherwise none"))
    case_file = tmp_path / "case.json"
    case_file.write_text((tmp_path / "dataset.jsonl").read_text().splitlines()[0])
    replay = _replay(tmp_path, case_file, tmp_path / "out")
    assert replay.returncode == 2 and "SKILL.md:" in replay.stderr
    validate = _run("validate", str(tmp_path / "target"))
    assert validate.returncode == 1 and "SKILL.md:" in validate.stderr
    skill.write_text(SEED_SKILL)
    assert _run("validate", str(tmp_path / "target")).returncode == 0


def _hill_climb(seed: int, iterations: int = 8, population: int = 4) -> tuple[float, list[str]]:
    """A minimal paired-gate hill climb over the optimizer (what a campaign does, in-process)."""
    import math
    import statistics

    from evolane.examples.selfevolve._optimizer import _diff, choose_edit

    rows = [r for r in make_dataset() if r["split"] == "val"]

    def scores(text: str) -> list[float]:
        skill = parse_skill(text)
        return [judged(r, decide(skill, r["input"]["trace"]))["score"] for r in rows]

    parent, parent_scores, rejected, accepted = SEED_SKILL, scores(SEED_SKILL), [], []
    by_name = {edit.name: edit for edit in EDITS}
    for iteration in range(iterations):
        prompt = {
            "iteration": iteration,
            "rejected": rejected,
            "failing": [
                {
                    "id": r["id"],
                    "reason": judged(r, decide(parse_skill(parent), r["input"]["trace"]))["reason"],
                }
                for r, s in zip(rows, parent_scores, strict=True)
                if s < 1
            ],
        }
        best = None
        for slot in range(population):
            picked = choose_edit(parent, prompt, random.Random(f"{seed}:{iteration}:{slot}"))
            if picked is None:
                continue
            edit, text = picked
            candidate = scores(text)
            deltas = [c - p for c, p in zip(candidate, parent_scores, strict=True)]
            mean, se = statistics.mean(deltas), statistics.stdev(deltas) / math.sqrt(len(deltas))
            if (mean > se if se > 0 else mean > 0) and (best is None or mean > best[0]):
                best = (mean, edit.name, text, candidate)
            elif not mean > se:
                rejected.append({"diff": _diff(parent, text)})
        if best is not None:
            parent, parent_scores = best[2], best[3]
            accepted.append(best[1])
    assert all(by_name[name].effect != "harm" for name in accepted), accepted
    return sum(parent_scores) / len(parent_scores), accepted


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_paired_gate_hill_climb_lifts_val_past_0_7_and_rejects_harm(seed: int) -> None:
    final, accepted = _hill_climb(seed)
    assert _mean_val(SEED_SKILL) < 0.3 and final >= 0.7, (final, accepted)
