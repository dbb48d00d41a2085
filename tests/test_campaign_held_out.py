"""A test split reused by new campaigns (README "Confirm before publish"): each campaign
bounds its own no-gain publish at alpha, but a new campaign on the same cases confirms at a
fresh alpha; the store's ledger records every confirmation against the split's digest and a
later campaign's preflight says how often the split confirmed before, with the union bound."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import trio

from evolane.campaign._held_out import (
    LEDGER_FOLDER,
    LINE_ROOM,
    ONLINE_USE,
    REUSED,
    ConfirmUse,
    held_out_digest,
    ledger_file,
    online_reuse_note,
    read_uses,
    record_use,
    reuse_note,
    val_digest,
)
from evolane.campaign._run import RunOutcome, RunRequest, run_campaign
from evolane.inputs import Case, Dataset, case_json, load_dataset
from tests.campaign_helpers import run_optimize, toy_config, toy_flags, with_flag, write_toy


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
    assert "these 6 test cases ran 1 confirmation(s)" in line
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


def _holding_replay(log: Path, hold: Path) -> str:
    """The toy's replay, recording each unit to ``log`` and, while ``hold`` exists, hanging
    on the test cases (a test measurement begun, cut short by the kill)."""
    wait = f'case "$EVOLANE_CASE_ID" in test*) if [ -e {hold} ]; then sleep 600; fi;; esac; '
    return (
        f'sh -c \'echo "$EVOLANE_UNIT" >> {log}; {wait}cat "$1/$EVOLANE_CASE_ID" > '
        '"$2/output.json"\' replay {candidate} {output_dir}'
    )


def _measuring(store: Path, measurement: str) -> bool:
    events = list(store.glob("runs/*/events.jsonl"))
    return bool(events) and f'"{measurement}"' in events[0].read_text()


def _killed_measuring(flags: list[str], store: Path, measurement: str) -> Path:
    """Start ``evolane optimize`` with ``flags``, SIGKILL it once ``measurement`` began; its
    run's folder."""
    process = subprocess.Popen(
        [sys.executable, "-m", "evolane", "optimize", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 300  # a guard against a hang, not a timing figure
        while not _measuring(store, measurement):
            assert process.poll() is None, f"the run ended before {measurement}"
            assert time.monotonic() < deadline, f"{measurement} never began"
            time.sleep(0.05)
    finally:
        os.kill(process.pid, signal.SIGKILL)
        process.wait(timeout=60)
    (run_dir,) = (store / "runs").iterdir()
    return run_dir


def _started_over(flags: list[str], store: Path, hold: Path, killed: str) -> str:
    """The error control of a new campaign run with ``flags`` once ``hold`` is gone (a user
    starting over after the kill: told of the look, charged its level)."""
    hold.unlink()
    again = run_optimize(flags)
    assert again.returncode == 0, again.stderr
    report = json.loads(next(p for p in (store / "runs").glob("*/report.json")).read_text())
    assert report["campaign_id"] != killed
    return report["error_control"]


def _held_at_test(tmp_path: Path) -> tuple[dict[str, Path], Path, Path, list[str]]:
    """The toy (one slot, accepted on val: its best is scored on the test split) with a
    replay that hangs on the test cases while the returned ``hold`` file exists: its paths,
    store, ``hold`` and ``evolane optimize`` flags."""
    paths = write_toy(tmp_path, {"default": "overfit:8"})
    store, logs = tmp_path / "store", tmp_path / "logs"
    logs.mkdir()
    log, hold = logs / "replays.log", logs / "hold"
    hold.touch()
    flags = [*toy_flags(paths, store, log=log), "--iterations", "1", "--population", "1"]
    return paths, store, hold, with_flag(flags, "--replay", _holding_replay(log, hold))


def test_a_run_killed_during_its_test_measurement_has_spent_the_split(tmp_path: Path) -> None:
    # Found by review: the ledger recorded a confirmation only at the run's end, so a user
    # who killed a run whose test measurement was going badly and started over confirmed
    # on the same test cases at a fresh alpha, and no preflight said so.
    paths, store, hold, flags = _held_at_test(tmp_path)
    flags = with_flag(flags, "--apply", "verified_only")
    run_dir = _killed_measuring(flags, store, "c0.final.test")
    killed = json.loads((run_dir / "run.json").read_text())["campaign_id"]
    digest = held_out_digest(load_dataset(paths["dataset"]))
    assert digest is not None
    ledger = read_uses(store, digest)  # journaled before the first test replay
    assert ledger is not None and [(u.campaign_id, u.finished) for u in ledger.uses] == [
        (killed, False)
    ]
    assert ledger.uses[0].level == 0.05 and not ledger.uses[0].confirmed

    assert (
        f"these 6 test cases ran 1 confirmation(s) (0 confirmed, 1 cut short; {killed}); "
        "each bounds only its own no-gain publish at 0.05, all of them up to 0.1;"
    ) in _started_over(flags, store, hold, killed)


def test_a_test_measurement_that_began_is_replaced_by_its_verdict_never_the_reverse(
    tmp_path: Path,
) -> None:
    began = ConfirmUse(
        campaign_id="c-1", run_id="r-1", tree="tree-a", level=0.05, p_value=1.0,
        confirmed=False, finished=False,
    )  # fmt: skip
    verdict = began.model_copy(update={"p_value": 0.01, "confirmed": True, "finished": True})
    record_use(tmp_path, "sha256:ab", 6, began)
    record_use(tmp_path, "sha256:ab", 6, began)  # a resume begins it again: one entry
    record_use(tmp_path, "sha256:ab", 6, verdict)  # the resumed run's verdict replaces it
    record_use(tmp_path, "sha256:ab", 6, began)  # a later begin never hides the verdict
    ledger = read_uses(tmp_path, "sha256:ab")
    assert ledger is not None and ledger.uses == (verdict,)


def _hanging_on_a_second_replay(log: Path, hold: Path) -> str:
    """The toy's replay, recording each case id to ``log`` and, while ``hold`` exists,
    hanging on a case replayed before (the candidate's val replays after its parent's)."""
    wait = f'if [ -e {hold} ] && grep -qx "$EVOLANE_CASE_ID" {log}; then sleep 600; fi; '
    return (
        f'sh -c \'{wait}echo "$EVOLANE_CASE_ID" >> {log}; cat "$1/$EVOLANE_CASE_ID" > '
        '"$2/output.json"\' replay {candidate} {output_dir}'
    )


def test_an_online_run_killed_measuring_its_first_candidate_has_spent_the_val_split(
    tmp_path: Path,
) -> None:
    # The online counterpart: the val split's ledger was written at the run's end only.
    paths = write_toy(tmp_path, {"default": "overfit:8"}, test=0)  # online control
    store, logs = tmp_path / "store", tmp_path / "logs"
    logs.mkdir()
    log, hold = logs / "cases.log", logs / "hold"
    log.touch()
    hold.touch()
    flags = [*toy_flags(paths, store, log=log), "--iterations", "1", "--population", "1"]
    flags = with_flag(flags, "--replay", _hanging_on_a_second_replay(log, hold))
    run_dir = _killed_measuring(flags, store, "c0.i0.s0")
    killed = json.loads((run_dir / "run.json").read_text())["campaign_id"]
    ledger = read_uses(store, val_digest(load_dataset(paths["dataset"])))
    assert ledger is not None and [(u.campaign_id, u.finished) for u in ledger.uses] == [
        (killed, False)
    ]
    assert (
        f"val split reused: these 12 val cases decided 1 earlier online campaign(s) ({killed}, "
        "1 cut short); each bounds only its own no-gain accept at 0.05: over all of them up to "
        "0.1;"
    ) in _started_over(flags, store, hold, killed)


def _earlier(store: Path, digest: str, campaign: str, tree: str) -> None:
    use = ConfirmUse(
        campaign_id=campaign,
        run_id="r-" + campaign,
        tree=tree,
        level=0.05,
        p_value=0.3,
        confirmed=False,
    )
    record_use(store, digest, 16, use)


def test_a_reused_split_line_keeps_its_advice_within_a_preflight_line(tmp_path: Path) -> None:
    # Found by README review: the line was cut at 256 characters, a preflight line's room,
    # and with one campaign id of evolane's own form its advice ("--test-budget store") was
    # lost, in the live view and in the report's error control alike.
    ids = [f"c-20261206-15162{n}-d99af{n}" for n in range(4)]
    paths = write_toy(tmp_path / "confirm", {})
    dataset = load_dataset(paths["dataset"])
    digest = held_out_digest(dataset)
    assert digest is not None
    for campaign in ids:
        _earlier(tmp_path, digest, campaign, "tree-ab")
        line = reuse_note(tmp_path, dataset, "c-new", toy_config(paths))
        assert line is not None and len(line) <= LINE_ROOM, line
        assert line.endswith("add fresh test cases, or share one bound with --test-budget store")
        assert campaign in line  # the newest earlier campaign is named, the others counted
    assert "(+3)" in line and "all of them up to 0.25;" in line

    paths = write_toy(tmp_path / "online", {}, test=0)  # no test split: online control
    dataset = load_dataset(paths["dataset"])
    for campaign in ids:
        _earlier(tmp_path, val_digest(dataset), campaign, ONLINE_USE)
        line = online_reuse_note(tmp_path, dataset, "c-new", toy_config(paths))
        assert line is not None and len(line) <= LINE_ROOM, line
        assert line.endswith("add fresh val cases, or go on with --resume-campaign")
        assert campaign in line


def _look(ledger_uses: tuple[ConfirmUse, ...]) -> list[tuple[str, float | None, bool]]:
    return [(use.campaign_id, use.level, use.finished) for use in ledger_uses]


def test_a_confirmation_after_a_none_run_on_the_same_cases_names_its_look(
    tmp_path: Path,
) -> None:
    # Found by review: --error-control none measured its best on the test split and showed
    # the scores, but wrote no ledger entry, so a user who picked a best from them and
    # confirmed it on the same cases got a fresh alpha and no reused-split line.
    paths = write_toy(tmp_path, {"default": "overfit:8"})  # accepted on val
    store = tmp_path / "store"
    flags = [*toy_flags(paths, store), "--iterations", "1", "--population", "1"]
    looked = run_optimize([*flags, "--error-control", "none"])
    assert looked.returncode == 0, looked.stderr
    (first,) = [json.loads(p.read_text()) for p in store.glob("runs/*/report.json")]
    assert first["scores"]["best_test"] is not None  # the test split was scored and shown
    digest = held_out_digest(load_dataset(paths["dataset"]))
    assert digest is not None
    ledger = read_uses(store, digest)
    assert ledger is not None and _look(ledger.uses) == [(first["campaign_id"], None, True)]
    assert ledger.uses[0].tree == "tree-" + first["best"]["digest"].split(":")[1][:32]
    # a re-judge of that run scores the test split again, with no confirmation either
    rerun = ["--from-run", first["run_id"], "--rerun-evaluator", "--store", str(store)]
    rejudged = run_optimize([*rerun, "--progress", "none"])
    assert rejudged.returncode == 0, rejudged.stderr
    ledger = read_uses(store, digest)
    assert ledger is not None and [use.level for use in ledger.uses] == [None, None]
    again = ledger.uses[1].campaign_id

    confirmed = run_optimize([*flags, "--error-control", "confirm"])
    assert confirmed.returncode == 0, confirmed.stderr
    (second,) = [
        json.loads(p.read_text())
        for p in store.glob("runs/*/report.json")
        if json.loads(p.read_text())["campaign_id"] not in (first["campaign_id"], again)
    ]
    assert second["confirmation"] is not None  # it confirmed the tree the looks had seen
    words = second["error_control"]
    assert (
        f"; but {REUSED}: these 6 test cases had 2 uncontrolled look(s) "
        f"({first['campaign_id']}, {again}): scores seen at no level: a tree picked on them "
        "is not confirmed by them; add fresh test cases"
    ) in words
    assert "bounds only its own no-gain publish" not in words  # a look adds no level


def test_a_none_run_killed_during_its_test_measurement_has_left_its_look(
    tmp_path: Path,
) -> None:
    # The look is recorded before the first test replay, as a confirmation's is: a run
    # killed while the user watched its test scores come in still counts.
    paths, store, hold, flags = _held_at_test(tmp_path)
    run_dir = _killed_measuring([*flags, "--error-control", "none"], store, "c0.final.test")
    killed = json.loads((run_dir / "run.json").read_text())["campaign_id"]
    digest = held_out_digest(load_dataset(paths["dataset"]))
    assert digest is not None
    ledger = read_uses(store, digest)
    assert ledger is not None and _look(ledger.uses) == [(killed, None, False)]
    assert f"these 6 test cases had 1 uncontrolled look(s) ({killed}): " in _started_over(
        [*flags, "--error-control", "confirm"], store, hold, killed
    )


def test_an_older_ledger_reads_beside_looks_and_a_damaged_one_is_still_reported(
    tmp_path: Path,
) -> None:
    # A ledger an older evolane wrote has entries without ``finished`` and always a level:
    # they read as confirmations beside the uncontrolled looks (no level) written now.
    paths = write_toy(tmp_path, {})
    dataset = load_dataset(paths["dataset"])
    digest = held_out_digest(dataset)
    assert digest is not None
    old = {"campaign_id": "c-old", "run_id": "r-old", "tree": "tree-ab", "level": 0.05}
    old |= {"p_value": 0.3, "confirmed": False}
    path = ledger_file(tmp_path, digest)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"digest": digest, "cases": 6, "uses": [old]}))
    look = ConfirmUse(
        campaign_id="c-look", run_id="r-look", tree="tree-ab", level=None, p_value=1.0,
        confirmed=False,
    )  # fmt: skip
    record_use(tmp_path, digest, 6, look)
    record_use(tmp_path, digest, 6, look.model_copy(update={"run_id": "r-again"}))  # once
    line = reuse_note(tmp_path, dataset, "c-new", toy_config(paths))
    assert line == (
        f"{REUSED}: these 6 test cases ran 1 confirmation(s) (0 confirmed; all up to 0.1) and "
        "1 uncontrolled look(s) (c-old, c-look): scores seen at no level: a tree picked on "
        "them is not confirmed by them; add fresh test cases"
    )
    path.write_text(path.read_text()[:-9])
    assert reuse_note(tmp_path, dataset, "c-new", toy_config(paths)) == (
        f"test split: its ledger {path} cannot be read"
    )
