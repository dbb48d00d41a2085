"""The measurement pipeline end to end over real sandboxed sleeper processes."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
import trio

from evolane.messages import GateConfig, MeasureRequest
from evolane.sandbox import lease_holders
from evolane.store import read_journal
from tests.pipeline_helpers import sleeper_bench

NO_SEQ = GateConfig(sequential=False, min_cases=4)


def units(bench, summary) -> list[dict]:  # type: ignore[no-untyped-def]
    return orjson.loads(bench.store.read_bytes(summary.units_ref))


async def measure(
    bench,
    effect: float,
    gate: GateConfig | None = NO_SEQ,
    name: str = "m1",  # type: ignore[no-untyped-def]
    baseline=None,
):
    """Measure a candidate of true ``effect`` against the effect-0 baseline."""
    request = MeasureRequest(
        measurement_id=name,
        baseline_ref=baseline or bench.tree(0.0),
        candidate_ref=bench.tree(effect),
        **({"gate": gate} if gate is not None else {}),
    )
    return await bench.pipeline.measure(request)


async def test_peak_lane_concurrency_equals_the_setting(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with sleeper_bench(tmp_path, cases=16, median=0.3, replay_concurrency=3) as bench:
        peak = 0

        async def sample() -> None:
            nonlocal peak
            while True:
                running = [
                    p
                    for p in lease_holders(bench.host.lease)
                    if b"sleeper\x00replay" in Path(f"/proc/{p}/cmdline").read_bytes()
                ]
                peak = max(peak, len(running))
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(sample)
            summary = await measure(bench, 0.1)
            nursery.cancel_scope.cancel()
    assert summary.status == "complete" and summary.units_run == 32
    assert peak == 3


async def test_control_runs_before_treatment_and_results_come_back_ordered(tmp_path) -> None:  # type: ignore[no-untyped-def]
    journal = tmp_path / "journal.jsonl"
    async with sleeper_bench(
        tmp_path, cases=12, spread=0.8, replay_concurrency=4, journal_path=journal
    ) as bench:
        summary = await measure(bench, 0.05)
        records = units(bench, summary)
    order = [r["unit"] for r in read_journal(journal).records]
    for case in range(12):
        assert order.index(f"m1.{case}.0.b") < order.index(f"m1.{case}.0.c")
    assert [(r["case"], r["arm"]) for r in records] == sorted(
        [(r["case"], r["arm"]) for r in records], key=lambda k: (int(k[0].split("-")[-1]), k[1])
    )
    assert all(r["status"] == "succeeded" for r in records)


async def test_a_failed_control_blocks_its_treatment(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with sleeper_bench(tmp_path, cases=16, sleeper_args=("--fail-rate", "0.3")) as bench:
        summary = await measure(bench, 0.1)
        records = units(bench, summary)
    failed = {r["case"] for r in records if r["arm"] == "baseline" and r["status"] == "failed"}
    assert failed, "the seeded fail rate should fail some baselines"
    for record in records:
        if record["arm"] == "candidate" and record["case"] in failed:
            assert record["status"] == "blocked"
            assert record["replay"]["blocked_by"].endswith(".b")
    assert summary.units_blocked == len(failed)
    assert summary.gate.n == 16 - len(failed)


async def test_baselines_are_reused_across_candidates(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with sleeper_bench(tmp_path, cases=10) as bench:
        base = bench.tree(0.0)
        first = await measure(bench, 0.1, baseline=base)
        second = await measure(bench, -0.1, name="m2", baseline=base)
    assert first.units_reused == 0 and first.units_run == 20
    assert second.units_reused == 10 and second.units_run == 10


async def test_results_do_not_depend_on_completion_order(tmp_path) -> None:  # type: ignore[no-untyped-def]
    outcomes = []
    for concurrency in (1, 6):
        async with sleeper_bench(
            tmp_path / str(concurrency), cases=10, spread=1.0, replay_concurrency=concurrency
        ) as bench:
            summary = await measure(bench, 0.1, name="m")
            outcomes.append(
                (
                    [(r["unit"], r["status"], r["score"]) for r in units(bench, summary)],
                    summary.gate.model_dump(),
                )
            )
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize(("effect", "decision"), [(0.4, "accept"), (-0.4, "reject")])
async def test_a_clear_winner_or_loser_stops_early(tmp_path, effect: float, decision: str) -> None:  # type: ignore[no-untyped-def]
    async with sleeper_bench(tmp_path, cases=40, median=0.02, replay_concurrency=2) as bench:
        summary = await measure(bench, effect, gate=None, name="m")
    assert summary.status == "early_stopped"
    assert summary.gate.decision == decision
    # the stop came before some units' replay or judge (on a loaded host every replay may
    # have ended first: the judges, behind, decide; then the stop cuts only judges)
    assert summary.units_not_run + summary.units_cancelled > 0
    # the figure reads "n/n_planned": the plan's 40 cases, not the cases the stop read
    assert summary.gate.n < 40 and summary.gate.n_planned == 40


async def test_a_missing_replay_command_is_one_shared_failure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with trio.fail_after(60):
        async with sleeper_bench(
            tmp_path, cases=32, replay="no-such-agent --case {case_file}", replay_concurrency=4
        ) as bench:
            summary = await measure(bench, 0.1, gate=None, name="m")
    assert summary.status == "shared_failure"
    assert "no-such-agent" in summary.message
    assert summary.units_failed <= 4 and summary.units_not_run >= 56


async def test_a_judge_printing_non_json_is_an_infrastructure_failure(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with sleeper_bench(
        tmp_path, cases=4, judge="sh -c 'echo this is not json; true'", judge_failure_retries=1
    ) as bench:
        summary = await measure(bench, 0.1, name="m")
        records = units(bench, summary)
    judge = records[0]["judge"]
    assert judge["status"] == "failed" and judge["score"] is None and judge["attempts"] == 2
    assert judge["failure"]["owner"] == "infrastructure"
    assert "this is not json" in judge["failure"]["message"]
    assert summary.gate.decision == "indecisive"


async def test_cancelling_a_measurement_kills_every_tree_before_it_returns(tmp_path) -> None:  # type: ignore[no-untyped-def]
    async with sleeper_bench(tmp_path, cases=16, median=30, replay_concurrency=4) as bench:
        with trio.move_on_after(1.0) as scope:
            await measure(bench, 0.1, gate=None, name="m")
        assert scope.cancelled_caught
        assert lease_holders(bench.host.lease) == set()


async def test_a_stop_finding_no_measurement_cancels_the_queued_one(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """A caller cancelled before the scheduler served its request stops the scheduler while
    nothing runs: the request still queued must start cancelled (else it runs whole while the
    stopper waits), and the stopper's `Ping` ends that, so later requests run."""
    from evolane.messages import Ping, StopAll

    async with sleeper_bench(tmp_path, cases=4, median=0.05, replay_concurrency=2) as bench:
        scheduler = bench.pipeline.scheduler
        assert scheduler.signal(StopAll())  # nothing runs: remembered
        queued = await measure(bench, 0.1, gate=None, name="queued")
        assert queued.status == "cancelled"
        assert queued.units_not_run == len(units(bench, queued)) > 0
        await scheduler.ask(Ping(seq=1))
        later = await measure(bench, 0.1, gate=None, name="later")
        assert later.status != "cancelled" and later.units_run > 0


async def test_a_token_ceiling_limits_the_measurement(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from evolane.messages import Usage

    async with sleeper_bench(
        tmp_path,
        cases=16,
        replay_concurrency=2,
        ceilings=Usage(tokens=5000),
        cold_start={"replay": Usage(tokens=2000, cost_usd=0.004)},
    ) as bench:
        summary = await measure(bench, 0.1, name="m")
        ledger = await bench.pipeline.ledger()
        records = units(bench, summary)
    assert summary.status == "budget_limited" and summary.units_not_run > 0
    # Units in flight when the budget stopped the measurement keep their own result and note.
    assert [r for r in records if r["status"] == "succeeded" and r["note"]] == []
    largest = 4000  # the sleeper reports at most 4000 tokens; reservations are estimates
    assert ledger.spent.tokens is not None and ledger.spent.tokens <= 5000 + largest
    assert {e.level for e in ledger.events} >= {"50%", "80%", "100%"}


@pytest.mark.parametrize("answer", ["file", "symlink"])  # read from the store / a laid-out copy
async def test_replays_never_see_the_answers_and_exact_match_judges_them(tmp_path, answer) -> None:  # type: ignore[no-untyped-def]
    from evolane.inputs import load_dataset
    from evolane.measure import CommandSettings, MeasureSettings
    from evolane.measure._pipeline import open_pipeline
    from evolane.sandbox import open_sandbox
    from evolane.store import BlobStore, snapshot_tree
    from evolane.supervisors import open_runtime

    rows = [
        {"id": f"c{i}", "input": i, "expected_output": "yes" if i % 2 else "no"} for i in range(8)
    ]
    (tmp_path / "d.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    (tmp_path / "tree").mkdir()
    write = 'echo \\"yes\\" > "$2"/output.json'
    if answer == "symlink":
        write = 'echo \\"yes\\" > "$2"/answer.json; ln -s answer.json "$2"/output.json'
    replay = (
        f"sh -c 'grep -q expected_output \"$1\" && exit 3; {write}'"
        " replay {case_file} {output_dir}"
    )
    store = BlobStore(tmp_path / "store")
    config, commands = (
        MeasureSettings(replay=replay),
        CommandSettings(kill_grace=0.2, isolation="process"),
    )
    async with open_sandbox(tmp_path / "sb", store=store) as host, open_runtime() as runtime:
        dataset = load_dataset(tmp_path / "d.jsonl")
        async with open_pipeline(
            runtime, host, store, dataset, config, commands=commands
        ) as pipeline:
            tree = snapshot_tree(store, tmp_path / "tree")
            summary = await pipeline.measure(
                MeasureRequest(
                    measurement_id="m", baseline_ref=tree, candidate_ref=tree, gate=NO_SEQ
                )
            )
    records = orjson.loads(store.read_bytes(summary.units_ref))
    assert all(r["status"] == "succeeded" for r in records), records[0]
    assert {r["case"]: r["score"] for r in records} == {f"c{i}": float(i % 2) for i in range(8)}
    assert all(r["judge"]["source"] == "exact_match" for r in records)


def _plan(request: MeasureRequest, case_ids: tuple[str, ...], lanes: int):  # type: ignore[no-untyped-def]
    """A measurement plan over ``case_ids`` (no IO: nothing is started)."""
    from evolane.measure import SchedulerSettings
    from evolane.measure._plan import MeasurePlan

    settings = SchedulerSettings(
        case_refs={}, judge_case_refs={}, splits={"val": case_ids}, fingerprint="f", min_cases=8
    )
    return MeasurePlan(request, settings, lanes=lanes)


def test_adaptive_repetitions_and_first_repetitions_first() -> None:
    from evolane.measure import repetitions
    from evolane.messages import ArtifactRef

    ref = ArtifactRef(digest="sha256:" + "0" * 64, size=0)
    request = MeasureRequest(measurement_id="m", baseline_ref=ref, candidate_ref=ref)
    assert repetitions(request, cases=8, min_cases=8) == (1, 1)
    assert repetitions(request, cases=7, min_cases=8) == (2, 3)
    explicit = request.model_copy(update={"baseline_repetitions": 4, "candidate_repetitions": 1})
    assert repetitions(explicit, cases=3, min_cases=8) == (4, 1)

    plan = _plan(request, ("a", "b", "c"), lanes=1)
    order = [(u.repetition, u.case_id, u.arm) for u in plan.units]
    first, second, third = plan.case_ids  # the run's seeded reading order
    assert sorted(plan.case_ids) == ["a", "b", "c"]
    assert order[:6] == [
        (0, first, "baseline"),
        (0, first, "candidate"),
        (0, second, "baseline"),
        (0, second, "candidate"),
        (0, third, "baseline"),
        (0, third, "candidate"),
    ]
    assert [r for r, _, _ in order] == sorted(r for r, _, _ in order)  # first repetitions first
    third = [u for u in plan.units if u.arm == "candidate" and u.repetition == 2]
    assert all(u.depends_on is not None and u.depends_on.repetition == 1 for u in third)


def _makespan(units: list, priority: dict, lanes: int, seed: int) -> float:  # type: ignore[type-arg]
    """Simulated wall of dispatching ``units`` (replay 1 +- 2 %) to ``lanes`` by priority; a
    candidate is ready once its baseline is also judged (0.05 later, off the lane): the
    scheduler's rule, without processes."""
    import heapq
    import random

    jitter = random.Random(seed)
    ready = [(priority[u.index], u.index) for u in units if u.depends_on is None]
    heapq.heapify(ready)
    waiting = {u.index: u for u in units if u.depends_on is not None}
    events: list[tuple[float, str, int]] = []  # (time, "replayed" | "judged", unit index)
    now, free, last = 0.0, lanes, 0.0
    while ready or events:
        while free and ready:
            _, index = heapq.heappop(ready)
            heapq.heappush(events, (now + 1 + jitter.uniform(-0.02, 0.02), "replayed", index))
            free -= 1
        now, kind, done = heapq.heappop(events)
        if kind == "replayed":
            free, last = free + 1, now
            heapq.heappush(events, (now + 0.05, "judged", done))
            continue
        for unit in [w for w in waiting.values() if w.depends_on.index == done]:
            del waiting[unit.index]
            heapq.heappush(ready, (priority[unit.index], unit.index))
    return last


def test_baselines_start_about_a_wave_ahead_so_no_pair_ends_the_run_alone() -> None:
    from evolane.messages import ArtifactRef

    ref = ArtifactRef(digest="sha256:" + "0" * 64, size=0)
    request = MeasureRequest(measurement_id="m", baseline_ref=ref, candidate_ref=ref)
    lanes = 8

    plan = _plan(request, tuple(f"c{i}" for i in range(64)), lanes=lanes)
    waves = len(plan.units) / lanes  # 16: the critical-path bound
    ours = [_makespan(plan.units, plan.priority, lanes, seed) for seed in range(20)]
    in_plan_order = {u.index: (u.repetition, u.index) for u in plan.units}
    naive = [_makespan(plan.units, in_plan_order, lanes, seed) for seed in range(20)]
    assert max(ours) < waves + 0.5  # every lane's last unit ends in the last wave
    assert max(naive) > waves + 0.5  # plan order: a last baseline, then its candidate alone
    first_candidate = min(plan.priority[u.index] for u in plan.units if u.arm == "candidate")
    early = [u for u in plan.units if plan.priority[u.index] < first_candidate]
    assert len(early) == lanes + 1 and all(u.arm == "baseline" for u in early)


async def test_a_crashing_lane_fails_its_unit_not_the_measurement(tmp_path) -> None:  # type: ignore[no-untyped-def]
    from evolane.lanes import _replay as lanes

    original = lanes.collect_replay
    calls = 0

    def flaky(*args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal calls
        calls += 1
        if calls == 3:
            raise RuntimeError("lane bug")
        return original(*args, **kwargs)

    lanes.collect_replay = flaky  # type: ignore[assignment]
    try:
        async with sleeper_bench(tmp_path, cases=6, replay_concurrency=1) as bench:
            summary = await measure(bench, 0.1)
            records = units(bench, summary)
    finally:
        lanes.collect_replay = original  # type: ignore[assignment]
    failed = [
        r
        for r in records
        if r["replay"] and r["replay"]["failure"] and r["replay"]["failure"]["owner"] == "framework"
    ]
    assert len(failed) == 1 and "lane bug" in failed[0]["replay"]["failure"]["message"]
    assert summary.status == "complete" and summary.units_run >= 10


@pytest.mark.parametrize(
    ("content", "complete"),
    [
        (b'{"tokens": 12, "cost_usd": 0.5}', True),
        (b'{"tokens": 12}', True),  # complete in tokens: dollars unknown, charged as reserved
        (b'{"tokens": 12, "partial": true}', False),
        (b"[1]", False),
        (b'"tokens"', False),
        (b'{"tokens": -1, "cost_usd": 0}', False),
        (b'{"tokens": "many", "cost_usd": 0}', False),
        (b"not json", False),
    ],
)
def test_a_usage_file_of_any_shape_never_breaks_the_lane(
    tmp_path: Path, content: bytes, complete: bool
) -> None:
    from evolane.lanes._replay import read_usage as _usage
    from evolane.sandbox import ProcessOutcome

    (tmp_path / "usage.json").write_bytes(content)
    outcome = ProcessOutcome(status="exited", exit_code=0, wall_seconds=2.0)
    usage, read = _usage(tmp_path / "usage.json", outcome)
    assert read is complete
    assert usage.wall_seconds == 2.0
    assert usage.tokens == (12 if b'"tokens": 12' in content else None)
