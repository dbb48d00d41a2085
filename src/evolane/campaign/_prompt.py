"""What the optimizer is told: convergence, case standings, focus, the prompt and its context.

Everything here is a pure function of its inputs (and of store contents), so the same
campaign state always yields the same prompt bytes; only `write_context` writes files.
"""

from __future__ import annotations

import hashlib
import re
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal

import orjson
from pydantic import Field

from evolane.messages import ArtifactRef, Name, Record, ShortText
from evolane.store import BlobStore, FileEntry, SymlinkEntry, load_manifest, snapshot_tree
from evolane.views import Category, case_runs

Convergence = Literal["ok", "warn", "paradigm_shift", "stop"]
Focus = Literal["all", "cyclic", "hardest-first"]
FAILING: tuple[Category, ...] = ("always_failing", "flaky")
PROMPT_OPTIONS = orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2
_DETAIL_READ_BYTES = 64 << 10
_DIFF_FILE_BYTES = 1 << 20
_SHORT = 256


def convergence(stalled: int, stall: int) -> Convergence:
    """Where the search stands after ``stalled`` iterations in a row without an accepted
    candidate, against the ``stall`` limit (>= 1); checked in this order:

    ``stop`` when stalled >= stall; ``paradigm_shift`` when stalled == stall - 1 >= 1 (the
    last iteration before the limit); ``warn`` when 1 <= stalled and 2 * stalled >= stall;
    else ``ok``. So stall=1: ok, stop; stall=4: ok, ok, warn, paradigm_shift, stop.
    """
    if stall < 1:
        raise ValueError(f"stall must be at least 1, got {stall}")
    if stalled < 0:
        raise ValueError(f"stalled must not be negative, got {stalled}")
    if stalled >= stall:
        return "stop"
    if stalled >= 1 and stalled == stall - 1:
        return "paradigm_shift"
    if stalled >= 1 and 2 * stalled >= stall:
        return "warn"
    return "ok"


class CaseStanding(Record):
    """How the parent does on one case, from its baseline replays and their judgements."""

    id: Name
    category: Category
    score: float = Field(ge=0.0, le=1.0)  # the mean over scored runs (0 when none)
    runs: int = Field(ge=0)  # scored runs (a replay the parent itself failed scores 0)
    reason: ShortText = ""  # the judge's "reason" for a failing run, else a failure code
    passes: bool = False  # the mean reaches the pass score (`views.mean_passes`): to keep


def _ref(value: object) -> ArtifactRef | None:
    return ArtifactRef.model_validate(value) if isinstance(value, dict) else None


def _judge_reason(store: BlobStore, judge: dict[str, Any] | None) -> str:
    """The "reason" of a judge's stdout JSON, or "" (unreadable, absent, too large)."""
    ref = _ref((judge or {}).get("detail_ref"))
    if ref is None or ref.size > _DETAIL_READ_BYTES:
        return ""
    try:
        data = orjson.loads(store.read_bytes(ref))
    except (OSError, ValueError):
        return ""
    reason = data.get("reason") if isinstance(data, dict) else None
    return reason[:_SHORT] if isinstance(reason, str) else ""


def _failure_code(unit: dict[str, Any], or_status: bool = False) -> str:
    """The replay's (else the judge's) failure code; else the unit status if asked, or ""."""
    for part in ("replay", "judge"):
        failure = (unit.get(part) or {}).get("failure")
        if isinstance(failure, dict) and failure.get("code"):
            return str(failure["code"])[:_SHORT]
    return str(unit.get("status", ""))[:_SHORT] if or_status else ""


def classify_cases(
    units: list[dict[str, Any]],
    store: BlobStore,
    pass_threshold: float = 1.0,
    hints: Mapping[str, str] | None = None,
) -> list[CaseStanding]:
    """Standings of every case with a baseline-arm run, in order of first appearance.

    A run scores its judge score (a replay the parent failed on its own account scores 0).
    ``always_failing``: every scored run < ``pass_threshold``; ``solid``: every one >= it;
    ``flaky``: both; ``infra_errored``: no scored run, only infrastructure/judge failures.
    Cases whose runs never ran (not_run, blocked) are left out. A failing case whose judge
    gave no reason takes its ``hints`` entry (a recorded trace's excerpt), when it has one.
    """
    by_case: dict[str, list[dict[str, Any]]] = {}
    for unit in units:
        if unit.get("arm") == "baseline":
            by_case.setdefault(str(unit.get("case")), []).append(unit)
    standings = []
    for case_id, runs in by_case.items():
        hint = (hints or {}).get(case_id, "")
        standing = _standing(case_id, runs, store, pass_threshold, hint)
        if standing is not None:
            standings.append(standing)
    return standings


def _standing(
    case_id: str, runs: list[dict[str, Any]], store: BlobStore, threshold: float, hint: str = ""
) -> CaseStanding | None:
    sorted_runs = case_runs(runs, threshold)
    if sorted_runs is None:
        return None
    if sorted_runs.category == "infra_errored":
        reason = _failure_code(sorted_runs.infra[0], or_status=True)
        return CaseStanding(id=case_id, category="infra_errored", score=0.0, runs=0, reason=reason)
    reason = ""
    if sorted_runs.failing:
        unit = sorted_runs.failing[0][1]
        reason = _judge_reason(store, unit.get("judge")) or hint[:_SHORT] or _failure_code(unit)
    return CaseStanding(
        id=case_id,
        category=sorted_runs.category,
        score=sorted_runs.mean,
        runs=len(sorted_runs.scored),
        reason=reason,
        passes=sorted_runs.passes,
    )


def failing_cases(standings: list[CaseStanding]) -> list[CaseStanding]:
    """The cases the parent fails (by the mean rule), always failing or flaky, in order."""
    return [s for s in standings if s.category in FAILING and not s.passes]


def focus_cases(standings: list[CaseStanding], focus: str, iteration: int) -> list[CaseStanding]:
    """The failing cases the prompt emphasises this iteration: always_failing and flaky ones
    whose mean misses the pass score (a flaky case that passes on average is kept, not fixed).

    ``all``: every one, in standing order; ``cyclic``: one at a time, ``iteration % n``;
    ``hardest-first``: every one by mean score ascending, then id.
    """
    failing = failing_cases(standings)
    if focus == "all":
        return failing
    if focus == "cyclic":
        return [failing[iteration % len(failing)]] if failing else []
    if focus == "hardest-first":
        return sorted(failing, key=lambda s: (s.score, s.id))
    raise ValueError(f"unknown focus {focus!r}: expected all, cyclic or hardest-first")


_GUIDANCE: dict[str, str] = {
    "ok": "Make one focused, minimal change aimed at the most common failure reason.",
    "warn": "Progress has stalled: try a different kind of change than the rejected ones.",
    "paradigm_shift": (
        "This is the last attempt before the campaign stops for lack of progress: step back "
        "and try a fundamentally different approach, not a variation of a rejected diff."
    ),
    "stop": "The campaign has stalled; change nothing unless you are confident it helps.",
}


def _instructions(value: Convergence) -> str:
    return (
        "Edit the files of the working directory in place so that the cases in `failing` "
        "pass. Keep every case in `protect` passing, never touch `protected_paths`, and do "
        "not repeat any diff in `rejected`. Each failing case's input, current output and "
        "judge verdict are in the read-only folder $EVOLANE_CONTEXT_DIR (index.json first). "
        + _GUIDANCE[value]
    )


def encode_prompt(prompt: dict[str, Any]) -> bytes:
    """The canonical prompt file bytes (sorted keys, indented): what `build_prompt` bounds."""
    return orjson.dumps(prompt, option=PROMPT_OPTIONS)


def build_prompt(
    *,
    iteration: int,
    cycle: int,
    slot: int,
    focus: str,
    convergence: Convergence,
    standings: list[CaseStanding],
    rejected: list[tuple[str, str]],
    protected: list[str],
    max_bytes: int = 64 << 10,
    recorded: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """The optimizer's prompt as a JSON-able dict whose `encode_prompt` bytes fit ``max_bytes``.

    ``rejected`` holds (diff, reason) pairs, most recent last; the oldest are dropped first,
    then (if still too large) the tail of the solid, infra_errored, flaky, always_failing and
    failing lists.
    ``recorded`` (case id -> a recorded trace's excerpt, for a run from trajectories) adds
    ``recorded_failures``: the failure index of the cases shown (so never a held-out one),
    trimmed first.
    ``omitted`` counts what was dropped. Raises ValueError if even that cannot fit.
    """
    by_category = {c: [s.id for s in standings if s.category == c] for c in _CATEGORIES}
    lists: dict[str, list[Any]] = {}
    if recorded:
        shown = [s.id for s in standings if s.id in recorded]
        lists["recorded_failures"] = [{"id": i, "reason": recorded[i][:_SHORT]} for i in shown]
    lists |= {
        "rejected": [{"diff": diff, "reason": reason} for diff, reason in rejected],
        "solid": by_category["solid"],
        "infra_errored": by_category["infra_errored"],
        "flaky": by_category["flaky"],
        "always_failing": by_category["always_failing"],  # whatever the focus
        "failing": [
            {"id": s.id, "reason": s.reason, "score": round(s.score, 4)}
            for s in focus_cases(standings, focus, iteration)
        ],
    }
    fixed = {
        "iteration": iteration,
        "cycle": cycle,
        "slot": slot,
        "focus": focus,
        "convergence": convergence,
        "instructions": _instructions(convergence),
        "protected_paths": list(protected),
    }
    kept = {name: len(items) for name, items in lists.items()}
    passing_flaky = {s.id for s in standings if s.category == "flaky" and s.passes}

    def assemble() -> dict[str, Any]:
        prompt: dict[str, Any] = dict(fixed)
        for name, items in lists.items():
            keep = kept[name]
            prompt[name] = items[len(items) - keep :] if name == "rejected" else items[:keep]
        # what a candidate must not break: the cases that pass (as the decision counts them)
        prompt["protect"] = list(prompt["solid"]) + [
            i for i in prompt["flaky"] if i in passing_flaky
        ]
        prompt["omitted"] = {name: len(lists[name]) - kept[name] for name in lists}
        return prompt

    def fits() -> bool:
        return len(encode_prompt(assemble())) <= max_bytes

    for name in lists:  # the trimming order
        if fits():
            break
        kept[name] = _largest(kept[name], lambda keep, name=name: _with(kept, name, keep, fits))
    if not fits():
        raise ValueError(f"the optimizer prompt cannot fit in {max_bytes} bytes")
    return assemble()


_CATEGORIES: tuple[Category, ...] = ("always_failing", "flaky", "infra_errored", "solid")


def _with(kept: dict[str, int], name: str, keep: int, check: Callable[[], bool]) -> bool:
    """``check()`` with ``kept[name]`` set to ``keep`` (restored afterwards)."""
    before, kept[name] = kept[name], keep
    try:
        return check()
    finally:
        kept[name] = before


def _largest(high: int, ok: Callable[[int], bool]) -> int:
    """The largest k in [0, high] with ok(k) (ok is monotone: true up to some k); 0 if none."""
    low = 0
    while low < high:
        middle = (low + high + 1) // 2
        if ok(middle):
            low = middle
        else:
            high = middle - 1
    return low


# -- rejected-diff memory -----------------------------------------------------------------


def _lines(store: BlobStore, entry: FileEntry | SymlinkEntry | None) -> list[str] | None:
    """The entry's text lines ([] when absent), or None for a binary or very large file."""
    if entry is None:
        return []
    if isinstance(entry, SymlinkEntry):
        return [f"symlink -> {entry.target}"]
    if entry.size > _DIFF_FILE_BYTES:
        return None
    try:
        return store.read_bytes(entry.digest).decode("utf-8").splitlines()
    except UnicodeDecodeError:
        return None


def diff_lines(old: list[str], new: list[str]) -> list[str]:
    """``-line`` for each old line not in the new text, then ``+line`` for each new line not
    in the old text (each in its text's order)."""
    old_set, new_set = set(old), set(new)
    return [f"-{line}" for line in old if line not in new_set] + [
        f"+{line}" for line in new if line not in old_set
    ]


def clip_utf8(text: str, max_bytes: int) -> str:
    """``text`` cut to at most ``max_bytes`` UTF-8 bytes, never inside a character."""
    data = text.encode("utf-8")
    return text if len(data) <= max_bytes else data[:max_bytes].decode("utf-8", "ignore")


def edit_diff(
    store: BlobStore, parent_ref: ArtifactRef, candidate_ref: ArtifactRef, max_bytes: int = 4096
) -> str:
    """A compact, deterministic description of an edit, for the rejected-diff memory.

    For each added, removed or changed path in path order: ``"{path}\\n"`` then one
    ``"{line}\\n"`` per `diff_lines` line (a binary or >1 MiB file gets ``"~binary\\n"``);
    cut to ``max_bytes`` UTF-8 bytes.
    """
    old, new = load_manifest(store, parent_ref), load_manifest(store, candidate_ref)
    paths = sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p))
    parts: list[str] = []
    size = 0
    for path in paths:
        before, after = _lines(store, old.get(path)), _lines(store, new.get(path))
        body = ["~binary"] if before is None or after is None else diff_lines(before, after)
        block = f"{path}\n" + "".join(f"{line}\n" for line in body)
        parts.append(block)
        size += len(block.encode("utf-8"))
        if size > max_bytes:
            break
    return clip_utf8("".join(parts), max_bytes)


# -- the read-only context folder ----------------------------------------------------------

_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,127}$")
_HEADER_BYTES = 512
_ENTRY_SLACK = 96
_MIN_CASE_BYTES = 256


def _folder(case_id: str) -> str:
    if _SAFE_NAME.match(case_id):
        return case_id
    digest = hashlib.sha256(case_id.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return re.sub(r"[^A-Za-z0-9._-]", "_", case_id)[:64] + f"-{digest}"


def _representative(runs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The baseline run to show: the lowest-scored one with an output, else any with one."""

    def rank(unit: dict[str, Any]) -> tuple[int, float]:
        has_output = _ref((unit.get("replay") or {}).get("output_ref")) is not None
        score = unit.get("score")
        scored = isinstance(score, int | float)
        return (0 if has_output else 1, float(score) if scored else 2.0)

    return min(runs, key=rank) if runs else None


class _Budget:
    """Bytes left for the context's files; writes what fits, truncating the rest."""

    def __init__(self, store: BlobStore, left: int) -> None:
        self.store, self.left = store, left

    def write(self, ref: ArtifactRef, path: Path) -> bool:
        """Write up to ``left`` bytes of the blob; True when it had to cut (or skip) it."""
        if self.left <= 0:
            return True
        take = min(ref.size, self.left)
        with self.store.open(ref) as source:
            data = source.read(take)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        self.left -= len(data)
        return len(data) < ref.size


def write_context(
    store: BlobStore,
    standings: list[CaseStanding],
    units: list[dict[str, Any]],
    case_refs: Mapping[str, ArtifactRef],
    max_bytes: int = 1 << 20,
) -> ArtifactRef:
    """The optimizer's read-only context as a stored tree, at most ``max_bytes`` in all.

    For each failing standing in the given order (pass `focus_cases`): ``cases/<id>/case.json``
    (``case_refs[id]``: the case as the replay saw it), ``cases/<id>/judge.json`` (the judge
    detail) and ``cases/<id>/output/...`` (that baseline replay's output tree), plus
    ``index.json``. Files that do not fit are cut; cases that do not fit are left out, and
    index.json says so.
    """
    if max_bytes < _HEADER_BYTES + _MIN_CASE_BYTES:
        raise ValueError(f"max_bytes must be at least {_HEADER_BYTES + _MIN_CASE_BYTES}")
    failing = failing_cases(standings)
    store.tmp.mkdir(parents=True, exist_ok=True)  # the store's: a crash's leftover is swept
    with tempfile.TemporaryDirectory(prefix="context-", dir=store.tmp) as tmp:
        root = Path(tmp)
        budget = _Budget(store, max_bytes - _HEADER_BYTES)
        entries: list[dict[str, Any]] = []
        baseline: dict[str, list[dict[str, Any]]] = {}
        for record in units:
            if record.get("arm") == "baseline":
                baseline.setdefault(str(record.get("case")), []).append(record)
        for standing in failing:
            unit = _representative(baseline.get(standing.id, []))
            entry = _case_entry(standing, unit)
            cost = len(orjson.dumps(entry)) + _ENTRY_SLACK
            if budget.left < cost + _MIN_CASE_BYTES:
                break
            budget.left -= cost
            entry["truncated"] = _write_case(
                budget, root / "cases" / entry["folder"], case_refs.get(standing.id), unit
            )
            entries.append(entry)
        index = {
            "max_bytes": max_bytes,
            "complete": len(entries) == len(failing) and not any(e["truncated"] for e in entries),
            "omitted_cases": len(failing) - len(entries),
            "cases": entries,
        }
        (root / "index.json").write_bytes(orjson.dumps(index, option=orjson.OPT_SORT_KEYS))
        return snapshot_tree(store, root)


def _case_entry(standing: CaseStanding, unit: dict[str, Any] | None) -> dict[str, Any]:
    replay = (unit or {}).get("replay") or {}
    return {
        "id": standing.id,
        "folder": _folder(standing.id),
        "category": standing.category,
        "score": round(standing.score, 4),
        "runs": standing.runs,
        "reason": standing.reason,
        "unit": str((unit or {}).get("unit", ""))[:_SHORT],
        "replay_status": str(replay.get("status", ""))[:64],
        "truncated": False,
    }


def _write_case(
    budget: _Budget, folder: Path, case_ref: ArtifactRef | None, unit: dict[str, Any] | None
) -> bool:
    """Lay one case out under ``folder``; True when something did not fit."""
    folder.mkdir(parents=True)
    cut = False
    if case_ref is not None:
        cut |= budget.write(case_ref, folder / "case.json")
    judge_ref = _ref(((unit or {}).get("judge") or {}).get("detail_ref"))
    if judge_ref is not None:
        cut |= budget.write(judge_ref, folder / "judge.json")
    output_ref = _ref(((unit or {}).get("replay") or {}).get("output_ref"))
    if output_ref is not None:
        for path, entry in load_manifest(budget.store, output_ref).items():
            if isinstance(entry, FileEntry):
                cut |= budget.write(entry.ref, folder / "output" / path)
    return cut
