"""In-process backends do each unit's file work once: the candidate tree laid out once and
shared read-only, the judge handed the replay's own output folder, every unit folder gone
afterwards, and every unit journaled with outputs the store holds."""

from __future__ import annotations

from pathlib import Path

import orjson
import trio

from evolane.lanes import BackendCall
from evolane.measure import MeasureContext, MeasureSettings, RunJournal
from evolane.store import load_manifest, read_journal
from tests.pipeline_helpers import two_trees


async def test_shared_tree_handed_output_and_nothing_left(tmp_path: Path) -> None:
    rows = [{"id": f"c{i}", "input": i, "expected_output": i} for i in range(12)]
    candidates: dict[str, set[Path]] = {}
    answers: dict[str, bytes] = {}
    judged: dict[str, tuple[Path, bytes]] = {}
    replayed_in: set[Path] = set()

    async def replay(call: BackendCall) -> None:
        assert call.candidate is not None and call.output_dir is not None and call.case
        skill = (call.candidate / "skill.md").read_text()
        candidates.setdefault(skill, set()).add(call.candidate)
        answer = orjson.dumps(call.case["input"])
        (call.output_dir / "output.json").write_bytes(answer)
        answers[call.env["EVOLANE_UNIT"]] = answer
        replayed_in.add(call.output_dir)

    async def judge(call: BackendCall) -> float:
        assert call.output_dir is not None and call.case is not None
        answer = (call.output_dir / "output.json").read_bytes()
        judged[f"{call.env['EVOLANE_CASE_ID']}#{len(judged)}"] = (call.output_dir, answer)
        return 1.0 if orjson.loads(answer) == call.case["expected_output"] else 0.0

    journal = RunJournal(tmp_path / "journal.jsonl")
    context = MeasureContext(journal=journal, replay_backend=replay, judge_backend=judge)
    settings = MeasureSettings(replay="true", judge="true", replay_concurrency=4)
    async with two_trees(tmp_path, rows, settings, context) as bench:
        host, store = bench.host, bench.store
        summary = await bench.pipeline.measure(bench.request)
        await trio.to_thread.run_sync(host.settle)  # the deferred removals ran
        units_dir = host.lease_dir / "units"
        left = sorted(p.name for p in units_dir.iterdir()) if units_dir.exists() else []
        # Emptied folders kept for the next units (lanes/_recycle.py): nothing of a unit.
        spares = [units_dir / name for name in left if name.startswith(".spare-")]
        assert all(sorted(p.rglob("*")) == [p / "out", p / "work"] for p in spares)
        left = [name for name in left if not name.startswith(".spare-")]
    journal.close()
    assert summary.units_run == 24
    # One shared copy per tree, read-only, whatever the number of replays.
    assert {skill: len(paths) for skill, paths in candidates.items()} == {
        "rules of t1": 1,
        "rules of t2": 1,
    }
    # Every judge read the answer its replay wrote, from the replay's own unit folder.
    assert len(judged) == 24
    assert {folder for folder, _ in judged.values()} == replayed_in
    assert sorted(a for _, a in judged.values()) == sorted(answers.values())
    # Every unit is journaled once, naming outputs that are in the store.
    units = [r for r in read_journal(tmp_path / "journal.jsonl").records if r["type"] == "unit"]
    assert len({r["unit"] for r in units}) == 24
    for record in units:
        output = load_manifest(store, record["replay"]["output_ref"]["digest"])
        assert "output.json" in output
    # No unit folder is left behind (each judge removed or emptied its replay's folder).
    assert left == []
