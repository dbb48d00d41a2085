"""report.html of a long run: the unit records the page reads are held slim, and draw the same
page (found by soak review: whole records, 4 KiB a unit, were the memory peak at the end of
a long run; a 400-iteration run's report step grew the process by 62 MB)."""

from __future__ import annotations

import copy
import json
import tracemalloc
from pathlib import Path
from typing import Any

from evolane.store import BlobStore
from evolane.views import _write
from evolane.views._data import best_path, candidates_of, heat_cells

UNIT = {  # a unit record as a run stores it (taken from a real run)
    "unit": "c0.i0.base.0.0.b", "case": "val00", "arm": "baseline", "repetition": 0,
    "status": "succeeded", "reused": False, "restored": False, "note": "", "score": 1.0,
    "replay": {
        "kind": "replay.result", "unit_id": "c0.i0.base.0.0.b", "case_id": "val00",
        "arm": "baseline", "repetition": 0, "status": "succeeded", "failure": None,
        "output_ref": {"digest": "sha256:" + "b" * 64, "size": 134,
                       "media_type": "application/vnd.evolane.tree+json"},
        "stdout_ref": None, "stderr_ref": None,
        "usage": {"tokens": None, "cost_usd": None, "wall_seconds": 0.06, "cached": False},
        "usage_complete": False, "wall_seconds": 0.08, "attempts": 1, "blocked_by": None,
    },
    "judge": {
        "kind": "judge.result", "unit_id": "c0.i0.base.0.0.b", "status": "succeeded",
        "score": 1.0, "source": "exact_match", "failure": None,
        "detail_ref": {"digest": "sha256:" + "7" * 64, "size": 14,
                       "media_type": "application/octet-stream"},
        "attempts": 1, "wall_seconds": 0.007,
        "usage": {"tokens": 0.0, "cost_usd": 0.0, "wall_seconds": 0.007, "cached": False},
        "usage_complete": True,
    },
}  # fmt: skip


def _unit(measurement: int, arm: str, case: int) -> dict[str, Any]:
    """A unit of ``measurement`` on ``arm`` and val case ``case``: scored, failed by the tree,
    failed by the infrastructure or a failed judge, by turns."""
    unit = copy.deepcopy(UNIT)
    name = f"c0.i{measurement}.s0.{arm[0]}.{case}"
    unit.update(unit=name, case=f"val{case:02d}", arm=arm)
    unit["replay"]["unit_id"] = unit["judge"]["unit_id"] = name
    turn = (measurement + case) % 5
    if turn == 1:
        unit["score"] = 0.0
    elif turn in (2, 3):
        owner = "candidate" if turn == 2 else "infrastructure"
        unit.update(score=None, status="failed")
        unit["replay"].update(status="failed", failure={"owner": owner, "code": "x"})
    elif turn == 4:
        unit.update(score=None, status="failed")
        unit["judge"]["status"] = "failed"
    return unit


def _long_run(store: Path, iterations: int, cases: int) -> dict[str, Any]:
    """A report of ``iterations`` paired val measurements (one accepted in three), each with
    both arms' unit records in the blob store."""
    blobs = BlobStore(store)
    measurements, decisions, funnel, rounds = [], [], [], []
    for i in range(iterations):
        units = [_unit(i, arm, c) for arm in ("baseline", "candidate") for c in range(cases)]
        ref = blobs.put_bytes(json.dumps(units).encode(), media_type="application/json")
        name = f"m{i}"
        measurements.append(
            {"measurement_id": name, "purpose": "paired", "split": "val", "cycle": 0,
             "iteration": i, "slot": 0, "n": cases, "units_ref": ref.model_dump()}
        )  # fmt: skip
        decision = "accept" if i % 3 == 0 else "reject"
        decisions.append({"cycle": 0, "iteration": i, "slot": 0, "digest": f"d{i}",
                          "decision": decision, "reason": ""})  # fmt: skip
        funnel.append({"cycle": 0, "iteration": i, "slot": 0, "digest": f"d{i}",
                       "terminal": "accepted" if decision == "accept" else "rejected",
                       "decision": decision, "stages": []})  # fmt: skip
        rounds.append({"cycle": 0, "iteration": i, "parent": "seed",
                       "accepted_slot": 0 if decision == "accept" else None})  # fmt: skip
    return {
        "config": {"gate": {"pass_score": 1.0, "confidence": 0.95}},
        "seed": {"digest": "seed"},
        "measurements": measurements,
        "decisions": decisions,
        "funnel": funnel,
        "iterations": rounds,
    }


def test_the_page_holds_slim_unit_records_and_draws_what_whole_ones_draw(
    tmp_path: Path,
) -> None:
    report = _long_run(tmp_path, iterations=60, cases=20)
    blobs = BlobStore(tmp_path)
    whole = {
        m["measurement_id"]: json.loads(blobs.read_bytes(m["units_ref"]["digest"]))
        for m in report["measurements"]
    }
    tracemalloc.start()
    try:
        slim = _write._read_units(report, blobs, [])
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    count = sum(len(units) for units in slim.values())
    assert count == 60 * 2 * 20
    assert held / count < 2048  # whole records: ~4 KiB each
    cells = heat_cells(report, slim)
    assert cells == heat_cells(report, whole)
    kinds = {kind for row in cells[1].values() for kind in row.values()}
    assert kinds == {"solid", "always_failing", "infra_errored"}
    candidates = candidates_of(report)
    assert best_path(report, candidates, slim) == best_path(report, candidates, whole)
    assert len(best_path(report, candidates, slim)) == 61  # the seed, then each iteration
