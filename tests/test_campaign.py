"""The campaign end to end on a toy workload: the funnel and every local gate, statuses,
campaigns across cycles, budgets, apply policies, estimate counts, the report."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from evolane.campaign._report import Report
from evolane.campaign._run import RunOutcome, RunRequest, run_campaign
from evolane.campaign._runs import StoreLayout, load_campaign, load_run
from evolane.inputs import InputError
from evolane.messages import GateConfig, Usage
from evolane.store import read_journal
from tests.campaign_helpers import (
    FAILING_CHECK,
    publishing_config,
    toy_config,
    usage_replay,
    write_toy,
)


async def _run(request: RunRequest, seconds: float = 60) -> RunOutcome:
    with trio.fail_after(seconds):
        return await run_campaign(request)


def _answers(target: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(target.iterdir()) if p.is_file()}


def _by_slot(report: Report) -> dict[str, object]:
    return {f.slot_id: f for f in report.funnel}


async def test_every_local_gate_rejects_before_any_replay(tmp_path: Path) -> None:
    plan = {
        "0.0": "fix:2",
        "0.1": "same:2",  # the same tree as slot 0: a duplicate
        "0.2": "noop",
        "1.0": "tamper",
        "1.1": "symlink",
        "1.2": "oversize",
        "2.0": "malformed",
        "2.1": "crash",
        "2.2": "harm:2",
    }
    paths = write_toy(tmp_path, plan)
    before = _answers(paths["target"])
    config = toy_config(paths, population=3, iterations=3)
    outcome = await _run(RunRequest(config))
    report = outcome.report
    assert report is not None and report.status == "finished"
    slots = _by_slot(report)
    expect = {
        "c0.i0.s0": ("selected", None),
        "c0.i0.s1": ("rejected", "duplicate"),
        "c0.i0.s2": ("rejected", "no_op"),
        "c0.i1.s0": ("rejected", "protected_paths"),
        "c0.i1.s1": ("rejected", "disallowed_entries"),
        "c0.i1.s2": ("rejected", "size_limit"),
        "c0.i2.s0": ("rejected", "malformed"),
        "c0.i2.s1": ("blocked", None),
        "c0.i2.s2": ("rejected", None),
    }
    for slot_id, (terminal, gate) in expect.items():
        record = slots[slot_id]
        assert record.terminal == terminal, (slot_id, record)  # type: ignore[attr-defined]
        failed = [g.gate for g in record.gates if g.outcome != "pass"]  # type: ignore[attr-defined]
        assert failed == ([gate] if gate else []), (slot_id, record)
    assert slots["c0.i1.s0"].decision == "indecisive"  # type: ignore[attr-defined]
    # zero replays for a locally rejected (or never generated) candidate
    measured = {m.measurement_id for m in report.measurements if m.purpose == "paired"}
    assert measured == {"c0.i0.s0", "c0.i2.s2"}
    # the harmful candidate was measured and rejected; the fix was accepted
    assert slots["c0.i2.s2"].stages[-3:] == ("paired_replay", "evaluation", "rejected")  # type: ignore[attr-defined]
    assert [d.decision for d in report.decisions if d.slot == 0 and d.iteration == 0] == ["accept"]
    assert report.scores.best_val is not None and report.scores.baseline_val is not None
    assert report.scores.best_val.mean > report.scores.baseline_val.mean
    # the proposal policy never touches the target
    assert _answers(paths["target"]) == before
    assert report.apply is not None and report.apply.status == "proposed"


async def test_decisions_never_use_the_sealed_test_split(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:3"})
    outcome = await _run(RunRequest(toy_config(paths, iterations=2, population=1)))
    report = outcome.report
    assert report is not None and report.test is not None
    test_ids = {m.measurement_id for m in report.measurements if m.split == "test"}
    assert test_ids == {"c0.final.test"}
    decided = {f"c{d.cycle}.i{d.iteration}.s{d.slot}" for d in report.decisions}
    assert not decided & test_ids
    units = json.loads(outcome.run_dir.joinpath("report.json").read_text())["measurements"]  # type: ignore[union-attr]
    assert all(m["split"] == "val" for m in units if m["purpose"] in ("paired", "baseline"))
    assert report.scores.best_test is not None and report.scores.baseline_test is not None
    # the same run with the test split's answers turned around decides exactly the same
    other = write_toy(tmp_path / "flipped", {"default": "fix:3"})
    rows = [json.loads(line) for line in other["dataset"].read_text().splitlines()]
    for row in rows:
        if row["split"] == "test":
            row["expected_output"] = "no"
    other["dataset"].write_text("".join(json.dumps(row) + "\n" for row in rows))
    flipped = (await _run(RunRequest(toy_config(other, iterations=2, population=1)))).report
    assert flipped is not None and flipped.scores.baseline_test is not None
    assert flipped.scores.baseline_test.mean != report.scores.baseline_test.mean

    def comparable(r: Report) -> list[tuple[object, ...]]:
        return [(d.iteration, d.slot, d.digest, d.decision, d.reason) for d in r.decisions]

    assert comparable(flipped) == comparable(report) and len(report.decisions) == 2


async def test_estimate_counts_bound_what_the_run_does(tmp_path: Path) -> None:
    plan = {"0.0": "harm:1", "0.1": "harm:2", "1.0": "harm:3", "1.1": "harm:4"}
    paths = write_toy(tmp_path, plan)
    config = toy_config(paths, iterations=2, population=2, stall=5)
    config = config.model_copy(
        update={"gate": config.gate.model_copy(update={"sequential": False})}
    )
    outcome = await _run(RunRequest(config))
    report, estimate = outcome.report, outcome.estimate
    assert report is not None
    ran = sum(m.units_run for m in report.measurements)
    assert 0 < ran <= estimate.replays_max
    optimizer_calls = sum(1 for f in report.funnel if f.optimizer)
    assert optimizer_calls == estimate.optimizer_calls_max == 4
    # nothing accepted, no early stop: baseline 12, 4 candidates x 12, test 6 (+6 reused)
    assert ran == 12 + 4 * 12 + 6
    # fewer val cases than the gate's min_cases: the scheduler repeats (2/3), so does this
    from evolane.campaign._estimate import estimate_run

    few = config.model_copy(update={"gate": config.gate.model_copy(update={"min_cases": 20})})
    repeated = estimate_run(few, val_cases=12, test_cases=6)
    assert (repeated.baseline_repetitions, repeated.candidate_repetitions) == (2, 3)


async def test_estimate_bounds_a_final_test_at_the_runs_own_repetitions(tmp_path: Path) -> None:
    """A best that is not confirmed (``error_control="none"``) is measured on a test split
    smaller than ``min_cases`` at 2/3 repetitions, not the confirmation's 1/1: 7 x 5 = 35
    test replays, where the estimate counted 14 (51 replays run under "at most 46")."""
    paths = write_toy(tmp_path, {"default": "fix:4"}, val=8, test=7)
    gate = GateConfig(gate="strict", min_cases=8, sequential=False)
    config = toy_config(paths, iterations=1, population=1, gate=gate, error_control="none")
    outcome = await _run(RunRequest(config))
    report = outcome.report
    assert report is not None and report.selected is not None
    ran = sum(m.units_run for m in report.measurements)
    assert ran == 8 + 8 + 7 * 5  # the parent, the candidate, the test split (val reused)
    assert ran <= outcome.estimate.replays_max


async def test_stall_ends_the_campaign_as_exhausted(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "harm:1"})
    outcome = await _run(RunRequest(toy_config(paths, iterations=6, population=1, stall=2)))
    report = outcome.report
    assert report is not None and report.campaign_status == "exhausted"
    assert len(report.iterations) == 2
    assert report.status == "finished" and outcome.exit_code == 0


async def test_tampering_iterations_do_not_count_toward_stall(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "tamper"})
    outcome = await _run(RunRequest(toy_config(paths, iterations=4, population=1, stall=2)))
    report = outcome.report
    assert report is not None and len(report.iterations) == 4
    assert report.campaign_status == "complete"
    assert all(d.decision == "indecisive" for d in report.decisions)
    # ...but the optimizer is told, so it does not try the same tampering again
    remembered = load_campaign(StoreLayout(paths["store"]), report.campaign_id).rejected
    assert [r.reason.split(":")[0] for r in remembered] == ["protected_paths"] * 4
    assert all("grader/rubric.txt" in r.diff for r in remembered)


async def test_campaign_cycles_resume_and_refusals(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"})
    config = toy_config(paths, iterations=1, population=1, max_improvement_cycles=2)
    first = await _run(RunRequest(config))
    assert first.report is not None and first.report.campaign_status == "paused"
    campaign = first.report.campaign_id
    layout = StoreLayout(paths["store"])
    best_after_first = load_campaign(layout, campaign).best_ref
    assert best_after_first == first.report.best != first.report.seed
    changed = config.model_copy(update={"replay": config.measure.replay + " "})
    with pytest.raises(InputError, match="replay changed"):
        await _run(RunRequest(changed, resume_campaign=campaign))
    # the next cycle keeps the campaign's cycle count even when the flag is not repeated
    again = config.model_copy(update={"max_improvement_cycles": 1})
    second = await _run(RunRequest(again, resume_campaign=campaign))
    assert second.report is not None and second.report.cycle == 1
    assert second.report.campaign_status == "complete"
    assert second.report.iterations[0].parent == best_after_first.digest
    with pytest.raises(InputError, match="complete and cannot resume"):
        await _run(RunRequest(config, resume_campaign=campaign))
    with pytest.raises(InputError, match="no such campaign"):
        await _run(RunRequest(config, resume_campaign="c-nope"))


async def test_auto_verified_publishes_the_best_tree(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    config = publishing_config(paths)
    outcome = await _run(RunRequest(config))
    report = outcome.report
    assert report is not None and report.apply is not None
    assert report.apply.status == "applied"
    assert all((paths["target"] / f"val{i:02d}").read_text() == '"yes"' for i in range(12))


async def test_auto_verified_rolls_back_when_the_check_fails(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    before = _answers(paths["target"])
    config = publishing_config(paths, FAILING_CHECK)
    outcome = await _run(RunRequest(config))
    assert outcome.report is not None and outcome.report.apply is not None
    assert outcome.report.apply.status == "rolled_back"
    assert _answers(paths["target"]) == before


async def test_a_token_ceiling_ends_the_run_budget_limited(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:1"})
    replay = usage_replay(tmp_path)
    config = toy_config(paths, replay=replay, max_tokens=3000, iterations=5, population=1)
    outcome = await _run(RunRequest(config))
    report = outcome.report
    assert report is not None and report.status == "budget_limited"
    assert report.campaign_status == "budget_limited" and outcome.exit_code == 3
    spent, lanes = report.budget.spent.tokens or 0, config.measure.replay_concurrency
    assert 3000 - 100 * lanes <= spent <= 3000 + 100 * lanes  # ran up to the ceiling, not past
    with pytest.raises(InputError, match="budget_limited and cannot resume"):
        await _run(RunRequest(config, resume_campaign=report.campaign_id))


async def test_the_wall_clock_budget_kills_hanging_replays(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:1"})
    config = toy_config(paths, replay="sleep 3600", wall_clock_budget=2.0, kill_grace=0.2)
    outcome = await _run(RunRequest(config), seconds=30)  # replays of an hour: a hang guard
    report = outcome.report
    assert report is not None and report.status == "budget_limited"
    # the speed figure (exit within budget + grace + 1 s) is benchmarks/wall_clock_budget.py


async def test_bad_input_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {})
    config = toy_config(paths)
    cases = {
        "--target": config.model_copy(update={"target": str(tmp_path / "missing")}),
        "--dataset": config.model_copy(update={"dataset": str(tmp_path / "missing.jsonl")}),
    }
    for flag, bad in cases.items():
        with pytest.raises(InputError, match=flag):
            await _run(RunRequest(bad))
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(InputError, match="empty"):
        await _run(RunRequest(config.model_copy(update={"dataset": str(empty)})))
    rows = paths["dataset"].read_text().splitlines()
    dup = tmp_path / "dup.jsonl"
    dup.write_text("\n".join([rows[0], rows[0]]) + "\n")
    with pytest.raises(InputError, match=r"dup.jsonl:2"):
        await _run(RunRequest(config.model_copy(update={"dataset": str(dup)})))
    no_val = tmp_path / "noval.jsonl"
    no_val.write_text("\n".join(r for r in rows if '"test"' in r) + "\n")
    with pytest.raises(InputError, match="val split is empty"):
        await _run(RunRequest(config.model_copy(update={"dataset": str(no_val)})))
    assert not paths["store"].exists()


async def test_dry_run_writes_nothing(tmp_path: Path) -> None:
    """Not even a store: found by review, a dry run (and ``evolane estimate``, whose default
    store is ``.evolane`` in the current folder) created the store and wrote the seed tree's
    and the dataset's blobs into it. An existing store gets the same estimate."""
    paths = write_toy(tmp_path, {})
    outcome = await _run(RunRequest(toy_config(paths), dry_run=True))
    assert outcome.report is None and outcome.estimate.replays_max > 0
    assert not paths["store"].exists()
    paths["store"].mkdir()
    again = await _run(RunRequest(toy_config(paths), dry_run=True))
    assert again.estimate == outcome.estimate
    assert not (paths["store"] / "runs").exists()
    under_a_file = toy_config(paths, store=str(paths["dataset"] / "store"))
    with pytest.raises(InputError, match="not a directory"):  # refused, not estimated
        await _run(RunRequest(under_a_file, dry_run=True))


async def test_every_finished_unit_is_journaled_once(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"})
    outcome = await _run(RunRequest(toy_config(paths)))
    assert outcome.run_dir is not None
    records = read_journal(outcome.run_dir / "journal.jsonl").records
    units = [r["unit"] for r in records if r["type"] == "unit"]
    assert len(units) == len(set(units))
    proposals = [r for r in records if r["type"] == "proposal"]
    assert len(proposals) == 6
    report = Report.model_validate_json((outcome.run_dir / "report.json").read_bytes())
    assert report.budget.spent.wall_seconds is not None
    assert isinstance(report.budget.ceilings, Usage)
    assert (outcome.run_dir / "report.md").read_text().startswith(f"# evolane run {report.run_id}")


async def test_screening_stops_a_loser_on_the_hardest_failing_case(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"0.0": "harm:1", "0.1": "fix:1"})
    outcome = await _run(RunRequest(toy_config(paths, iterations=1, screening=True)))
    report = outcome.report
    assert report is not None
    slots = _by_slot(report)
    loser, winner = slots["c0.i0.s0"], slots["c0.i0.s1"]
    assert loser.stages[-2:] == ("screening", "rejected")  # type: ignore[attr-defined]
    assert loser.reason.startswith("screening: no gain on the hardest failing case val04")  # type: ignore[attr-defined]
    assert "paired_replay" in winner.stages  # type: ignore[attr-defined]
    ids = {m.measurement_id: m for m in report.measurements}
    assert "c0.i0.s0.screen" in ids and "c0.i0.s0" not in ids
    assert ids["c0.i0.s0.screen"].units_planned == 2  # one case, both arms
    assert "c0.i0.s1.screen" in ids and "c0.i0.s1" in ids


async def test_a_candidate_that_breaks_every_replay_is_rejected_not_indecisive(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {})
    script = tmp_path / "replay.sh"  # the agent needs REQUIRED intact, or it crashes
    script.write_text(
        'test "$(cat "$1/REQUIRED")" = "keep me" || exit 7\n'
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
    )
    paths["plan"].write_text(json.dumps({"0.0": "break"}))
    config = toy_config(
        paths, replay=f"sh {script} {{candidate}} {{output_dir}}", iterations=1, population=1
    )
    outcome = await _run(RunRequest(config))
    report = outcome.report
    assert report is not None
    (decision,) = report.decisions
    assert decision.decision == "reject", decision
    assert any(
        f.failure.owner == "candidate" and f.failure.code == "exit_7" for f in report.failures
    )


async def test_a_ceiling_reached_before_the_optimizer_ends_the_run_budget_limited(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:1"})
    replay = usage_replay(tmp_path)
    # the parent's 12 val cases spend exactly the ceiling; the optimizer is then refused
    config = toy_config(paths, replay=replay, max_tokens=1200, replay_concurrency=1)
    outcome = await _run(RunRequest(config))
    report = outcome.report
    assert report is not None and report.status == "budget_limited", report
    assert outcome.exit_code == 3 and "optimizer" in report.message
    assert report.budget.spent.tokens == 1200
    assert [f.terminal for f in report.funnel] == ["not_run"] * config.population
    assert all("optimizer" in f.reason for f in report.funnel)


async def test_a_candidate_rejected_in_an_earlier_cycle_is_a_duplicate_in_the_next(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "harm:1"})
    config = toy_config(paths, iterations=1, population=1, max_improvement_cycles=2)
    first = await _run(RunRequest(config))
    assert first.report is not None and first.report.decisions[0].decision == "reject"
    rejected_digest = first.report.decisions[0].digest
    second = await _run(RunRequest(config, resume_campaign=first.report.campaign_id))
    assert second.report is not None
    (decision,) = second.report.decisions
    assert decision.digest == rejected_digest
    assert decision.reason.startswith("duplicate")
    (funnel,) = second.report.funnel
    assert "paired_replay" not in funnel.stages


async def test_a_crashing_optimizer_lane_costs_its_slots_not_the_run(tmp_path: Path) -> None:
    from evolane.testing import Chaos

    paths = write_toy(tmp_path, {"default": "fix:2"})
    chaos = Chaos(seed=1, handler_crash=1.0, only=(".optimizer-",))
    with chaos.installed():
        outcome = await _run(RunRequest(toy_config(paths, iterations=2, population=2)))
    report = outcome.report
    assert report is not None and report.status == "finished"
    assert chaos.injected["handler_crash"] >= 4
    assert [d.decision for d in report.decisions] == ["indecisive"] * 4
    assert all(f.terminal == "blocked" for f in report.funnel)
    assert report.campaign_status != "exhausted"  # lost slots are not a stall


async def test_a_budget_stop_mid_iteration_keeps_the_candidate_already_accepted(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"0.0": "fix:8", "0.1": "fix:1"})
    replay = usage_replay(tmp_path)
    config = toy_config(paths, replay=replay, max_tokens=2600, iterations=1, population=2)
    outcome = await _run(RunRequest(config))
    report = outcome.report
    assert report is not None and report.status == "budget_limited"
    first, second = (f for f in report.funnel)
    assert (first.terminal, first.decision) == ("selected", "accept")
    assert (second.terminal, second.decision) == ("not_run", "indecisive")
    assert report.best.digest == first.digest != report.seed.digest
    assert [entry.digest for entry in report.lineage] == [first.digest]
    assert [(d.slot, d.decision) for d in report.decisions] == [(0, "accept"), (1, "indecisive")]
    state = load_campaign(StoreLayout(paths["store"]), report.campaign_id)
    assert state.best_ref == report.best
    assert first.digest in state.seen and second.digest not in state.seen  # not measured yet


async def test_the_optimizer_context_shows_failing_cases_without_their_answers(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "peek"})
    outcome = await _run(RunRequest(toy_config(paths, iterations=1, population=1)))
    assert outcome.report is not None
    (funnel,) = outcome.report.funnel
    assert funnel.optimizer == "no-answers in 8 cases"


async def test_symlinks_the_parent_already_had_do_not_fail_the_entries_gate(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"0.0": "fix:8", "0.1": "symlink"})
    (paths["target"] / "alias").symlink_to("REQUIRED")
    config = toy_config(paths, iterations=1, population=2)
    outcome = await _run(RunRequest(config))
    report = outcome.report
    assert report is not None
    inherited, added = report.funnel
    assert inherited.decision == "accept", inherited.reason
    assert (added.terminal, added.reason) == ("rejected", "disallowed_entries: link: symlink")


async def test_a_long_replay_command_is_a_campaign_identity_like_any_other(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"})
    config = toy_config(paths, iterations=1, population=1, max_improvement_cycles=2)
    config = config.model_copy(update={"replay": config.measure.replay + " " + "x" * 600})
    first = await _run(RunRequest(config))
    assert first.report is not None and first.report.campaign_status == "paused"
    changed = config.model_copy(update={"replay": config.measure.replay + "y"})
    with pytest.raises(InputError, match=r"replay changed .*\.\.\.") as refused:
        await _run(RunRequest(changed, resume_campaign=first.report.campaign_id))
    assert len(str(refused.value)) < 300


@pytest.mark.parametrize(
    ("override", "said", "quoted"),
    [
        (
            {"judge": "sh -c 'echo judge is broken >&2; exit 2'"},
            "no case of the parent could be scored",
            "judge is broken",
        ),
        (  # a replay that cannot start stops its measurement first: the host's failure
            {"replay": "/nonexistent/agent {candidate} {output_dir}"},
            "measurement c0.i0.base stopped: baseline replay could not start",
            "/nonexistent/agent",
        ),
    ],
)
async def test_a_run_that_can_score_nothing_fails_loudly(
    tmp_path: Path, override: dict[str, str], said: str, quoted: str
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"})
    outcome = await _run(RunRequest(toy_config(paths, **override)))
    report = outcome.report
    assert report is not None and report.status == "failed" and outcome.exit_code == 1
    assert said in report.message
    assert quoted in report.message
    assert report.campaign_status == "paused" and report.decisions == ()
    assert report.funnel == ()  # no optimizer call was paid for
    with pytest.raises(InputError, match=r"the run failed .* --resume-campaign c-"):
        await _run(RunRequest(toy_config(paths, **override), resume_run=report.run_id))


async def test_judges_stopped_by_an_early_stop_are_not_reported_as_failures(
    tmp_path: Path,
) -> None:
    # A large effect on many cases, judged one at a time: the early stop comes well before the
    # last case, with replayed units still queued for the judge (they must end cancelled).
    paths = write_toy(tmp_path, {"default": "fix:16"}, val=32)
    judge = tmp_path / "judge.sh"
    judge.write_text(
        "sleep 0.15\n"
        'if grep -q yes "$1/output.json"; then echo \'{"score": 1}\'; '
        "else echo '{\"score\": 0}'; fi\n"
    )
    paired = GateConfig(gate="paired", min_cases=4)  # sequential: stops early on a clear win
    config = toy_config(
        paths,
        judge=f"sh {judge} {{output_dir}}",
        iterations=1,
        population=1,
        gate=paired,
        judge_concurrency=1,
    )
    report = (await _run(RunRequest(config))).report
    assert report is not None
    stopped = [m for m in report.measurements if m.status == "early_stopped"]
    counts = [(m.measurement_id, m.units_failed, m.units_cancelled) for m in stopped]
    assert stopped and all(m.units_failed == 0 < m.units_cancelled for m in stopped), counts
    reasons = [d.reason for d in report.decisions if d.reason.startswith("early stop")]
    assert reasons and all(r.startswith("early stop after ") for r in reasons), reasons  # once
    store = StoreLayout(paths["store"]).blobs()
    cancelled = [
        u
        for m in report.measurements
        for u in json.loads(store.read_bytes(m.units_ref))
        if (u.get("judge") or {}).get("status") == "cancelled"
    ]
    assert cancelled, "the early stop cancelled judges in flight"
    assert not [f for f in report.failures if "cancel" in f.failure.code]


async def test_a_cancel_landing_after_the_report_was_written_leaves_the_run_as_reported(
    tmp_path: Path,
) -> None:
    from evolane.campaign._finish import save_ended
    from evolane.campaign._prepare import prepare_run

    paths = write_toy(tmp_path, {"default": "fix:2"})
    config = toy_config(paths, iterations=1, population=1)
    outcome = await _run(RunRequest(config))
    assert outcome.report is not None and outcome.report.status == "finished"
    layout = StoreLayout(paths["store"])
    before = load_run(layout, outcome.report.run_id)
    prepared = prepare_run(config.model_copy(update={"store": str(paths["store"])}))
    prepared.run = before.model_copy(update={"status": "running"})  # as the session held it
    save_ended(prepared, clock=0.0, failure=None)  # a second Ctrl-C right after the report
    assert load_run(layout, outcome.report.run_id) == before


async def test_a_replay_pool_that_gives_up_ends_the_run_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by review: every lane crashing (a tree its lanes could not lay out) made the pool
    # give up; the units queued on its lanes then waited out their asks (replay timeout +
    # 60 s) while the run's supervisor waited on them, deaf to Ctrl-C, and the run ended in a
    # traceback. Now those asks fail at once and the run ends failed, in one line.
    from evolane.lanes._replay import ReplayLane

    async def crash(self: ReplayLane, message: object) -> None:
        raise RuntimeError("cannot lay out this tree")

    monkeypatch.setattr(ReplayLane, "receive", crash)
    paths = write_toy(tmp_path, {"default": "fix:2"}, val=24)
    config = toy_config(paths, iterations=1, population=1, replay_timeout=120.0)
    with trio.fail_after(60):  # the asks would wait 180 s
        outcome = await run_campaign(RunRequest(config))
    assert outcome.report is not None and outcome.report.status == "failed"
    assert "cannot lay out this tree" in outcome.report.message
