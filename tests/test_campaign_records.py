"""What the run and campaign records must carry for later starts to be right: the tree the
target holds after an apply, the tree of every stored unit, the unfinished run a campaign
has, and the identity a campaign's next cycle must match."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import orjson
import pytest
import trio

from evolane.campaign import _apply, _runs
from evolane.campaign._config import CampaignConfig
from evolane.campaign._report import Report
from evolane.campaign._run import RunOutcome, RunRequest, run_campaign
from evolane.campaign._runs import (
    StoreLayout,
    load_campaign,
    load_run,
    recover_interrupted_applies,
)
from evolane.campaign._target import target_tree
from evolane.inputs import InputError
from evolane.store import Journal, snapshot_tree
from tests.campaign_helpers import (
    FAILING_CHECK,
    PASSING_CHECK,
    publishing_config,
    toy_config,
    usage_replay,
    write_toy,
)


async def _run(request: RunRequest, seconds: float = 60) -> RunOutcome:
    with trio.fail_after(seconds):
        return await run_campaign(request)


async def _interrupted_at_once(config: CampaignConfig) -> RunOutcome:
    """A run stopped (like a first Ctrl-C) before it did anything: resumable."""
    stop = trio.Event()
    stop.set()
    with trio.fail_after(60):
        return await run_campaign(RunRequest(config), interrupt=stop)


def _answers(target: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(target.iterdir()) if p.is_file()}


# -- 2. the tree the target holds follows the applies that succeeded -----------------------


async def test_a_rolled_back_cycle_leaves_the_next_cycle_free_to_publish(tmp_path: Path) -> None:
    # 8 test cases: two cycles share the confirmation's 0.05 (0.025 each), which 5 full
    # gains (2^-5) would not reach
    paths = write_toy(tmp_path, {"default": "fix:2"}, test=8)
    before = _answers(paths["target"])
    config = publishing_config(paths, FAILING_CHECK, max_improvement_cycles=2)
    first = (await _run(RunRequest(config))).report
    assert first is not None and first.apply is not None
    assert first.apply.status == "rolled_back" and _answers(paths["target"]) == before
    layout = StoreLayout(paths["store"])
    assert load_campaign(layout, first.campaign_id).applied_ref is None
    passing = config.model_copy(update={"check": PASSING_CHECK})
    second = (await _run(RunRequest(passing, resume_campaign=first.campaign_id))).report
    assert second is not None and second.cycle == 1 and second.apply is not None
    assert second.apply.status == "applied", second.apply.message  # not "target changed"
    assert target_tree(layout.blobs(), paths["target"]) == second.best
    assert load_campaign(layout, first.campaign_id).applied_ref == second.best


# -- 3. a re-judge uses a stored unit only on its own tree, and never writes the target -----

INVERTED_JUDGE = """grep -q no "$1/output.json" && echo '{"score": 1.0}' || echo '{"score": 0.0}'
"""


async def test_a_rejudge_that_decides_otherwise_says_the_stored_run_diverged(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    # three candidate repetitions: the later test-split units of the accepted tree have ids
    # that, once the re-judge keeps the seed instead, name units of the seed no cache holds
    # but the one the seed's baseline unit of the case was told (`shown_repetition`)
    config = toy_config(paths, iterations=1, population=1, candidate_replay_repetitions=3)
    original = (await _run(RunRequest(config))).report
    assert original is not None and original.best != original.seed
    judge = tmp_path / "inverted.sh"
    judge.write_text(INVERTED_JUDGE)
    inverted = config.model_copy(update={"judge": f"sh {judge} {{output_dir}}"})
    outcome = await _run(RunRequest(inverted, rerun_from=original.run_id))
    report = outcome.report
    assert report is not None and report.best == report.seed  # the new judge rejects it
    test = {m.measurement_id: m for m in report.measurements}["c0.final.test"]
    assert test.status == "diverged"
    assert "the stored run diverged" in report.message
    store = StoreLayout(paths["store"]).blobs()
    units = orjson.loads(store.read_bytes(test.units_ref))
    late = [u for u in units if u["arm"] == "candidate" and u["repetition"] >= 1]
    diverged = [u for u in late if not u["reused"]]  # at least one a case: 2 of 3 not held
    assert len(diverged) >= len(late) // 2, late
    assert all(u["status"] == "not_run" and u["score"] is None for u in diverged)
    assert all(u["note"].startswith("the stored run diverged") for u in diverged)
    assert all(u["status"] == "succeeded" for u in late if u["reused"])  # the same experiment
    # the units that are the same experiment on the same tree were judged again, not dropped
    same = [u for u in units if u["arm"] == "baseline"]
    assert same and all(u["status"] == "succeeded" and u["restored"] for u in same)


@pytest.mark.parametrize(
    ("tree", "restored"),
    [
        ("sha256:" + "0" * 64, False),  # made on another tree than planned: replayed again
        (None, True),  # an older journal names no tree: taken as it is, never paid twice
    ],
)
async def test_a_resume_restores_a_stored_unit_only_from_the_planned_tree(
    tmp_path: Path, tree: str | None, restored: bool
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"}, test=0)
    config = toy_config(paths, iterations=1, population=1)
    first = await _interrupted_at_once(config)
    assert first.report is not None and first.run_dir is not None
    unit = "c0.i0.base.0.0.b"
    replay = {"unit_id": unit, "case_id": "val00", "arm": "baseline", "repetition": 0}
    stored = {
        "type": "unit",
        "measurement": "c0.i0.base",
        "unit": unit,
        **({} if tree is None else {"tree": tree}),
        "status": "failed",
        "reused": False,
        "replay": {**replay, "status": "failed"},
        "judge": None,
    }
    with (first.run_dir / "journal.jsonl").open("a") as journal:
        journal.write(json.dumps(stored) + "\n")
    resumed = (await _run(RunRequest(config, resume_run=first.report.run_id))).report
    assert resumed is not None and resumed.status == "finished"
    base = {m.measurement_id: m for m in resumed.measurements}["c0.i0.base"]
    store = StoreLayout(paths["store"]).blobs()
    (record,) = [u for u in orjson.loads(store.read_bytes(base.units_ref)) if u["unit"] == unit]
    assert record["restored"] is restored
    assert record["status"] == ("failed" if restored else "succeeded")


async def test_a_rejudge_never_writes_to_the_target(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    before = _answers(paths["target"])
    config = publishing_config(paths, FAILING_CHECK)
    original = (await _run(RunRequest(config))).report
    assert original is not None and original.apply is not None
    assert original.apply.status == "rolled_back" and _answers(paths["target"]) == before
    mtimes = {p.name: p.stat().st_mtime_ns for p in paths["target"].iterdir()}
    outcome = await _run(RunRequest(config, rerun_from=original.run_id))
    report = outcome.report
    assert report is not None and outcome.run_dir is not None
    assert report.best == original.best != report.seed  # the same judge: the same winner
    assert report.config.apply == "proposal"
    assert report.apply is not None and report.apply.status == "proposed"
    assert not (outcome.run_dir / "apply.json").exists()  # no publish was even started
    assert {p.name: p.stat().st_mtime_ns for p in paths["target"].iterdir()} == mtimes


# -- 4. a campaign with an unfinished run continues only through that run -------------------


async def test_resume_campaign_is_refused_while_a_run_of_it_is_unfinished(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"})
    config = toy_config(paths, iterations=1, population=1, max_improvement_cycles=2)
    first = await _interrupted_at_once(config)  # nothing done, the run is resumable
    assert first.report is not None and first.report.status == "interrupted"
    run_id, campaign_id = first.report.run_id, first.report.campaign_id
    with pytest.raises(InputError, match=rf"run {run_id} is unfinished.*--resume {run_id}"):
        await _run(RunRequest(config, resume_campaign=campaign_id))
    layout = StoreLayout(paths["store"])
    assert load_campaign(layout, campaign_id).runs == (run_id,)  # no second run was laid out
    resumed = await _run(RunRequest(config, resume_run=run_id))
    assert resumed.report is not None and resumed.report.status == "finished"
    following = await _run(RunRequest(config, resume_campaign=campaign_id))
    assert following.report is not None and following.report.cycle == 1


# -- 5. what a campaign's next cycle must not change ------------------------------------------


async def test_resume_campaign_refuses_a_changed_target_dataset_or_judge(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"}, test=0)
    config = toy_config(paths, iterations=1, population=1, max_improvement_cycles=3)
    first = (await _run(RunRequest(config))).report
    assert first is not None and first.campaign_status == "paused"
    campaign = first.campaign_id
    other_target = tmp_path / "other-target"
    shutil.copytree(paths["target"], other_target)
    other_dataset = tmp_path / "other.jsonl"
    shutil.copy(paths["dataset"], other_dataset)
    changes = {
        "target changed": {"target": str(other_target)},
        "dataset changed": {"dataset": str(other_dataset)},
        "judge changed": {"judge": "sh -c 'echo {{\"score\": 1}}'"},
    }
    for message, update in changes.items():
        with pytest.raises(InputError, match=message):
            await _run(RunRequest(config.model_copy(update=update), resume_campaign=campaign))
    rows = paths["dataset"].read_text()
    paths["dataset"].write_text(rows + rows.splitlines()[0].replace("val00", "val99") + "\n")
    with pytest.raises(InputError, match="dataset changed"):  # same path, other rows
        await _run(RunRequest(config, resume_campaign=campaign))
    layout = StoreLayout(paths["store"])
    assert load_campaign(layout, campaign).runs == (first.run_id,)
    assert load_run(layout, first.run_id).status == "finished"


# -- 1. the scan of apply journals at a start leaves a live run's publish alone -------------


class Crash(BaseException):
    """A simulated crash: no cleanup code catches it."""


def test_the_recovery_scan_skips_a_run_whose_journal_a_live_process_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    layout = StoreLayout(tmp_path / "store")
    store = layout.blobs()
    target = tmp_path / "target"
    target.mkdir()
    (target / "a.txt").write_text("old\n")
    parent = target_tree(store, target)
    work = tmp_path / "work"
    work.mkdir()
    (work / "a.txt").write_text("new\n")
    candidate = snapshot_tree(store, work)
    run_dir = layout.run_dir("r-live")
    run_dir.mkdir(parents=True)
    real = _apply._write_journal

    def crash_after_swapping(path: Path, record: _apply.ApplyJournal) -> None:
        real(path, record)
        if record.state == "swapping":
            raise Crash

    monkeypatch.setattr(_apply, "_write_journal", crash_after_swapping)
    publish = _apply._prepare(store, target, parent, candidate, run_dir, "best", run_dir, ())
    assert isinstance(publish, _apply._Publish)
    live = Journal(run_dir / "journal.jsonl")  # the run's own process holds it while it lives
    with pytest.raises(Crash):
        _apply._publish(store, publish)
    monkeypatch.undo()
    assert (target / "a.txt").read_text() == "new\n"
    assert recover_interrupted_applies(layout) == []  # a live publish: not ours to undo
    assert (target / "a.txt").read_text() == "new\n"
    live.close()  # the process is gone
    (recovered,) = recover_interrupted_applies(layout)
    assert recovered.run_id == "r-live" and recovered.outcome.status == "recovered"
    assert (target / "a.txt").read_text() == "old\n"
    assert recover_interrupted_applies(layout) == []  # recovered once, then final


async def test_an_apply_journal_that_cannot_be_undone_stops_every_start_with_one_line(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    broken = paths["store"] / "runs" / "r-old" / "apply.json"
    broken.parent.mkdir(parents=True)
    broken.write_text('{"state": "swapped"}')
    with pytest.raises(InputError, match=r"r-old/apply.json: an interrupted publish") as refused:
        await _run(RunRequest(toy_config(paths)))
    assert "\n" not in str(refused.value)
    assert sorted(p.name for p in (paths["store"] / "runs").iterdir()) == ["r-old"]


async def test_the_wall_clock_budget_counts_every_session_of_a_campaign(tmp_path: Path) -> None:
    """Each session starts with what the earlier ones left. No assertion reads the clock
    against a number of seconds: only the run's own records against each other and the
    budget's rule (a session ends once the campaign's total reaches the budget)."""
    paths = write_toy(tmp_path, {"default": "fix:1"})
    budget = 12.0  # far above the interrupted first session, even on a loaded machine
    config = toy_config(paths, replay="sleep 3600", wall_clock_budget=budget, kill_grace=0.2)
    stop = trio.Event()

    async def interrupt_soon() -> None:
        await trio.sleep(1.0)  # well inside the budget: the first session is interrupted
        stop.set()

    request = RunRequest(config, started=time.time())  # the session counts from here
    async with trio.open_nursery() as nursery:
        nursery.start_soon(interrupt_soon)
        with trio.fail_after(60):
            first = await run_campaign(request, interrupt=stop)
    assert first.report is not None and first.report.status == "interrupted"
    (first_left,) = _wall_left_at_starts(first.run_dir)
    assert 0 < first_left <= budget
    layout = StoreLayout(paths["store"])
    spent_first = load_run(layout, first.report.run_id).elapsed_seconds
    resumed = (await _run(RunRequest(config, resume_run=first.report.run_id))).report
    assert resumed is not None and resumed.status == "budget_limited"
    *_, left = _wall_left_at_starts(first.run_dir)
    assert 0 < left <= budget - spent_first  # what the first session left, not a fresh budget
    total = load_run(layout, first.report.run_id).elapsed_seconds
    # The resumed session was given at most ``budget - spent_first`` and ran it out: the
    # campaign reaches its budget only with the first session's spend counted in it.
    assert total >= budget
    campaign = load_campaign(layout, first.report.campaign_id)
    assert campaign.status == "paused" and campaign.elapsed_seconds == total
    with pytest.raises(InputError, match=r"--wall-clock-budget 12: the campaign has used"):
        await _run(RunRequest(config, resume_campaign=first.report.campaign_id))
    more = config.model_copy(update={"wall_clock_budget": total + 2.0})
    again = await _run(RunRequest(more, resume_campaign=first.report.campaign_id))
    assert again.report is not None and again.report.status == "budget_limited"
    (again_left,) = _wall_left_at_starts(again.run_dir)
    assert 0 < again_left <= 2.0


def _wall_left_at_starts(run_dir: Path | None) -> list[float]:
    """What each session of a run had left of the wall-clock budget as it began."""
    assert run_dir is not None
    events = [orjson.loads(line) for line in (run_dir / "events.jsonl").read_bytes().splitlines()]
    return [e["wall_clock_left"] for e in events if e["kind"] == "event.run_started"]


def test_a_session_that_died_counts_up_to_its_last_write(tmp_path: Path) -> None:
    from evolane.campaign._prepare import prepare_run

    paths = write_toy(tmp_path, {"default": "fix:1"})
    config = toy_config(paths, wall_clock_budget=100.0)
    prepared = prepare_run(config)
    began = time.time() - 50.0
    prepared.run = prepared.run.model_copy(
        update={"session_started": began, "elapsed_seconds": 7.0}
    )
    prepared.persist()  # as a run looks after a SIGKILL: still "running"
    events = prepared.run_dir / "events.jsonl"
    events.write_text("{}\n")
    os.utime(events, (began + 20.0, began + 20.0))
    resumed = prepare_run(config, resume_run=prepared.run.run_id)
    assert resumed.run.elapsed_seconds == pytest.approx(27.0)


async def test_a_resumed_run_with_no_wall_clock_left_ends_budget_limited_at_once(
    tmp_path: Path,
) -> None:
    from evolane.campaign._prepare import prepare_run

    paths = write_toy(tmp_path, {"default": "fix:1"})
    config = toy_config(paths, wall_clock_budget=30.0)
    prepared = prepare_run(config)
    prepared.run = prepared.run.model_copy(update={"elapsed_seconds": 31.0})
    prepared.persist()
    with trio.fail_after(20):
        outcome = await run_campaign(RunRequest(config, resume_run=prepared.run.run_id))
    report = outcome.report
    assert report is not None and report.status == "budget_limited"
    assert report.campaign_status == "paused" and report.decisions == ()


async def test_a_run_going_on_in_another_process_cannot_be_resumed(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:1"})
    config = toy_config(paths)
    first = await _interrupted_at_once(config)
    assert first.report is not None and first.run_dir is not None
    layout = StoreLayout(paths["store"])
    before = (first.run_dir / "run.json").read_bytes()
    holder = Journal(first.run_dir / "journal.jsonl")  # as the live run holds it
    try:
        with pytest.raises(InputError, match="going on in another process"):
            await _run(RunRequest(config, resume_run=first.report.run_id))
    finally:
        holder.close()
    assert (first.run_dir / "run.json").read_bytes() == before
    resumed = (await _run(RunRequest(config, resume_run=first.report.run_id))).report
    assert resumed is not None and load_run(layout, resumed.run_id).status == resumed.status


async def test_a_rejudge_is_not_charged_for_the_replays_it_reuses(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:8"})
    replay = usage_replay(tmp_path)
    config = toy_config(paths, replay=replay, iterations=1, population=1)
    original = (await _run(RunRequest(config))).report
    assert original is not None and (original.budget.spent.tokens or 0) >= 100 * 12
    rejudged = (await _run(RunRequest(config, rerun_from=original.run_id))).report
    assert rejudged is not None and rejudged.status == "finished"
    assert not rejudged.budget.spent.tokens and not rejudged.budget.spent.cost_usd
    assert [d.decision for d in rejudged.decisions] == [d.decision for d in original.decisions]


async def _published_first_cycle(
    tmp_path: Path, action: str
) -> tuple[dict[str, Path], CampaignConfig, Report]:
    """A two-cycle publishing campaign over the toy (8 test cases) whose first cycle ran
    ``action``, confirmed its best and published it."""
    paths = write_toy(tmp_path, {"default": action}, test=8)
    config = publishing_config(paths, PASSING_CHECK, max_improvement_cycles=2)
    first = (await _run(RunRequest(config))).report
    assert first is not None and first.apply is not None and first.apply.status == "applied"
    return paths, config, first


async def test_a_later_cycles_best_is_confirmed_against_what_the_target_holds(
    tmp_path: Path,
) -> None:
    # Found by review: a later cycle confirmed its best against the seed, yet a publish
    # replaces what an earlier cycle published; a tree no better than that one (here: one
    # that fits val alone on top of it) was confirmed on the earlier one's gains and replaced
    # it. Now it is tested against the published tree.
    paths, config, first = await _published_first_cycle(tmp_path, "fix:2")
    layout = StoreLayout(paths["store"])
    paths["plan"].write_text(json.dumps({"default": "overfit:2"}))  # val only, on top of it
    second = (await _run(RunRequest(config, resume_campaign=first.campaign_id))).report
    assert second is not None and second.selected is not None and second.best != first.best
    confirmation = second.confirmation
    assert confirmation is not None and confirmation.against == "published"
    assert confirmation.decision == "unconfirmed", confirmation.sentence
    assert "an earlier cycle published" in confirmation.sentence
    assert target_tree(layout.blobs(), paths["target"]) == first.best  # the better one stays
    assert load_campaign(layout, first.campaign_id).applied_ref == first.best


async def test_a_best_confirmed_in_an_earlier_cycle_is_not_called_unconfirmed(
    tmp_path: Path,
) -> None:
    # Found by review: cycle 1 confirmed and published T1; cycle 2 (best still T1) stopped on
    # its wall clock before confirming anything, and reported T1 "unconfirmed".
    paths, config, first = await _published_first_cycle(tmp_path, "fix:8")
    paths["plan"].write_text(json.dumps({"default": "hang"}))
    stopped = config.model_copy(update={"wall_clock_budget": 8.0, "kill_grace": 0.2})
    second = (await _run(RunRequest(stopped, resume_campaign=first.campaign_id), 120)).report
    assert second is not None and second.status == "budget_limited"
    assert second.best == first.best and second.confirmation is None
    assert second.apply is None or second.apply.status != "unconfirmed", second.apply


# -- 5. a run's end and the campaign state it leaves are one step ----------------------------


class _Crash(Exception):
    """The process dying at a chosen write (the writes after it never happen)."""


def _crash_on(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """Make `end_run`'s call of ``name`` (``save_run`` or ``save_campaign``) crash."""

    def crash(*_args: object) -> None:
        raise _Crash(name)

    monkeypatch.setattr(_runs, name, crash)


async def _crashed_first_cycle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: str
) -> tuple[CampaignConfig, StoreLayout, str, str]:
    """A two-cycle publishing campaign (confirming, spending tokens) whose first run crashed
    at ``at`` while recording its end: its config, layout, campaign id and run id."""
    paths = write_toy(tmp_path, {"default": "fix:8"}, test=8)
    config = publishing_config(
        paths, PASSING_CHECK, max_improvement_cycles=2, replay=usage_replay(tmp_path)
    )
    _crash_on(monkeypatch, at)
    with pytest.RaisesGroup(_Crash, allow_unwrapped=True, flatten_subgroups=True):
        await _run(RunRequest(config))
    monkeypatch.undo()
    layout = StoreLayout(paths["store"])
    (campaign_id,) = layout.campaign_ids()
    (run_id,) = layout.run_ids()
    return config, layout, campaign_id, run_id


async def test_a_crash_after_a_runs_end_loses_nothing_the_campaign_carries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # run.json said finished while campaign.json still held the state before the cycle: the
    # next cycle ran as cycle 0 again, with the spend, the confirmation's share of alpha and
    # the published tree forgotten (the target held it, the campaign did not know).
    config, layout, campaign_id, run_id = await _crashed_first_cycle(
        tmp_path, monkeypatch, "save_campaign"
    )
    first = Report.model_validate_json((layout.run_dir(run_id) / "report.json").read_bytes())
    assert load_run(layout, run_id).status == "finished" and first.apply is not None
    assert first.apply.status == "applied" and first.confirmations is not None
    campaign = load_campaign(layout, campaign_id)
    assert campaign.cycles == 1 and campaign.applied_ref == first.best
    assert campaign.spent == first.budget.campaign_spent and (campaign.spent.tokens or 0) > 0
    assert campaign.confirmations == first.confirmations
    second = (await _run(RunRequest(config, resume_campaign=campaign_id))).report
    assert second is not None and second.cycle == 1
    assert (second.budget.campaign_spent.tokens or 0) > (first.budget.campaign_spent.tokens or 0)
    assert not (layout.campaign_file(campaign_id).parent / "campaign.next.json").exists()


async def test_a_crash_before_a_runs_end_leaves_a_run_that_a_resume_ends_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, layout, campaign_id, run_id = await _crashed_first_cycle(
        tmp_path, monkeypatch, "save_run"
    )
    assert load_run(layout, run_id).status == "interrupted"  # the staged state is not read
    assert load_campaign(layout, campaign_id).cycles == 0
    resumed = (await _run(RunRequest(config, resume_run=run_id))).report
    assert resumed is not None and resumed.status == "finished"
    campaign = load_campaign(layout, campaign_id)
    assert campaign.cycles == 1 and campaign.spent == resumed.budget.campaign_spent


async def test_a_confirmation_verdict_its_p_value_does_not_earn_is_refused(tmp_path: Path) -> None:
    # Found by review: editing one word of campaign.json ("reject" -> "accept") made the next
    # cycle keep the earlier "verdict" of a tree its test split never confirmed, and publish it.
    paths = write_toy(tmp_path, {"default": "overfit:2"}, test=8)
    config = publishing_config(paths, PASSING_CHECK, max_improvement_cycles=2)
    first = (await _run(RunRequest(config))).report
    assert first is not None and first.confirmation is not None
    assert first.confirmation.decision == "unconfirmed"
    layout = StoreLayout(paths["store"])
    where = layout.campaign_file(first.campaign_id)
    stored = json.loads(where.read_text())
    (test,) = stored["confirmations"]["tests"]
    assert test["decision"] == "reject" and test["p_value"] > test["level"]
    test["decision"] = "accept"
    where.write_text(json.dumps(stored))
    with pytest.raises(InputError, match="recorded as accepted, but its p-value"):
        await _run(RunRequest(config, resume_campaign=first.campaign_id))
