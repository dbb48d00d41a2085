"""Found by review: a candidate that is worse could be accepted and published by making the
cases it fails end unscored (its replay hanging past the timeout, or its output crashing the
judge): such pairs were infrastructure failures, left out of the comparison, so only the
cases it passes were compared. An unscored candidate unit now scores 0 for the decision
(`unscored_counts_as_zero`); a framework stop or a spawn that never started still does not."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evolane.measure._table import unscored_counts_as_zero
from evolane.messages import FailureEvent, JudgeResult, ReplayJob, ReplayResult
from evolane.store import BlobStore, snapshot_tree

JUDGE = textwrap.dedent(
    """
    import json, sys
    case, answer = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
    print(json.dumps({"score": 1.0 if answer == case["expected_output"] else 0.0}))
    """
)
REPLAY = textwrap.dedent(
    """
    import os, sys, time
    text = open(os.path.join(sys.argv[1], os.environ["EVOLANE_CASE_ID"])).read()
    if text.strip() == "HANG":
        time.sleep(3600)
    open(os.path.join(sys.argv[2], "output.json"), "w").write(text)
    """
)
OPTIMIZER = textwrap.dedent(
    """
    import pathlib, sys
    wd, bad = pathlib.Path(sys.argv[1]), sys.argv[2]
    print("edit: breaks val00-07, fixes val08-13")
    for i in range(16):
        (wd / f"val{i:02d}").write_text(bad if i < 8 else ('"yes"' if i < 14 else '"no"'))
    """
)


def _campaign(root: Path, bad: str) -> tuple[dict, str]:
    """A seed passing val00-07 of 16; the optimizer's one edit breaks those 8 (writing
    ``bad`` there) and fixes 6 others: 6 of 16, worse than the seed."""
    (root / "target").mkdir()
    rows = []
    for i in range(16):
        (root / "target" / f"val{i:02d}").write_text('"yes"' if i < 8 else '"no"')
        rows.append({"id": f"val{i:02d}", "input": {}, "expected_output": "yes", "split": "val"})
    for i in range(4):  # the optimizer's own cases: never judged by the gate
        (root / "target" / f"train{i:02d}").write_text('"no"')
        rows.append(
            {"id": f"train{i:02d}", "input": {}, "expected_output": "yes"} | {"split": "train"}
        )
    (root / "cases.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    for name, text in (("judge.py", JUDGE), ("replay.py", REPLAY), ("opt.py", OPTIMIZER)):
        (root / name).write_text(text)
    python = f"{sys.executable} -I"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "evolane",
            "optimize",
            "--target",
            str(root / "target"),
            "--dataset",
            str(root / "cases.jsonl"),
            "--store",
            str(root / "store"),
            "--replay",
            f"{python} {root / 'replay.py'} {{candidate}} {{output_dir}}",
            "--judge",
            f"{python} {root / 'judge.py'} {{case_file}} {{output_dir}}/output.json",
            "--optimizer",
            f"{python} {root / 'opt.py'} {{workdir}} {bad}",
            "--iterations",
            "1",
            "--population",
            "1",
            "--replay-timeout",
            "2",
            "--no-regression",
            "--apply",
            "auto_verified",
            "--progress",
            "none",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=root,
    )
    report = json.loads(next((root / "store").glob("runs/*/report.json")).read_text())
    return report, done.stdout + done.stderr


@pytest.mark.parametrize("how", ["judge_crash", "replay_hangs"])
def test_a_worse_candidate_cannot_hide_its_failures_as_unscored_cases(
    tmp_path: Path, how: str
) -> None:
    bad = {"judge_crash": "not-json", "replay_hangs": "HANG"}[how]
    report, output = _campaign(tmp_path, bad)
    assert report["selected"] is None, output  # rejected, as the same edit done honestly
    assert (
        sum((tmp_path / "target" / f"val{i:02d}").read_text() == '"yes"' for i in range(16)) == 8
    )  # nothing published


def _replay(status: str, owner: str | None = None, code: str = "x") -> ReplayResult:
    failure = None if owner is None else FailureEvent(owner=owner, stage="replay", code=code)  # type: ignore[arg-type]
    return ReplayResult(
        unit_id="u",
        case_id="c",
        arm="candidate",
        repetition=0,
        status=status,
        failure=failure,  # type: ignore[arg-type]
    )


def _judge(status: str, owner: str = "infrastructure", code: str = "judge_exit_1") -> JudgeResult:
    failure = None if status == "succeeded" else FailureEvent(owner=owner, stage="judge", code=code)  # type: ignore[arg-type]
    score = 1.0 if status == "succeeded" else None
    return JudgeResult(unit_id="u", status=status, score=score, source="command", failure=failure)  # type: ignore[arg-type]


def test_what_an_unscored_candidate_unit_counts_as() -> None:
    succeeded = _replay("succeeded")
    assert unscored_counts_as_zero(_replay("timed_out", "infrastructure", "timeout"), None)
    assert unscored_counts_as_zero(_replay("failed", "task", "store_full"), None)
    assert unscored_counts_as_zero(succeeded, _judge("failed"))  # it crashed on the output
    assert unscored_counts_as_zero(succeeded, _judge("failed", code="judge_timed_out"))
    # Not the tree's doing, or no end at all: left out of the comparison as before.
    assert not unscored_counts_as_zero(_replay("failed", "infrastructure", "spawn_failed"), None)
    assert not unscored_counts_as_zero(succeeded, _judge("failed", code="judge_spawn_failed"))
    assert unscored_counts_as_zero(_replay("failed", "framework", "lane_error"), None)
    assert not unscored_counts_as_zero(_replay("cancelled", "framework", "cancelled"), None)
    assert not unscored_counts_as_zero(_replay("blocked"), None)
    assert not unscored_counts_as_zero(succeeded, _judge("cancelled", owner="framework"))
    assert not unscored_counts_as_zero(succeeded, None)  # not judged yet


def test_an_output_the_lane_cannot_read_is_the_candidates_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by review: a file the replay made unreadable (chmod 000, a non-root evolane)
    crashed the lane, and a lane crash left the case out of the comparison."""
    from evolane.lanes import _replay

    out = tmp_path / "out"
    out.mkdir()
    (out / "output.json").write_text("1")
    store = BlobStore(tmp_path / "store")
    job = ReplayJob(
        unit_id="u1", case_id="c1", arm="candidate", repetition=0, seed=7, timeout_seconds=60,
        case_ref=store.put_bytes(b'{"id": "c1"}', media_type="application/json"),
        tree_ref=snapshot_tree(store, out),
    )  # fmt: skip

    def unreadable(*_: object) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(out / "output.json"))

    monkeypatch.setattr(_replay, "store_scan", unreadable)
    failure = _replay._store_output(store, job, out, _replay.OUTPUT_LIMITS)
    assert isinstance(failure, FailureEvent) and failure.code == "output_unsupported"
    assert failure.owner == "candidate"

    def full(*_: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(_replay, "store_scan", full)
    with pytest.raises(OSError):  # the store's own trouble is not the candidate's
        _replay._store_output(store, job, out, _replay.OUTPUT_LIMITS)
