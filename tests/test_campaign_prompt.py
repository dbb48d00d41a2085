"""The optimizer's prompt and context: convergence, case standings, focus, the prompt's byte
bound, the rejected-diff format, and the bounded context folder."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from evolane.campaign._prompt import (
    CaseStanding,
    build_prompt,
    classify_cases,
    convergence,
    edit_diff,
    encode_prompt,
    focus_cases,
    write_context,
)
from evolane.messages import ArtifactRef, FailureEvent, JudgeResult, ReplayResult
from evolane.store import BlobStore, FileEntry, load_manifest, snapshot_tree


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "store")


# -- convergence ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("stall", "expected"),
    [
        (1, ["ok", "stop", "stop"]),
        (2, ["ok", "paradigm_shift", "stop"]),
        (3, ["ok", "ok", "paradigm_shift", "stop"]),
        (4, ["ok", "ok", "warn", "paradigm_shift", "stop", "stop"]),
        (5, ["ok", "ok", "ok", "warn", "paradigm_shift", "stop"]),
    ],
)
def test_convergence_follows_the_stall_limit(stall: int, expected: list[str]) -> None:
    assert [convergence(stalled, stall) for stalled in range(len(expected))] == expected


def test_convergence_refuses_a_stall_limit_below_one() -> None:
    with pytest.raises(ValueError, match="stall"):
        convergence(0, 0)
    with pytest.raises(ValueError, match="stalled"):
        convergence(-1, 3)


# -- case standings ---------------------------------------------------------------------------


class Units:
    """Builds scheduler unit records (the `units_ref` format) backed by a real store."""

    def __init__(self, store: BlobStore) -> None:
        self.store = store
        self.records: list[dict[str, Any]] = []

    def add(
        self,
        case: str,
        score: float | None = None,
        *,
        arm: str = "baseline",
        reason: str | None = None,
        replay_failure: tuple[str, str] | None = None,  # (owner, code)
        judge_failed: bool = False,
        output: bytes | None = None,
        status: str | None = None,
    ) -> dict[str, Any]:
        rep = sum(r["case"] == case and r["arm"] == arm for r in self.records)
        unit_id = f"{case}.{arm}.{rep}"
        replay = None
        if status != "not_run":
            failure = None
            if replay_failure is not None:
                owner, code = replay_failure
                failure = FailureEvent(owner=owner, stage="replay", code=code)  # type: ignore[arg-type]
            output_ref = None
            if output is not None:
                folder = self.store.root.parent / "outputs" / unit_id
                folder.mkdir(parents=True)
                (folder / "output.json").write_bytes(output)
                output_ref = snapshot_tree(self.store, folder)
            replay = ReplayResult(
                unit_id=unit_id,
                case_id=case,
                arm=arm,  # type: ignore[arg-type]
                repetition=rep,
                status="failed" if failure else "succeeded",
                failure=failure,
                output_ref=output_ref,
            ).model_dump(mode="json")
        judge = None
        if replay is not None and replay_failure is None:
            detail = orjson.dumps({"score": score, **({"reason": reason} if reason else {})})
            judge = JudgeResult(
                unit_id=unit_id,
                status="failed" if judge_failed else "succeeded",
                score=None if judge_failed else score,
                source="command",
                failure=(
                    FailureEvent(owner="infrastructure", stage="judge", code="judge_not_json")
                    if judge_failed
                    else None
                ),
                detail_ref=None if judge_failed else self.store.put_bytes(detail),
            ).model_dump(mode="json")
        scored = replay_failure is None and not judge_failed and status != "not_run"
        record = {
            "unit": unit_id,
            "case": case,
            "arm": arm,
            "repetition": rep,
            "status": status or ("succeeded" if scored else "failed"),
            "reused": False,
            "note": "",
            "score": score if scored else None,
            "replay": replay,
            "judge": judge,
        }
        self.records.append(record)
        return record


def test_cases_are_classified_from_the_baseline_arm_in_first_appearance_order(
    store: BlobStore,
) -> None:
    units = Units(store)
    units.add("solid", 1.0)
    units.add("always", 0.2, reason="wrong_action")
    units.add("solid", 1.0)
    units.add("solid", 0.0, arm="candidate")  # the candidate arm never counts
    units.add("always", 0.4, reason="evidence")
    units.add("flaky", 1.0)
    units.add("flaky", 0.0, reason="trigger")
    units.add("infra", replay_failure=("infrastructure", "timeout"))
    units.add("infra", 0.5, judge_failed=True)
    units.add("broken", replay_failure=("task", "exit_2"))
    units.add("broken", 1.0)
    units.add("never", status="not_run")
    units.add("cand-only", 0.0, arm="candidate")
    standings = classify_cases(units.records, store)
    assert [(s.id, s.category, round(s.score, 6), s.runs, s.reason) for s in standings] == [
        ("solid", "solid", 1.0, 2, ""),
        ("always", "always_failing", 0.3, 2, "wrong_action"),
        ("flaky", "flaky", 0.5, 2, "trigger"),
        ("infra", "infra_errored", 0.0, 0, "timeout"),
        ("broken", "flaky", 0.5, 2, "exit_2"),  # its own replay failure scores 0
    ]


def test_the_pass_threshold_decides_what_counts_as_failing(store: BlobStore) -> None:
    units = Units(store)
    units.add("good", 0.8)
    units.add("good", 0.9)
    units.add("bad", 0.4)
    units.add("bad", 0.6, reason="steps")
    full = {s.id: s.category for s in classify_cases(units.records, store)}
    assert full == {"good": "always_failing", "bad": "always_failing"}
    half = {s.id: s.category for s in classify_cases(units.records, store, pass_threshold=0.5)}
    assert half == {"good": "solid", "bad": "flaky"}


def test_a_failing_case_without_a_judge_reason_names_its_failure_code(store: BlobStore) -> None:
    units = Units(store)
    units.add("quiet", 0.0)
    units.add("crash", replay_failure=("task", "exit_1"))
    reasons = {s.id: s.reason for s in classify_cases(units.records, store)}
    assert reasons == {"quiet": "", "crash": "exit_1"}


# -- focus ------------------------------------------------------------------------------------


def standing(case: str, category: str, score: float, reason: str = "") -> CaseStanding:
    return CaseStanding(id=case, category=category, score=score, runs=2, reason=reason)  # type: ignore[arg-type]


STANDINGS = [
    standing("c", "always_failing", 0.5, "evidence"),
    standing("s1", "solid", 1.0),
    standing("a", "flaky", 0.5, "trigger"),
    standing("b", "always_failing", 0.1, "wrong_action"),
    standing("i", "infra_errored", 0.0, "timeout"),
    standing("s2", "solid", 1.0),
]


def test_focus_selects_the_failing_cases() -> None:
    ids = lambda cases: [s.id for s in cases]  # noqa: E731
    assert ids(focus_cases(STANDINGS, "all", 7)) == ["c", "a", "b"]
    assert [ids(focus_cases(STANDINGS, "cyclic", n)) for n in range(4)] == [
        ["c"],
        ["a"],
        ["b"],
        ["c"],
    ]
    assert ids(focus_cases(STANDINGS, "hardest-first", 0)) == ["b", "a", "c"]  # 0.5 tie: by id
    assert focus_cases([standing("s", "solid", 1.0)], "cyclic", 3) == []
    with pytest.raises(ValueError, match="focus"):
        focus_cases(STANDINGS, "random", 0)


# -- the prompt -------------------------------------------------------------------------------


def prompt(**overrides: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "iteration": 3,
        "cycle": 1,
        "slot": 2,
        "focus": "hardest-first",
        "convergence": "warn",
        "standings": STANDINGS,
        "rejected": [("skill/SKILL.md\n-old\n+new\n", "regressed")],
        "protected": ["grader/**", "data/**"],
    }
    return build_prompt(**{**settings, **overrides})


def test_the_prompt_lists_focus_cases_standings_and_rules() -> None:
    built = prompt()
    assert built["failing"] == [
        {"id": "b", "reason": "wrong_action", "score": 0.1},
        {"id": "a", "reason": "trigger", "score": 0.5},
        {"id": "c", "reason": "evidence", "score": 0.5},
    ]
    assert (built["flaky"], built["infra_errored"], built["solid"]) == (["a"], ["i"], ["s1", "s2"])
    assert built["protect"] == ["s1", "s2"]
    assert built["protected_paths"] == ["grader/**", "data/**"]
    assert built["rejected"] == [{"diff": "skill/SKILL.md\n-old\n+new\n", "reason": "regressed"}]
    assert (built["iteration"], built["cycle"], built["slot"]) == (3, 1, 2)
    assert (built["focus"], built["convergence"]) == ("hardest-first", "warn")
    assert "protect" in built["instructions"] and "stalled" in built["instructions"]
    assert prompt(convergence="paradigm_shift")["instructions"] != built["instructions"]
    assert set(built["omitted"].values()) == {0}
    assert encode_prompt(prompt()) == encode_prompt(built)  # deterministic bytes
    assert orjson.loads(encode_prompt(built)) == built
    cyclic = prompt(focus="cyclic", iteration=1)
    assert [f["id"] for f in cyclic["failing"]] == ["a"]
    assert built["always_failing"] == cyclic["always_failing"] == ["c", "b"]


def test_the_oldest_rejected_diffs_are_dropped_to_fit() -> None:
    rejected = [(f"skill/SKILL.md\n+rule {n}\n" + "x" * 2000, f"reason {n}") for n in range(60)]
    built = prompt(rejected=rejected, max_bytes=32 << 10)
    size = len(encode_prompt(built))
    assert size <= 32 << 10
    kept = [r["reason"] for r in built["rejected"]]
    assert kept == [f"reason {n}" for n in range(60 - len(kept), 60)]  # the most recent, in order
    assert 0 < len(kept) < 60 and built["omitted"]["rejected"] == 60 - len(kept)
    one_more = dict(built, rejected=[{"diff": rejected[0][0], "reason": "x"}, *built["rejected"]])
    assert len(encode_prompt(one_more)) > 32 << 10  # as many as fit, not fewer
    assert len(built["failing"]) == 3 and built["omitted"]["failing"] == 0


def test_case_lists_are_trimmed_when_rejected_diffs_are_not_enough() -> None:
    many = [standing(f"solid-{n:05d}", "solid", 1.0) for n in range(4000)]
    failing = [standing(f"fail-{n:03d}", "always_failing", 0.0, "x" * 200) for n in range(30)]
    built = prompt(standings=failing + many, focus="all", max_bytes=16 << 10)
    assert len(encode_prompt(built)) <= 16 << 10
    assert built["rejected"] == [] and built["omitted"]["rejected"] == 1
    assert built["omitted"]["solid"] > 0 and built["protect"] == built["solid"]
    assert built["solid"] == [s.id for s in many[: len(built["solid"])]]
    assert len(built["failing"]) == 30  # failing cases are the last to go
    with pytest.raises(ValueError, match="cannot fit"):
        prompt(protected=["p" * 5000], max_bytes=4096)


# -- the rejected-diff format -----------------------------------------------------------------


def tree(store: BlobStore, root: Path, files: dict[str, bytes]) -> ArtifactRef:
    for name, data in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return snapshot_tree(store, root)


def test_edit_diff_lists_changed_files_in_path_order(store: BlobStore, tmp_path: Path) -> None:
    parent = tree(
        store,
        tmp_path / "p",
        {
            "b/rules.md": b"keep\nold rule\nshared\n",
            "a.txt": b"gone\n",
            "same.txt": b"same\n",
            "blob.bin": b"\xff\x00",
        },
    )
    candidate = tree(
        store,
        tmp_path / "c",
        {
            "b/rules.md": b"keep\nshared\nnew rule\n",
            "c.txt": b"fresh\nlines\n",
            "same.txt": b"same\n",
            "blob.bin": b"\xfe\x00",
        },
    )
    assert edit_diff(store, parent, candidate) == (
        "a.txt\n-gone\nb/rules.md\n-old rule\n+new rule\nblob.bin\n~binary\nc.txt\n+fresh\n+lines\n"
    )
    assert edit_diff(store, parent, parent) == ""


def test_edit_diff_is_cut_to_its_byte_bound(store: BlobStore, tmp_path: Path) -> None:
    lines = "".join(f"línea {n}\n" for n in range(3000)).encode()
    parent = tree(store, tmp_path / "p", {"x.md": b"start\n"})
    candidate = tree(store, tmp_path / "c", {"x.md": lines, "y.md": lines})
    full = edit_diff(store, parent, candidate, max_bytes=1 << 20)
    for bound in (100, 4096, 4097):
        cut = edit_diff(store, parent, candidate, max_bytes=bound)
        assert len(cut.encode()) <= bound and full.startswith(cut)
        assert len(cut.encode()) >= bound - 3  # cut inside a character at most


# -- the context folder -----------------------------------------------------------------------


def context_files(store: BlobStore, ref: ArtifactRef) -> dict[str, bytes]:
    manifest = load_manifest(store, ref)
    files = {}
    for path, entry in manifest.items():
        assert isinstance(entry, FileEntry)
        files[path] = store.read_bytes(entry.digest)
    return files


def test_the_context_holds_each_failing_case_in_focus_order(store: BlobStore) -> None:
    units = Units(store)
    units.add("hard", 0.5, reason="evidence", output=b'{"action": "create"}')
    units.add("hard", 0.0, reason="wrong_action", output=b'{"action": "memory"}')
    units.add("easy", 1.0, output=b"{}")
    units.add("flaky", 1.0, output=b'{"ok": 1}')
    units.add("flaky", 0.0, reason="trigger", output=b'{"ok": 0}')
    standings = classify_cases(units.records, store)
    focus = focus_cases(standings, "hardest-first", 0)
    case_refs = {case: store.put_bytes(orjson.dumps({"id": case})) for case in ("hard", "flaky")}
    files = context_files(store, write_context(store, focus, units.records, case_refs))
    assert sorted(files) == [
        "cases/flaky/case.json",
        "cases/flaky/judge.json",
        "cases/flaky/output/output.json",
        "cases/hard/case.json",
        "cases/hard/judge.json",
        "cases/hard/output/output.json",
        "index.json",
    ]
    # The lowest-scored baseline run is the one shown.
    assert files["cases/hard/output/output.json"] == b'{"action": "memory"}'
    assert orjson.loads(files["cases/hard/judge.json"])["reason"] == "wrong_action"
    assert files["cases/flaky/case.json"] == b'{"id":"flaky"}'
    index = orjson.loads(files["index.json"])
    assert [c["id"] for c in index["cases"]] == ["hard", "flaky"]
    assert index["complete"] is True and index["omitted_cases"] == 0
    assert index["cases"][0]["reason"] == "evidence"  # the standing's: its first failing run


def test_the_context_stays_within_its_byte_bound(store: BlobStore) -> None:
    units = Units(store)
    for n in range(30):
        units.add(f"case-{n:02d}", 0.0, reason="wrong_action", output=b"o" * 3000)
    standings = classify_cases(units.records, store)
    case_refs = {s.id: store.put_bytes(b"c" * 500) for s in standings}
    bound = 24 << 10
    files = context_files(store, write_context(store, standings, units.records, case_refs, bound))
    assert sum(len(data) for data in files.values()) <= bound
    index = orjson.loads(files["index.json"])
    assert index["complete"] is False and index["max_bytes"] == bound
    written = [c["id"] for c in index["cases"]]
    assert written == [f"case-{n:02d}" for n in range(len(written))]
    assert 0 < len(written) < 30 and index["omitted_cases"] == 30 - len(written)
    assert index["cases"][-1]["truncated"] is True
    assert not any(c["truncated"] for c in index["cases"][:-1])
    last = written[-1]
    assert len(files.get(f"cases/{last}/output/output.json", b"")) < 3000
    with pytest.raises(ValueError, match="max_bytes"):
        write_context(store, standings, units.records, case_refs, 100)


def test_a_flaky_case_that_passes_on_average_is_protected_not_fixed(store: BlobStore) -> None:
    """Pass score 0.5: runs 1 and 0 pass on average (the decision counts losing it as
    broken), so the prompt asks to protect it and keeps it out of the cases to fix; runs
    0.5 and 0 miss on average and stay a case to fix."""
    units = Units(store)
    for case, scores in {"keep": (1.0, 0.0), "fix": (0.5, 0.0), "solid": (1.0, 1.0)}.items():
        for score in scores:
            units.add(case, score, reason="half")
    standings = classify_cases(units.records, store, pass_threshold=0.5)
    assert {s.id: (s.category, s.passes) for s in standings} == {
        "keep": ("flaky", True),
        "fix": ("flaky", False),
        "solid": ("solid", True),
    }
    built = prompt(standings=standings, focus="all")
    assert built["protect"] == ["solid", "keep"]
    assert [f["id"] for f in built["failing"]] == ["fix"]
    assert built["flaky"] == ["keep", "fix"]  # the categories still say what the runs did
