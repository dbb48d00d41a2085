"""``--test-budget store`` (README "Confirm before publish"): the campaigns of a store on one
test split share its alpha. Share k of the split confirms at alpha / (k (k + 1)), reserved in
the split's ledger before the run's record names it, kept by a resumed campaign, given back
by one that never reaches a confirmation; another test split has a budget of its own."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from evolane.campaign._config import CampaignConfig
from evolane.campaign._held_out import REUSED, ConfirmUse, held_out_digest, read_uses, record_use
from evolane.campaign._report import Report
from evolane.campaign._run import RunOutcome, RunRequest, run_campaign
from evolane.campaign._shares import ShareBook
from evolane.campaign._test_budget import peek_split, reserve_split
from evolane.inputs import InputError, load_dataset
from tests.campaign_helpers import toy_config, toy_flags, wait_for, write_toy

ALPHA = 0.05
SHARE_WORDS = (
    "this campaign's share of the test split's error budget: over all campaigns on these "
    "test cases in this store, a no-gain publish has probability at most 0.05"
)
EVOLANE = [sys.executable, "-m", "evolane"]


async def _run(request: RunRequest) -> RunOutcome:
    with trio.fail_after(120):  # a guard against a hang, not a timing figure
        return await run_campaign(request)


def _level(k: int) -> float:
    return ALPHA / (k * (k + 1))


def _config(paths: dict[str, Path], store: Path, **overrides: object) -> CampaignConfig:
    """One iteration of one slot, confirmed before it is kept, on the split's budget."""
    settings = {"iterations": 1, "population": 1, "apply": "verified_only"}
    settings |= {"test_budget": "store", "store": str(store), **overrides}
    return toy_config(paths, **settings)


def _book(store: Path, dataset: Path) -> ShareBook:
    digest = held_out_digest(load_dataset(dataset))
    assert digest is not None
    ledger = read_uses(store, digest)
    assert ledger is not None and ledger.budget is not None
    return ledger.budget


def _shares(store: Path, dataset: Path) -> dict[str, tuple[int, str]]:
    return {held.job_id: (held.index, held.state) for held in _book(store, dataset).shares}


async def test_the_kth_store_campaign_of_a_split_confirms_at_share_k_another_split_has_its_own(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path / "a", {"default": "overfit:8"})  # accepted on val: tested
    store = tmp_path / "store"
    levels = []
    for k in (1, 2, 3):
        report = (await _run(RunRequest(_config(paths, store)))).report
        assert report is not None and report.confirmation is not None
        assert report.confirmation.level == pytest.approx(_level(k))
        assert report.config.error_budget == pytest.approx(_level(k))
        assert SHARE_WORDS in report.error_control
        assert REUSED not in report.error_control  # the bound is not this campaign's alone
        levels.append(report.confirmation.level)
    assert sum(levels) <= ALPHA
    shares = _shares(store, paths["dataset"])
    assert sorted(shares.values()) == [(1, "spent"), (2, "spent"), (3, "spent")]

    other = write_toy(tmp_path / "b", {"default": "overfit:8"}, test=7)  # other test cases
    report = (await _run(RunRequest(_config(other, store)))).report
    assert report is not None and report.confirmation is not None
    assert report.confirmation.level == pytest.approx(_level(1))
    assert list(_shares(store, other["dataset"]).values()) == [(1, "spent")]
    assert len(_shares(store, paths["dataset"])) == 3  # the first split's budget untouched


async def test_a_store_campaign_after_confirmations_outside_the_budget_says_so(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "overfit:8"})
    store = tmp_path / "store"
    outside = (await _run(RunRequest(_config(paths, store, test_budget="campaign")))).report
    assert outside is not None and outside.confirmation is not None
    assert outside.confirmation.level == ALPHA
    report = (await _run(RunRequest(_config(paths, store)))).report
    assert report is not None and report.confirmation is not None
    assert report.confirmation.level == pytest.approx(_level(1))  # no share was taken before
    words = report.error_control
    assert SHARE_WORDS in words and "bounds only its own" not in words
    assert f"; but {REUSED} outside the budget: 1 earlier confirmation(s)" in words
    assert outside.campaign_id in words and words.endswith(
        "up to 0.1"
    )  # the budget 0.05 and 0.05 outside
    later = (await _run(RunRequest(_config(paths, store, test_budget="campaign")))).report
    assert later is not None  # a campaign outside the budget is told of every confirmation
    assert "ran 2 confirmation(s) (0 confirmed" in later.error_control
    assert "up to 0.12;" in later.error_control  # 0.05 + 0.025 before, 0.05 now


async def test_a_store_campaign_is_told_of_an_uncontrolled_look_which_holds_no_share(
    tmp_path: Path,
) -> None:
    # A --error-control none run scored the test split with no level: it takes no share of
    # the budget, but a store campaign on the same cases is told its scores were seen.
    paths = write_toy(tmp_path, {"default": "overfit:8"})
    store = tmp_path / "store"
    none = _config(paths, store, error_control="none", apply="proposal")
    looked = (await _run(RunRequest(none))).report
    assert looked is not None and looked.scores.best_test is not None
    report = (await _run(RunRequest(_config(paths, store)))).report
    assert report is not None and report.confirmation is not None
    assert report.confirmation.level == pytest.approx(_level(1))  # the look took no share
    assert _shares(store, paths["dataset"]) == {report.campaign_id: (1, "spent")}
    assert report.error_control.endswith(
        f"; but {REUSED} outside the budget: 1 uncontrolled look(s) ({looked.campaign_id}): "
        "scores seen at no level: a tree picked on them is not confirmed by them"
    )


def _uses(store: Path, dataset: Path) -> tuple[ConfirmUse, ...]:
    digest = held_out_digest(load_dataset(dataset))
    assert digest is not None
    ledger = read_uses(store, digest)
    assert ledger is not None
    return ledger.uses


async def _paused(tmp_path: Path) -> tuple[dict[str, Path], CampaignConfig, Report]:
    """A store campaign of two cycles whose first chose no best: paused, holding share 1."""
    paths = write_toy(tmp_path, {"default": "noop"})  # nothing accepted: the seed is the best
    config = _config(paths, tmp_path / "store", max_improvement_cycles=2)
    first = (await _run(RunRequest(config))).report
    assert first is not None and first.confirmation is None
    assert first.campaign_status == "paused"  # it may go on: it keeps its share
    return paths, config, first


async def test_a_campaign_that_never_reaches_a_confirmation_gives_its_share_back(
    tmp_path: Path,
) -> None:
    paths, config, first = await _paused(tmp_path)
    store = Path(config.store)
    assert _shares(store, paths["dataset"]) == {first.campaign_id: (1, "reserved")}
    last = (await _run(RunRequest(config, resume_campaign=first.campaign_id))).report
    assert last is not None and last.campaign_status == "complete"
    book = _book(store, paths["dataset"])
    assert book.shares == () and book.released == 1  # ended without a confirmation
    # its seed, the best of each cycle, was scored on the test split: an uncontrolled look
    # is recorded, and having no level it spends no share
    assert [(use.campaign_id, use.level) for use in _uses(store, paths["dataset"])] == [
        (first.campaign_id, None)
    ]
    paths["plan"].write_text(json.dumps({"default": "overfit:8"}))
    report = (await _run(RunRequest(_config(paths, store)))).report
    assert report is not None and report.confirmation is not None
    assert report.confirmation.level == pytest.approx(_level(1))  # the share given back


async def test_a_campaign_whose_test_measurement_began_never_gives_its_share_back(
    tmp_path: Path,
) -> None:
    # A look at the test split spends the share whether or not a verdict followed: a run
    # killed during its test measurement (the ledger's unfinished entry) and a campaign
    # that then ended without a recorded confirmation gave the share back before.
    paths, config, first = await _paused(tmp_path)
    store = Path(config.store)
    digest = held_out_digest(load_dataset(paths["dataset"]))
    assert digest is not None
    began = ConfirmUse(
        campaign_id=first.campaign_id, run_id=first.run_id, tree="tree-" + "a" * 32,
        level=_level(1), p_value=1.0, confirmed=False, finished=False,
    )  # fmt: skip
    record_use(store, digest, 6, began)
    last = (await _run(RunRequest(config, resume_campaign=first.campaign_id))).report
    assert last is not None and last.campaign_status == "complete"
    assert _shares(store, paths["dataset"]) == {first.campaign_id: (1, "spent")}


async def test_a_continued_campaign_keeps_its_share_and_cannot_leave_the_budget(
    tmp_path: Path,
) -> None:
    paths, config, first = await _paused(tmp_path)
    store = Path(config.store)
    paths["plan"].write_text(json.dumps({"default": "overfit:8"}))
    between = (await _run(RunRequest(_config(paths, store)))).report  # takes share 2
    assert between is not None and between.confirmation is not None
    assert between.confirmation.level == pytest.approx(_level(2))
    outside = config.model_copy(update={"test_budget": "campaign"})
    with pytest.raises(InputError, match=r"the test_budget changed \('store' -> 'campaign'\)"):
        await _run(RunRequest(outside, resume_campaign=first.campaign_id))
    report = (await _run(RunRequest(config, resume_campaign=first.campaign_id))).report
    assert report is not None and report.confirmation is not None
    assert report.config.error_budget == pytest.approx(_level(1))  # its own share, not a 3rd
    assert report.confirmation.level == pytest.approx(_level(1))
    assert _shares(store, paths["dataset"]) == {
        first.campaign_id: (1, "spent"),
        between.campaign_id: (2, "spent"),
    }


def _cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVOLANE, *args], capture_output=True, text=True, timeout=600, check=False
    )  # a guard against a hang, not a timing figure


def test_a_killed_run_resumes_at_its_share(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "hang"})
    store = tmp_path / "store"
    flags = [*toy_flags(paths, store), "--iterations", "1", "--population", "1"]
    flags += ["--test-budget", "store", "--apply", "verified_only", "--optimizer-timeout", "300"]
    process = subprocess.Popen(
        [*EVOLANE, "optimize", *flags], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        wait_for(store / "runs", process, "the run began")
        (run_dir,) = (store / "runs").iterdir()
        wait_for(run_dir / "run.json", process, "the run was recorded")
        wait_for(run_dir / "events.jsonl", process, "the run started")
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    stored = json.loads((run_dir / "run.json").read_text())
    assert stored["status"] == "running" and stored["config"]["error_budget"] == _level(1)
    killed = stored["campaign_id"]
    assert _shares(store, paths["dataset"]) == {killed: (1, "reserved")}  # before it was used
    paths["plan"].write_text(json.dumps({"default": "overfit:8"}))
    between = _cli(["optimize", *flags])  # a new campaign meanwhile: the next share
    assert between.returncode == 0, between.stderr
    resumed = _cli(["optimize", "--resume", run_dir.name, "--store", str(store)])
    assert resumed.returncode == 0, resumed.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert report["resumed"] == 1 and report["confirmation"]["level"] == _level(1)
    shares = _shares(store, paths["dataset"])
    assert shares[killed] == (1, "spent") and len(shares) == 2
    assert sorted(shares.values()) == [(1, "spent"), (2, "spent")]


def test_the_estimate_says_the_level_and_bad_input_is_one_line(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "overfit:8"})
    store = tmp_path / "store"
    flags = [*toy_flags(paths, store), "--iterations", "1", "--population", "1"]
    done = _cli(["optimize", *flags, "--test-budget", "store", "--apply", "verified_only"])
    assert done.returncode == 0, done.stderr
    before = _shares(store, paths["dataset"])
    shown = _cli(["estimate", *flags, "--test-budget", "store", "--json"])
    assert shown.returncode == 0, shown.stderr
    (line,) = [ln for ln in json.loads(shown.stdout)["preflight"] if ln.startswith("test budget")]
    assert "share 2 of these 6 test cases' error budget 0.05 in this store" in line
    assert "this campaign confirms at level 0.0083" in line
    assert _shares(store, paths["dataset"]) == before  # an estimate reserves nothing
    (tmp_path / "evolane.toml").write_text('test-budget = "store"\n')
    settings = _cli(
        ["config", "show", *flags, "--config", str(tmp_path / "evolane.toml"), "--json"]
    )
    assert settings.returncode == 0, settings.stderr
    shown_setting = json.loads(settings.stdout)["settings"]["test_budget"]
    assert shown_setting == {"value": "store", "source": f"{tmp_path}/evolane.toml:1"}
    bad = _cli(["optimize", *flags, "--test-budget", "foo"])
    assert bad.returncode == 2
    assert bad.stderr.strip() == "evolane: error: --test-budget foo: choose from campaign, store"
    (ledger,) = (store / "test-splits").glob("*.json")
    ledger.write_text("{not json")  # its shares cannot be read: no run without one
    damaged = _cli(["estimate", *flags, "--test-budget", "store"])
    assert damaged.returncode == 2 and len(damaged.stderr.strip().splitlines()) == 1
    assert f"the test split's ledger {ledger} cannot be read" in damaged.stderr


async def test_two_campaigns_starting_at_once_on_one_split_take_two_shares(tmp_path: Path) -> None:
    store = tmp_path / "store"
    paths = [write_toy(tmp_path / name, {"default": "overfit:8"}) for name in "ab"]
    reports = []

    async def one(config: CampaignConfig) -> None:
        reports.append((await _run(RunRequest(config))).report)

    async with trio.open_nursery() as nursery:  # both peek share 1; the ledger's lock decides
        for each in paths:
            nursery.start_soon(one, _config(each, store))
    levels = sorted(
        report.confirmation.level for report in reports if report and report.confirmation
    )
    assert levels == pytest.approx([_level(2), _level(1)])
    assert sorted(_shares(store, paths[0]["dataset"]).values()) == [(1, "spent"), (2, "spent")]
    for report in reports:
        assert report is not None and report.config.error_budget == report.confirmation.level


def test_a_stale_peek_reserves_the_next_share_and_a_holder_keeps_its_own(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "noop"})
    config = _config(paths, tmp_path / "store")
    dataset = load_dataset(paths["dataset"])
    store = Path(config.store)
    first, second = (peek_split(store, dataset, name, config) for name in ("c-1", "c-2"))
    assert first is not None and second is not None
    assert first.share.index == second.share.index == 1  # nothing reserved yet
    assert reserve_split(store, first, "c-1").share.index == 1
    taken = reserve_split(store, second, "c-2")  # it peeked before c-1 reserved
    assert taken.share.index == 2 and taken.level == pytest.approx(_level(2))
    again = reserve_split(store, second, "c-2")  # a resumed holder: the same share
    assert again.share == taken.share and again.others == 1
    assert _shares(store, paths["dataset"]) == {"c-1": (1, "reserved"), "c-2": (2, "reserved")}


@given(reached=st.lists(st.booleans(), max_size=60), alpha=st.floats(1e-4, 0.5))
def test_the_kth_campaign_to_reach_the_split_confirms_at_alpha_over_k_k_plus_1(
    reached: list[bool], alpha: float
) -> None:
    """Campaigns one after another, each reaching the test split or not: a campaign that
    did not gives its share back, so the k-th to reach it holds share k, and the levels
    spent never sum above alpha (the arithmetic is the evolve service's: its property tests
    run every order of starts, ends and resumes)."""
    book, levels = ShareBook(alpha=alpha), []
    for number, reaches in enumerate(reached):
        book, held = book.reserve(f"c-{number}", alpha)
        if reaches:
            k = len(levels) + 1
            assert held.index == k and held.level == pytest.approx(alpha / (k * (k + 1)))
            levels.append(held.level)
        book = book.settle(f"c-{number}", reaches)
    assert sum(levels) <= alpha * (1 + 1e-9) and book.spent == pytest.approx(sum(levels))
    assert book.released == reached.count(False)
