"""The plan's running bookkeeping equals a recomputation from scratch (issue 22): whatever
order units end in, the early stop (where and what), the judges counted busy, the units
blob and the summary's counts are what the whole unit list, read again, gives."""

from __future__ import annotations

import random
from typing import Any

import orjson
from hypothesis import given

from evolane.measure._plan import MeasurePlan
from evolane.measure._prefix import _case_delta
from evolane.measure._sealed import SealedRecords
from evolane.messages import ArtifactRef
from evolane.stats import EarlyStop
from tests.test_measure_plan import FAST, Driver, build, shapes


def scratch_early_stop(plan: MeasurePlan) -> tuple[str, int] | None:
    """A fresh `EarlyStop` for every prefix of complete cases, fed it whole: the first prefix
    that decides, as (decision, cases read)."""
    members: dict[int, list[Any]] = {}
    for unit in plan.units:
        members.setdefault(unit.case_index, []).append(unit)
    complete = 0
    while complete < len(plan.case_ids) and all(u.done for u in members[complete]):
        complete += 1
    deltas = [_case_delta(members[i]) for i in range(complete)]
    for length in range(1, complete + 1):
        stopper = EarlyStop(plan.request.gate, len(plan.case_ids))
        decision = None
        for delta in deltas[:length]:
            decision = stopper.update(delta)
        if decision is not None:
            return decision, length
    return None


def scratch_records(plan: MeasurePlan) -> bytes:
    """The units blob as it was built before units were sealed: every unit's typed results."""
    ordered = sorted(plan.units, key=lambda u: (u.case_number, u.repetition, u.arm))
    return orjson.dumps(
        [
            {
                "unit": u.unit_id,
                "case": u.case_id,
                "arm": u.arm,
                "repetition": u.repetition,
                "status": u.status,
                "reused": u.reused,
                "restored": u.restored,
                "note": u.note,
                "score": u.score,
                "replay": u.replay.model_dump(mode="json") if u.replay else None,
                "judge": u.judge.model_dump(mode="json") if u.judge else None,
            }
            for u in ordered
        ]
    )


@FAST
@given(shapes)
def test_incremental_early_stop_and_records_equal_a_recount(shape: dict[str, Any]) -> None:
    plan, outcomes = build(shape, sequential=True)
    Driver(plan, outcomes).run(random.Random(shape["seed"] + 1))
    scratch = scratch_early_stop(plan)
    if plan.early is None:
        assert scratch is None or plan.stop_reason is not None
    else:
        assert scratch == (plan.early[0], plan.cutoff)
    assert all(u.record is not None for u in plan.units)  # every unit sealed once ended
    assert plan.records_json() == scratch_records(plan)
    summary = plan.summary(ArtifactRef(digest="sha256:" + "0" * 64, size=1), 1.0)
    took = [u for u in plan.units if u.replay is not None and u.replay.status != "blocked"]
    assert summary.units_run == sum(not (u.reused or u.restored) for u in took)


@FAST
@given(shapes)
def test_a_reused_unit_decodes_the_sealed_results(shape: dict[str, Any]) -> None:
    records = SealedRecords()
    plan, outcomes = build(shape, sequential=False, records=records)
    Driver(plan, outcomes).run(random.Random(shape["seed"]))
    again, _ = build(shape, sequential=False, records=records)
    Driver(again, outcomes).run(random.Random(shape["seed"] + 2))
    first = {u.unit_id: u for u in plan.units}
    for unit in again.units:
        if unit.status == "succeeded":
            assert unit.reused and unit.replay is not None and unit.judge is not None
            original = first[unit.unit_id]
            assert unit.replay == original.replay and unit.judge == original.judge
