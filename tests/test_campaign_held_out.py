"""A test split reused by new campaigns (README "Confirm before publish"): each campaign
bounds its own no-gain publish at alpha, but a new campaign on the same cases confirms at a
fresh alpha; the store's ledger records every confirmation against the split's digest and a
later campaign's preflight says how often the split confirmed before, with the union bound."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import trio

from evolane.campaign._held_out import (
    LEDGER_FOLDER,
    REUSED,
    ConfirmUse,
    held_out_digest,
    ledger_file,
    read_uses,
    record_use,
)
from evolane.campaign._run import RunOutcome, RunRequest, run_campaign
from evolane.inputs import Case, Dataset, case_json, load_dataset
from tests.campaign_helpers import toy_config, write_toy


async def _run(request: RunRequest) -> RunOutcome:
    with trio.fail_after(120):  # a guard against a hang, not a timing figure
        return await run_campaign(request)


def _reused(outcome: RunOutcome) -> list[str]:
    return [line for line in outcome.estimate.preflight if line.startswith("test split reused")]


async def test_a_new_campaign_on_a_used_test_split_is_told_how_often_it_confirmed(
    tmp_path: Path,
) -> None:
    paths = write_toy(tmp_path, {"default": "overfit:8"})  # accepted on val, unconfirmed
    config = toy_config(paths, iterations=1, population=1, apply="verified_only")
    first = await _run(RunRequest(config))
    assert first.report is not None and first.report.confirmation is not None
    assert _reused(first) == []  # the split's first confirmation
    digest = held_out_digest(load_dataset(paths["dataset"]))
    assert digest is not None
    store = Path(config.store)
    ledger = read_uses(store, digest)
    assert ledger is not None and ledger.cases == 6 and len(ledger.uses) == 1
    assert ledger.uses[0].campaign_id == first.report.campaign_id
    assert not ledger.uses[0].confirmed and ledger.uses[0].level == 0.05

    second = await _run(RunRequest(config))  # a new campaign on the same cases
    assert second.report is not None and second.report.campaign_id != first.report.campaign_id
    (line,) = _reused(second)
    assert "these 6 test cases ran 1 earlier confirmation(s)" in line
    assert "(0 confirmed; " + first.report.campaign_id in line
    assert "up to 0.1;" in line  # 0.05 spent before, 0.05 now
    words = second.report.error_control  # the report's bound is qualified: it is one campaign's
    assert words.startswith("confirm before publish") and words.endswith("; but " + line)
    assert first.report.error_control.startswith("confirm before publish")
    assert REUSED not in first.report.error_control
    stored = json.loads(ledger_file(store, digest).read_text())
    assert [use["campaign_id"] for use in stored["uses"]] == [
        first.report.campaign_id,
        second.report.campaign_id,
    ]


def test_a_confirmation_is_recorded_once_and_a_damaged_ledger_is_left_alone(
    tmp_path: Path,
) -> None:
    use = ConfirmUse(
        campaign_id="c1", run_id="r1", tree="tree-ab", level=0.05, p_value=0.2, confirmed=False
    )
    record_use(tmp_path, "sha256:00ff", 6, use)
    record_use(tmp_path, "sha256:00ff", 6, use.model_copy(update={"run_id": "r2"}))  # a resume
    ledger = read_uses(tmp_path, "sha256:00ff")
    assert ledger is not None and [u.run_id for u in ledger.uses] == ["r1"]
    path = ledger_file(tmp_path, "sha256:00ff")
    path.write_text("{not json")
    record_use(tmp_path, "sha256:00ff", 6, use.model_copy(update={"campaign_id": "c2"}))
    assert path.read_text() == "{not json" and read_uses(tmp_path, "sha256:00ff") is None


async def test_a_ledger_that_cannot_be_written_does_not_fail_the_run(tmp_path: Path) -> None:
    # Found by review: the ledger is advice, but a store whose test-splits folder could not
    # be made or written (here a file in its way; a folder of another user, a full disk)
    # failed the run at its end, before its report, with a traceback.
    paths = write_toy(tmp_path, {"default": "overfit:8"})
    config = toy_config(paths, iterations=1, population=1, apply="verified_only")
    store = Path(config.store)
    store.mkdir(parents=True, exist_ok=True)
    (store / LEDGER_FOLDER).write_text("in the way")
    outcome = await _run(RunRequest(config))
    assert outcome.report is not None and outcome.report.confirmation is not None
    assert (store / LEDGER_FOLDER).read_text() == "in the way"


def test_the_split_digest_is_of_the_test_rows_alone_in_file_order() -> None:
    # The digest names the ledgers earlier campaigns wrote: it is the sha256 of the test
    # cases' canonical rows in file order, whatever the other splits hold, and none without
    # test cases (it is now read from the rows, no case built).
    def cases(val_input: str) -> list[Case]:
        return [
            Case(id="t1", input={"q": 1}, expected_output=1, split="test"),
            Case(id="v1", input={"q": val_input}, split="val"),
            Case(id="t2", input={"q": 2}, split="test", metadata={"cluster": "a"}),
        ]

    first, second = Dataset(cases("x")), Dataset(cases("y"))
    rows = [case_json(case) for case in cases("x") if case.split == "test"]
    expected = "sha256:" + hashlib.sha256(b"\n".join(rows)).hexdigest()
    assert held_out_digest(first) == held_out_digest(second) == expected
    assert list(first.split_rows("test")) == rows
    assert held_out_digest(Dataset(cases("x")[1:2])) is None
