"""An oracle over what a run recorded: it reads a store's journal.jsonl, report.json (and
report.md) and each measurement's unit list, and decides every val measurement again from
README's and DESIGN §6's definitions, sharing no code with `evolane.stats` or
`evolane.measure`: how a unit counts (README "Replay", "Judge"), the gates with their tie
and SE = 0 rules, clusters, the coverage guard, the no-regression veto and online error
control's levels. Every disagreement is one line of `Audit.problems`.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Scores = dict[str, list[float]]
"""Per case id, the scores of its repetitions that count."""
TOLERANCE = 1e-12


def read_run(store: Path) -> tuple[Path, list[dict[str, Any]], dict[str, Any]]:
    """The store's one run: its folder, journal records and report."""
    (run,) = sorted((store / "runs").iterdir())
    journal = [json.loads(line) for line in (run / "journal.jsonl").read_text().splitlines()]
    return run, journal, json.loads((run / "report.json").read_text())


def blob(store: Path, digest: str) -> bytes:
    """A stored object's bytes, checked against its digest."""
    hexdigest = digest.split(":", 1)[1]
    data = (store / "objects" / "sha256" / hexdigest[:2] / hexdigest).read_bytes()
    assert hashlib.sha256(data).hexdigest() == hexdigest
    return data


def unit_score(record: dict[str, Any], arm: str) -> float | None:
    """A unit's score as README says it counts for ``arm``: the judge's score; 0 when the
    tree broke its replay; 0 for a candidate unit its replay or judge left unscored (unless
    the spawn never started, the run stopped it or a model endpoint failed); else None."""
    replay, judge = record["replay"], record.get("judge") or {}
    failure = replay.get("failure") or {}
    if failure.get("owner") == "candidate":
        return 0.0
    if replay["status"] == "succeeded" and judge.get("status") == "succeeded":
        return float(judge["score"])
    if arm != "candidate" or replay["status"] in ("cancelled", "blocked", "not_run"):
        return None
    if replay["status"] != "succeeded":
        return None if failure.get("code", "").endswith("spawn_failed") else 0.0
    code = (judge.get("failure") or {}).get("code", "")
    if judge.get("status") != "failed" or code.endswith("spawn_failed"):
        return None
    return None if code == "judge_endpoint_failed" else 0.0


def mean_se(values: list[float]) -> tuple[float, float]:
    """Mean and standard error (sample sd, n - 1, over sqrt(n)) of ``values``."""
    n = len(values)
    mean = math.fsum(values) / n
    if n < 2 or all(v == values[0] for v in values):
        return mean, 0.0
    return mean, math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (n - 1) / n)


def above(a: float, b: float) -> bool:
    """a > b beyond a 1e-12 tolerance: a tie is not above."""
    return a > b and not math.isclose(a, b, rel_tol=TOLERANCE, abs_tol=TOLERANCE)


@dataclass(frozen=True)
class Verdict:
    """The oracle's decision on a measurement, with what it read."""

    decision: str
    n: int
    mean: float
    se: float


def rule(gate: dict[str, Any], base: Scores, cand: Scores, planned: list[str],
         clusters: dict[str, str]) -> Verdict:  # fmt: skip
    """DESIGN §6: repetitions averaged per case, cases (or clusters, for paired and
    bootstrap) the sample; coverage, then the veto, then the gate's rule. A bootstrap
    verdict is ``bootstrap``: its interval is read from the record."""
    ids = sorted(c for c in planned if base.get(c) and cand.get(c))
    b = {c: math.fsum(base[c]) / len(base[c]) for c in ids}
    k = {c: math.fsum(cand[c]) / len(cand[c]) for c in ids}
    unit = sample_units(gate, planned, clusters)
    groups: dict[str, list[str]] = defaultdict(list)
    for c in ids:
        groups[unit[c]].append(c)
    deltas = [math.fsum(k[c] - b[c] for c in g) / len(g) for g in groups.values()]
    enough = max(2, gate["min_cases"]), gate["min_coverage"] * len(set(unit.values()))
    if len(deltas) < enough[0] or len(deltas) < enough[1] - TOLERANCE:
        return Verdict("indecisive", len(ids), 0.0, 0.0)
    mean, se = mean_se(deltas)
    if gate["no_regression"] and any(regression(base[c], cand[c], gate) for c in ids):
        return Verdict("reject", len(ids), mean, se)
    floor, name = gate["min_effect"], gate["gate"]
    if name == "paired":
        bar = max(0.0, floor) if se == 0 else gate["k_se"] * se
        ok = above(mean, bar) and above(mean, floor)
    elif name == "strict":
        ok = all(d >= -TOLERANCE for d in deltas) and any(d > TOLERANCE for d in deltas)
    elif name == "threshold":
        score, bar = math.fsum(k.values()) / len(k), gate["threshold"]
        ok = (score >= bar or math.isclose(score, bar)) and above(mean, 0.0)
    else:
        return Verdict("bootstrap", len(ids), mean, se)
    return Verdict("accept" if ok else "reject", len(ids), mean, se)


def sample_units(gate: dict[str, Any], planned: list[str], clusters: dict[str, str]) -> dict:
    """Per planned case, the unit of the sample it belongs to: its cluster when two cases
    share one and the gate is paired or bootstrap (README: those count clusters), else itself."""
    named = {clusters.get(c, c) for c in planned}
    if gate["gate"] in ("paired", "bootstrap") and len(named) < len(planned):
        return {c: clusters.get(c, c) for c in planned}
    return {c: c for c in planned}


def regression(base: list[float], cand: list[float], gate: dict[str, Any]) -> bool:
    """The parent passed every repetition, the candidate failed every one, and Fisher's
    exact p = 1 / C(rb + rc, rb) is at most regression_alpha."""
    bar = gate["pass_score"] - TOLERANCE
    if not all(s >= bar for s in base) or any(s >= bar for s in cand):
        return False
    p = 1 / math.comb(len(base) + len(cand), len(base))
    return p <= gate["regression_alpha"] * (1 + TOLERANCE)


def sign_test(base: Scores, cand: Scores) -> float | None:
    """The one-sided sign test's p of "no gain" on pass/fail cases of one repetition each
    (README: what online control reads there); None for other scores."""
    ids = [c for c in base if base[c] and cand.get(c)]
    if any(len(base[c]) != 1 or len(cand[c]) != 1 for c in ids):
        return None
    if any(s not in (0.0, 1.0) for c in ids for s in (*base[c], *cand[c])):
        return None
    fixed = sum(1 for c in ids if cand[c][0] > base[c][0])
    moved = sum(1 for c in ids if cand[c][0] != base[c][0])
    return math.fsum(math.comb(moved, j) for j in range(fixed, moved + 1)) / 2**moved


@dataclass
class Audit:
    """What the oracle found in one run: failed checks, and each candidate's decision."""

    problems: list[str] = field(default_factory=list)
    decisions: dict[str, str] = field(default_factory=dict)
    tried: list[tuple[float, str]] = field(default_factory=list)
    """(true shift, decision) per candidate measured."""
    judge_failed: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    pairs: dict[str, tuple[Scores, Scores]] = field(default_factory=dict)

    def check(self, ok: bool, what: str) -> None:
        """Note ``what`` when ``ok`` is false."""
        if not ok:
            self.problems.append(what)


@dataclass(frozen=True)
class Run:
    """What a run recorded, as the oracle reads it."""

    store: Path
    folder: Path
    units: dict[str, dict[str, Any]]
    replays: dict[str, dict[str, Any]]
    """Replays journaled before their judge ended, by unit id."""
    trees: dict[str, str | None]
    report: dict[str, Any]
    clusters: dict[str, str]

    @property
    def gate(self) -> dict[str, Any]:
        """The run's frozen gate settings."""
        return self.report["config"]["gate"]


def audit_run(store: Path, dataset: Path) -> Audit:
    """Check every val measurement of the store's one run against the oracle."""
    folder, journal, report = read_run(store)
    audit = Audit()
    units = [r for r in journal if r["type"] == "unit"]
    _check_attempts(audit, units)
    trees = {
        r["slot"]: (r["result"].get("tree_ref") or {}).get("digest")
        for r in journal
        if r["type"] == "proposal"
    }
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    clusters = {r["id"]: (r.get("metadata") or {}).get("cluster", r["id"]) for r in rows}
    replays = {r["unit"]: r for r in journal if r["type"] == "replay"}
    run = Run(store, folder, {r["unit"]: r for r in units}, replays, trees, report, clusters)
    decided = {(d["cycle"], d["iteration"], d["slot"]): d for d in report["decisions"]}
    for m in report["measurements"]:
        _check_counts(audit, run, m)
        if m["purpose"] == "final_test":
            _audit_confirmation(audit, run, m)
        if m["purpose"] != "paired" or m["split"] != "val" or m["slot"] is None:
            continue
        again = m["measurement_id"].endswith(".recheck")  # online control measured it again
        slot = None if again else decided.get((m["cycle"], m["iteration"], m["slot"]))
        _audit_measurement(audit, run, m, slot)
    _check_replays(audit, run)
    if report.get("online"):
        _audit_online(audit, report)
    _check_markdown(audit, folder, report)
    return audit


def _check_attempts(audit: Audit, units: list[dict[str, Any]]) -> None:
    """A unit has one record, its outcome, unless a stop cut it short (a Ctrl-C, then
    ``--resume``): then a ``cancelled`` record per attempt cut (what it spent: README "Spend
    by role") before its outcome, which alone counts (``Run.units``: each unit's last)."""
    last = {r["unit"]: index for index, r in enumerate(units)}
    earlier = [r for index, r in enumerate(units) if index != last[r["unit"]]]
    uncut = sorted({r["unit"] for r in earlier if r["status"] != "cancelled"})
    audit.check(not uncut, f"{len(uncut)} unit(s) journaled twice: {uncut[:3]}")


def _check_counts(audit: Audit, run: Run, m: dict[str, Any]) -> None:
    """A measurement's unit counts are those of its unit list, and each unit it ran is in
    the journal under it, as it ended."""
    mid, listed = m["measurement_id"], json.loads(blob(run.store, m["units_ref"]["digest"]))
    ran = [u for u in listed if not u["reused"] and not u["restored"]]
    ran = [u for u in ran if u["status"] not in ("blocked", "not_run")]
    counts = (len(ran), sum(u["reused"] for u in listed), sum(u["restored"] for u in listed))
    recorded = (m["units_run"], m["units_reused"], m["units_restored"])
    audit.check(counts == recorded, f"{mid}: units run/reused/restored {recorded}, list {counts}")
    for unit in ran + [u for u in listed if u["restored"]]:
        journaled = run.units.get(unit["unit"])  # a replay record alone: no outcome
        audit.check(
            journaled is not None and journaled["measurement"] == mid,
            f"{mid}: {unit['unit']} ran but has no unit record under it",
        )
        if unit["status"] == "cancelled" and journaled is not None:
            audit.check(journaled["status"] == "cancelled", f"{mid}: {unit['unit']} as journaled")


def _check_replays(audit: Audit, run: Run) -> None:
    """Each replay journaled before its judgement, in a measurement the run reports, has its
    unit's record (the outcome: a judge a stop cut is ``cancelled``), a resumed session's
    too when its stop came before it began that unit (its replay was charged as it resumed)."""
    listed = set()
    for m in run.report["measurements"]:
        listed.update(u["unit"] for u in json.loads(blob(run.store, m["units_ref"]["digest"])))
    alone = sorted(u for u in run.replays if u in listed and u not in run.units)
    audit.check(not alone, f"{len(alone)} replay record(s) without a unit record: {alone[:3]}")


def _audit_measurement(audit: Audit, run: Run, m: dict[str, Any], slot: dict | None) -> None:
    """One paired measurement: its units' scores, pairs, statistics and decision."""
    mid = m["measurement_id"]
    base, cand, planned = _pairs(audit, run, m, run.trees.get(mid.removesuffix(".recheck")))
    verdict = rule(run.gate, base, cand, planned, run.clusters)
    if m["status"] == "early_stopped":  # decided on the cases read up to its cutoff
        found = _some_prefix(run, base, cand, planned, m)
        audit.check(
            found, f"{mid}: no {m['n']} of the {verdict.n} comparable cases give its numbers"
        )
        online = run.report["config"]["error_control"] == "online"
        audit.check(not (online and m["decision"] == "accept"), f"{mid}: accepted early, online")
    else:
        _check_full(audit, run, m, verdict)
    if slot is not None:
        _keep(audit, run, m, slot)


def _pairs(
    audit: Audit, run: Run, m: dict[str, Any], candidate_tree: str | None
) -> tuple[Scores, Scores, list[str]]:
    """A measurement's scores that count, per arm and case (each checked against its journal
    record, its case and its tree), and its planned cases."""
    mid = m["measurement_id"]
    base: Scores = defaultdict(list)
    cand: Scores = defaultdict(list)
    parents = set()
    listed = json.loads(blob(run.store, m["units_ref"]["digest"]))
    for unit in listed:
        if unit["status"] in ("cancelled", "blocked", "not_run"):
            continue  # stopped, or past an early stop's cutoff (maybe run before a kill)
        # A reused unit's results name the unit that ran them: its judge (a success's), or
        # its replay too (a failure reused, README "How a candidate is decided").
        ran = unit.get("judge") or unit.get("replay") or {}
        origin = run.units.get(ran.get("unit_id") or unit["unit"])
        if origin is None:
            audit.check(False, f"{mid}: {unit['unit']} ({unit['status']}) is in no journal record")
            continue
        case, arm = unit["case"], unit["arm"]
        audit.check(origin["replay"]["case_id"] == case, f"{mid}: {unit['unit']} of another case")
        score = unit_score(origin, arm)
        audit.check(
            score == unit.get("score"), f"{mid}: {unit['unit']} {unit.get('score')}, oracle {score}"
        )
        if arm == "candidate":
            audit.check(origin["tree"] == candidate_tree, f"{mid}: a unit of another tree")
        else:
            parents.add(origin["tree"])
        if score is not None:
            (cand if arm == "candidate" else base)[case].append(score)
        audit.judge_failed[arm] += (origin.get("judge") or {}).get("status") == "failed"
    audit.check(len(parents) <= 1, f"{mid}: baseline units of {len(parents)} trees")
    audit.pairs[mid] = (base, cand)
    return base, cand, sorted({u["case"] for u in listed})


def _audit_confirmation(audit: Audit, run: Run, m: dict[str, Any]) -> None:
    """README "Confirm before publish": the best against the seed on the test split; on
    pass/fail cases of one repetition (margin 0) p is the sign test's; confirmed iff
    p <= level; n and the mean delta are those of the pairs."""
    found = run.report.get("confirmation")
    if not found or m["status"] != "complete":
        return
    base, cand, _ = _pairs(audit, run, m, run.report["best"]["digest"])
    ids = [c for c in base if base[c] and cand.get(c)]
    deltas = [math.fsum(cand[c]) / len(cand[c]) - math.fsum(base[c]) / len(base[c]) for c in ids]
    mean = math.fsum(deltas) / len(ids) if ids else 0.0
    audit.check(found["n"] == len(ids), f"confirmation: n {found['n']}, pairs {len(ids)}")
    same = math.isclose(found["mean_delta"], mean, abs_tol=1e-9)
    audit.check(same, f"confirmation: mean {found['mean_delta']}, oracle {mean}")
    p, sign = found["p_value"], sign_test(base, cand)
    audit.check(sign is None or math.isclose(p, sign), f"confirmation: p {p}, sign test {sign}")
    confirmed = p <= found["level"] * (1 + TOLERANCE)
    audit.check(
        (found["decision"] == "confirmed") == confirmed,
        f"confirmation: {found['decision']}, p {p} against level {found['level']}",
    )


def _check_full(audit: Audit, run: Run, m: dict[str, Any], verdict: Verdict) -> None:
    """A measurement of every case: n, mean, SE and decision are the oracle's."""
    mid, decision = m["measurement_id"], verdict.decision
    audit.check(m["n"] == verdict.n, f"{mid}: n {m['n']}, oracle {verdict.n}")
    if decision != "indecisive":
        same = math.isclose(m["mean_delta"], verdict.mean, abs_tol=1e-9)
        audit.check(same, f"{mid}: mean {m['mean_delta']}, oracle {verdict.mean}")
        same = math.isclose(m["se"], verdict.se, abs_tol=1e-9)
        audit.check(same, f"{mid}: SE {m['se']}, oracle {verdict.se}")
    if decision == "bootstrap":
        decision = "accept" if above(m["ci_low"], run.gate["min_effect"]) else "reject"
        inside = m["ci_low"] - 1e-12 <= verdict.mean <= m["ci_high"] + 1e-12
        audit.check(inside, f"{mid}: mean {verdict.mean} outside its CI")
    audit.check(
        m["decision"] == decision, f"{mid}: {m['decision']} ({m['reason']}), oracle {decision}"
    )


def _some_prefix(run: Run, base: Scores, cand: Scores, planned: list[str], m: dict) -> bool:
    """Whether the comparable cases of some whole units of the sample (clusters, else cases:
    README, early stop reads and stops at a cluster's end) give the early-stopped
    measurement's n, mean and SE: every unit with a case its stop cut (a unit cancelled or
    not run) left out, and up to 6 of the others (run to their end past the cutoff)."""
    ids = sorted(c for c in planned if base.get(c) and cand.get(c))
    unit = sample_units(run.gate, planned, run.clusters)
    listed = json.loads(blob(run.store, m["units_ref"]["digest"]))
    cut = {unit[u["case"]] for u in listed if u["status"] in ("cancelled", "not_run")}
    whole = sorted({unit[c] for c in ids} - cut)
    gate = run.gate | {"no_regression": False}
    for size in range(min(6, len(whole)) + 1):
        for dropped in itertools.combinations(whole, size):
            kept = [c for c in ids if unit[c] not in cut and unit[c] not in dropped]
            if len(kept) != m["n"]:
                continue
            verdict = rule(gate, base, {c: cand[c] for c in kept}, planned, run.clusters)
            mean = math.isclose(verdict.mean, m["mean_delta"], abs_tol=1e-9)
            se = math.isclose(verdict.se, m["se"], abs_tol=1e-9)
            if verdict.decision != "indecisive" and mean and se:
                return True
    return False


def _keep(audit: Audit, run: Run, m: dict[str, Any], slot: dict[str, Any]) -> None:
    """The report's decision of the slot is its measurement's (or online control's), kept
    with the candidate's true shift."""
    mid, decision = m["measurement_id"], slot["decision"]
    other = "online" in slot["reason"] or "unscored" in slot["reason"]
    audit.check(
        decision == m["decision"] or other, f"{mid}: report {decision}, measured {m['decision']}"
    )
    audit.decisions[mid] = decision
    audit.tried.append((shift_of(run.store, run.trees.get(mid)), decision))


def _audit_online(audit: Audit, report: dict[str, Any]) -> None:
    """README "Online error control": candidate i's level is alpha / H plus the level of the
    one before when it was accepted; accepted iff the gate accepts and p <= level; the
    report's decision is that one; on pass/fail pairs of one repetition, p is the sign test's."""
    online, config = report["online"], report["config"]
    horizon = config["iterations"] * config["population"] * config["max_improvement_cycles"]
    audit.check(online["horizon"] == horizon, f"online horizon {online['horizon']} != {horizon}")
    slots = {f"c{d['cycle']}.i{d['iteration']}.s{d['slot']}": d for d in report["decisions"]}
    earlier = 0.0
    for test in online["tests"]:
        name, p = test["slot"], test["p_value"]
        level = online["alpha"] / horizon + earlier
        audit.check(
            math.isclose(test["level"], level), f"{name}: level {test['level']}, oracle {level}"
        )
        ok = test["gate"] == "accept" and p is not None and p <= level * (1 + TOLERANCE)
        audit.check(
            test["decision"] == ("accept" if ok else "reject"), f"{name}: online {test['decision']}"
        )
        decided = slots.get(name, {}).get("decision")
        audit.check(
            decided == test["decision"], f"{name}: report {decided}, online {test['decision']}"
        )
        earlier = level if test["decision"] == "accept" else 0.0
        base, cand = audit.pairs.get(name + ".recheck") or audit.pairs.get(name, ({}, {}))
        sign = sign_test(base, cand) if p is not None and base else None
        exact = sign is None or config["gate"]["min_effect"] > 0 or math.isclose(p, sign)
        audit.check(exact, f"{name}: p {p}, sign test {sign}")


def _check_markdown(audit: Audit, folder: Path, report: dict[str, Any]) -> None:
    """report.md's Measurements table says what report.json does."""
    rows = {}
    for line in (folder / "report.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 7 and cells[0].startswith("c") and "/" in cells[6]:
            rows[cells[0]] = cells
    for m in report["measurements"]:
        cells = rows.get(m["measurement_id"])
        want = [f"{m['n']}/{m['n_planned']}", f"{m['mean_delta']:+.3f}", m["decision"]]
        want.append(f"{m['units_run']}/{m['units_reused']}/{m['units_restored']}")
        got = None if cells is None else [cells[1], cells[2], cells[5].split()[0], cells[6]]
        audit.check(got == want, f"report.md {m['measurement_id']}: {got}, report.json {want}")


def shift_of(store: Path, tree: str | None) -> float:
    """The shift a candidate tree holds (tests/audit_helpers.py: its true effect)."""
    if tree is None:
        return math.nan
    manifest = json.loads(blob(store, tree))
    text = blob(store, manifest["shift.txt"]["digest"]).decode()
    return float(text.split()[0].partition("/")[0])


def paid_twice(log: Path, journaled_before: Iterable[str], names: dict[str, str]) -> list[str]:
    """Units journaled before a kill whose replay ran again after it (``log``: one name per
    finished replay; ``names``: replay name -> unit id)."""
    counts: dict[str, int] = defaultdict(int)
    for name in log.read_text().split():
        counts[names.get(name, name)] += 1
    return sorted(u for u in journaled_before if counts.get(u, 0) > 1)
