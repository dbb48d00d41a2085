"""A damaged record is one line naming its file and pointing to ``evolane fsck``, and fsck
finds what the other commands send the user to it about (hostile review #6, #9, #12)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from evolane.campaign._resume import read_resume_state
from evolane.campaign._runs import (
    CampaignState,
    StoreLayout,
    load_campaign,
    save_campaign,
)
from evolane.inputs import InputError
from evolane.messages import UnitRecord
from evolane.store import BlobStore, Journal, check_store, snapshot_tree

CAMPAIGN = "c-20260101-100000-aaaaaa"
RUN = "r-20260101-100000-aaaaaa"


def _campaign(root: Path) -> Path:
    layout = StoreLayout(root)
    ref = BlobStore(root).put_bytes(b"seed")
    save_campaign(layout, CampaignState(campaign_id=CAMPAIGN, seed_ref=ref, best_ref=ref))
    return layout.campaign_file(CAMPAIGN)


def _negative_spend(path: Path) -> None:
    state = orjson.loads(path.read_bytes())
    path.write_bytes(orjson.dumps({**state, "spent": {"cost_usd": -3.0}}))


@pytest.mark.parametrize(
    "damage",
    [
        lambda p: p.write_bytes(b""),
        lambda p: p.write_bytes(p.read_bytes()[:40]),
        _negative_spend,
    ],
    ids=["empty", "truncated", "negative-spend"],
)
def test_a_damaged_campaign_json_is_one_line_pointing_to_fsck(tmp_path: Path, damage) -> None:
    path = _campaign(tmp_path)
    damage(path)
    with pytest.raises(InputError) as caught:
        load_campaign(StoreLayout(tmp_path), CAMPAIGN)
    message = str(caught.value)
    assert message.startswith(f"cannot read {path}: ") and "\n" not in message
    assert message.endswith(f"run `evolane fsck --store {tmp_path}`")


def _journal(root: Path, lines: list[bytes]) -> Path:
    path = root / "runs" / RUN / "journal.jsonl"
    path.parent.mkdir(parents=True)
    path.write_bytes(b"".join(lines))
    return path


def _unit(**changes: object) -> bytes:
    record = UnitRecord(measurement="m1", unit="m1/u1", status="succeeded").model_dump()
    return orjson.dumps({**record, **changes}) + b"\n"


def test_resume_reads_a_damaged_or_invalid_journal_line_as_one_input_error(
    tmp_path: Path,
) -> None:
    path = _journal(tmp_path, [_unit(), b"garbage\n", _unit()])
    with pytest.raises(InputError, match=rf"{path}:2: corrupt journal line .*evolane fsck"):
        read_resume_state(path)
    path.write_bytes(_unit() + _unit(status="great"))
    with pytest.raises(InputError) as caught:
        read_resume_state(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:2: unreadable unit record (status: ")
    assert "newer or older" not in message and "evolane fsck --store" in message


def test_fsck_finds_an_invalid_journal_record_and_a_missing_referenced_object(
    tmp_path: Path,
) -> None:
    store = BlobStore(tmp_path)
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "a.txt").write_text("a\n")
    tree = snapshot_tree(store, tmp_path / "tree")
    journal = _journal(tmp_path, [_unit(tree=tree.digest), _unit(status="great")])
    with Journal(journal.with_name("events.jsonl")) as events:
        events.append({"kind": "event.phase"})
    file_blob = store.path_of(store.put_bytes(b"a\n"))
    assert check_store(tmp_path).problems[0].reason.startswith(f"{journal}:2: unreadable unit")
    journal.write_bytes(_unit(tree=tree.digest))
    assert check_store(tmp_path).clean
    file_blob.unlink()  # a file of a referenced tree
    (problem,) = check_store(tmp_path).problems
    assert (problem.kind, problem.path, problem.runs) == ("missing", file_blob, (RUN,))
    store.path_of(tree).unlink()  # the tree itself
    (problem,) = check_store(tmp_path).problems
    assert (problem.kind, problem.path) == ("missing", store.path_of(tree))


def test_fsck_names_a_damaged_campaign_json(tmp_path: Path) -> None:
    path = _campaign(tmp_path)
    path.write_bytes(b"{")
    command = [sys.executable, "-m", "evolane", "fsck", "--store", str(tmp_path)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stdout + done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"damaged record {path}: ") and "evolane fsck" not in first


def test_fsck_calls_a_torn_journal_tail_damage_only_after_the_run_finished(
    tmp_path: Path,
) -> None:
    # Found by review: a finished run whose journal lost half its last line was "clean".
    # A kill leaves such a tail in a running run, and a resume repairs it: no damage there.
    from tests.campaign_helpers import toy_flags, write_toy

    paths = write_toy(tmp_path, {"0.0": "fix:1"})
    store = tmp_path / "store"
    evolane = [sys.executable, "-m", "evolane"]
    done = subprocess.run(
        [*evolane, "optimize", *toy_flags(paths, store)], capture_output=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    (run_dir,) = (store / "runs").iterdir()
    journal = run_dir / "journal.jsonl"
    lines = journal.read_bytes().splitlines(keepends=True)
    journal.write_bytes(b"".join(lines[:-1]) + lines[-1][:20])  # half the last line
    fsck = [*evolane, "fsck", "--store", str(store)]
    damaged = subprocess.run(fsck, capture_output=True, text=True, timeout=120)
    assert damaged.returncode == 1, damaged.stdout
    assert (
        f"damaged journal {journal}: a torn last line (line {len(lines)}), though the run "
        f"finished: its last record is lost; used by run {run_dir.name}"
    ) in damaged.stdout.splitlines()
    run_json = run_dir / "run.json"
    record = orjson.loads(run_json.read_bytes())
    # A run that ended otherwise is taken up by no resume either (found by review: only a
    # finished one was checked); a running or interrupted one is.
    for status, code in [("budget_limited", 1), ("failed", 1), ("running", 0), ("interrupted", 0)]:
        run_json.write_bytes(orjson.dumps({**record, "status": status}))
        checked = subprocess.run(fsck, capture_output=True, text=True, timeout=120)
        assert checked.returncode == code, (status, checked.stdout)
        if code:
            assert f"though the run ended ({status}): its last record is lost" in checked.stdout


def test_fsck_reads_a_large_journal_a_line_at_a_time(tmp_path: Path) -> None:
    # Found by review: fsck held every record of each journal and events.jsonl it checked
    # (1.6 GB for an events.jsonl of 267 MB); now one line at a time, whatever the size.
    import tracemalloc

    journal = _journal(tmp_path, [_unit()] * 20_000 + [b'{"type": "unit", "torn'])
    event = orjson.dumps({"kind": "event.phase", "t": 1.5, "phase": "optimize"}) + b"\n"
    journal.with_name("events.jsonl").write_bytes(event * 100_000)
    tracemalloc.start()
    try:
        result = check_store(tmp_path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.clean, result.problems  # a torn last line of a running run is no damage
    assert peak < 4 << 20, peak  # the records held whole took 44 MB


def test_fsck_names_a_folder_of_objects_it_cannot_list_and_checks_the_rest(
    tmp_path: Path,
) -> None:
    # Found by review: one fan-out folder its mode closed made the whole check one line,
    # "--store ...: cannot be checked: Permission denied", naming no folder, exit 2.
    import os
    import shutil

    root = [] if os.geteuid() else ["setpriv", "--bounding-set=-dac_override,-dac_read_search"]
    if root and shutil.which("setpriv") is None:
        pytest.skip("root without setpriv lists every folder")
    store = BlobStore(tmp_path)
    closed = store.path_of(store.put_bytes(b"closed")).parent
    writable = store.path_of(store.put_bytes(b"left writable"))
    writable.chmod(0o644)
    closed.chmod(0)
    try:
        command = [*root, sys.executable, "-m", "evolane", "fsck", "--store", str(tmp_path)]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    finally:
        closed.chmod(0o755)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    said = f"unreadable folder {closed}: Permission denied: its objects were not checked"
    assert said in lines and f"object {writable}: writable: objects are read-only" in lines


@pytest.mark.parametrize("when", [1e308, 1e18, -1e18])
def test_a_time_no_date_can_show_is_listed_as_a_question_mark(tmp_path: Path, when: float) -> None:
    """Found by hostile review: a campaign's ``updated`` (or a run's ``created``, a report's
    ``started``) that no date can show made `evolane runs` fail with a traceback, exit 1."""
    path = _campaign(tmp_path)
    path.write_bytes(orjson.dumps({**orjson.loads(path.read_bytes()), "updated": when}))
    done = subprocess.run(
        [sys.executable, "-m", "evolane", "runs", "--store", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0 and not done.stderr, done.stderr
    (row,) = [line for line in done.stdout.splitlines() if line.startswith(CAMPAIGN)]
    assert row.split()[-1] == "?", row
