"""Decisions you can trust (issue 16): a seeded simulation through `evolane.stats`.

Every decision below is made by the real code (`decide`, `EarlyStop`, `confirm`,
`OnlineErrorControl`, `case_order`, `regressions`, `bootstrap_ci`); only the replays are
simulated. Model: pass/fail scores, one repetition; each case passes for the parent with a
probability drawn from a mixture (35% solid at 0.97, 35% hard at 0.03, 30% flaky, uniform in
0.2-0.8); a candidate with true effect d raises each case's pass probability by
2d * (1 - p) (so the mean gain over the case population is d); a useless candidate leaves
it unchanged. Rates carry 95% Wilson intervals.

    python benchmarks/decisions.py            # the full grid, a few minutes
    python benchmarks/decisions.py --quick    # a smoke run, seconds
    python benchmarks/decisions.py --only per_campaign,online_power   # error control alone
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from evolane.messages import GateConfig
from evolane.stats import (
    EarlyStop,
    OnlineErrorControl,
    bootstrap_ci,
    case_order,
    confirm,
    decide,
    min_acceptable_gain,
    no_gain_p_value,
    normal_cdf,
    regressions,
)

Scores = dict[str, list[float]]


# --- the model ---------------------------------------------------------------------------


def draw_cases(rng: np.random.Generator, n: int) -> np.ndarray:
    """Each case's pass probability for the parent."""
    kind = rng.choice(3, size=n, p=[0.35, 0.35, 0.30])
    flaky = rng.uniform(0.2, 0.8, size=n)
    return np.where(kind == 0, 0.97, np.where(kind == 1, 0.03, flaky))


def improve(p: np.ndarray, effect: float) -> np.ndarray:
    """A candidate with mean gain ``effect`` over the case population (effect < 0 harms)."""
    if effect >= 0:
        return p + 2.0 * effect * (1.0 - p)
    return p + 2.0 * effect * p


def adversarial(p: np.ndarray) -> np.ndarray:
    """Helps the first half of the file, hurts the second half: zero effect overall."""
    half = p.size // 2
    return np.concatenate([improve(p[:half], 0.25), improve(p[half:], -0.25)])


def replay(rng: np.random.Generator, p: np.ndarray, reps: int = 1) -> np.ndarray:
    """Pass/fail scores, one row of ``reps`` repetitions per case."""
    return (rng.random((p.size, reps)) < p[:, None]).astype(float)


def as_scores(ids: list[str], scores: np.ndarray) -> Scores:
    """The per-case score lists `decide` takes."""
    return dict(zip(ids, scores.tolist(), strict=True))


def case_ids(n: int) -> list[str]:
    """Case ids in file order."""
    return [f"case{i:04d}" for i in range(n)]


# --- one measurement through evolane.stats -----------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """One candidate's measurement: the full evaluation and the early-stopped one."""

    full: str
    final: str
    stopped: bool
    spent: int
    deltas: np.ndarray


def measure(
    base: np.ndarray,
    cand: np.ndarray,
    order: list[int],
    config: GateConfig,
    *,
    allow_accept: bool = True,
) -> Outcome:
    """Run EarlyStop over the cases in ``order`` (indices) and decide() on every case."""
    deltas = cand.mean(axis=1) - base.mean(axis=1)
    stop = EarlyStop(config, len(order), allow_accept=allow_accept)
    for delta in deltas[order].tolist():
        if stop.update(delta) is not None:
            break
    ids = case_ids(base.shape[0])
    full = decide(as_scores(ids, base), as_scores(ids, cand), config).decision
    final = stop.decision if stop.decision is not None else full
    return Outcome(full, final, stop.decision is not None, stop.seen, deltas)


def seeded(n: int, seed: int) -> list[int]:
    """The indices of ``n`` cases in `case_order` for ``seed``."""
    ids = case_ids(n)
    index = {case: i for i, case in enumerate(ids)}
    return [index[case] for case in case_order(ids, seed)]


# --- reporting ---------------------------------------------------------------------------


def wilson(hits: int, trials: int) -> tuple[float, float, float]:
    """Rate and 95% Wilson interval."""
    if trials == 0:
        return math.nan, math.nan, math.nan
    z, rate = 1.959964, hits / trials
    centre = (rate + z * z / (2 * trials)) / (1 + z * z / trials)
    half = z * math.sqrt(rate * (1 - rate) / trials + z * z / (4 * trials**2))
    half /= 1 + z * z / trials
    return rate, max(0.0, centre - half), min(1.0, centre + half)


def fmt(hits: int, trials: int) -> str:
    """'12.3% [10.1, 14.8]'."""
    rate, low, high = wilson(hits, trials)
    return f"{100 * rate:5.1f}% [{100 * low:5.1f},{100 * high:5.1f}]"


TARGETS: list[tuple[str, bool, str]] = []


def target(name: str, met: bool, detail: str) -> None:
    """Remember a target of issue 16 for the summary."""
    TARGETS.append((name, met, detail))


def gate_config(gate: str, k: float) -> GateConfig:
    """The gate at the one-sided level of k: paired k*SE, bootstrap at confidence 2Phi(k)-1."""
    if gate == "paired":
        return GateConfig(k_se=k, bootstrap_samples=200)
    return GateConfig(gate="bootstrap", confidence=2 * normal_cdf(k) - 1, bootstrap_samples=1000)


# --- 0. preflight -------------------------------------------------------------------------


def preflight() -> None:
    """The smallest gain each gate can accept (pass/fail scores, one repetition)."""
    print("## 0. Preflight: net cases a candidate must fix (none broken) to be accepted")
    print(
        "   val cases   "
        + "   ".join(f"{g} k={k:g}" for g in ("paired", "bootstrap") for k in (1, 2, 3))
    )
    for n in (7, 8, 10, 16, 32, 100):
        cells = []
        for gate in ("paired", "bootstrap"):
            for k in (1.0, 2.0, 3.0):
                config = gate_config(gate, k).model_copy(update={"bootstrap_samples": 10_000})
                gain = min_acceptable_gain(config, n)
                cells.append(f"{gain.units if gain.possible else 'never':>{len(gate) + 4}}")
        print(f"   {n:9d}   " + "   ".join(cells))


# --- 1. per-candidate rates and early/full agreement -------------------------------------


def per_candidate(trials: int, seed: int) -> None:
    """False-accept rate under the null, power at +0.10 / +0.15, early/full agreement."""
    print("\n## 1. Per candidate: accept rate (full evaluation, and with early stop), agreement")
    print("   gate       k    n  effect  accept (full)          accept (early stop)    agree")
    print("   " + "-" * 96)
    worst_agree: tuple[float, str] = (1.0, "")
    worst_null = 0.0
    for gate in ("paired", "bootstrap"):
        for k in (1.0, 2.0, 3.0):
            config = gate_config(gate, k)
            for n in (10, 30, 100):
                for effect in (0.0, 0.10, 0.15):
                    rng = np.random.default_rng([seed, n, int(100 * effect), int(k), len(gate)])
                    full = final = agree = spent = 0
                    for trial in range(trials):
                        p = draw_cases(rng, n)
                        base, cand = replay(rng, p), replay(rng, improve(p, effect))
                        out = measure(base, cand, seeded(n, trial), config)
                        full += out.full == "accept"
                        final += out.final == "accept"
                        agree += out.final == out.full
                        spent += out.spent
                    label = f"{gate} k={k:g} n={n} effect={effect:+.2f}"
                    rate = wilson(agree, trials)[0]
                    if rate < worst_agree[0]:
                        worst_agree = (rate, label)
                    if effect == 0.0:
                        worst_null = max(worst_null, final / trials)
                    print(
                        f"   {gate:9s} {k:3g} {n:4d}  {effect:+.2f}   {fmt(full, trials)}  "
                        f"{fmt(final, trials)}  {fmt(agree, trials)}  spent "
                        f"{100 * spent / (trials * n):3.0f}%"
                    )
    target(
        "early/full agreement >= 99% in every cell",
        worst_agree[0] >= 0.99,
        f"lowest {100 * worst_agree[0]:.1f}% ({worst_agree[1]})",
    )


def power_at_defaults(trials: int, seed: int) -> None:
    """Per-candidate power at +0.15 with 32 val cases, default gate."""
    config = GateConfig(bootstrap_samples=200)
    rng = np.random.default_rng([seed, 32])
    hits = 0
    for trial in range(trials):
        p = draw_cases(rng, 32)
        base, cand = replay(rng, p), replay(rng, improve(p, 0.15))
        hits += measure(base, cand, seeded(32, trial), config).final == "accept"
    print(f"\n   defaults (paired k=1), 32 val cases, +0.15: power {fmt(hits, trials)}")
    target("power at +0.15 with 32 val cases >= 60%", hits / trials >= 0.6, fmt(hits, trials))


def online_p(deltas: np.ndarray) -> float:
    """The p-value online control reads for pass/fail scores, as a campaign reads it."""
    return no_gain_p_value(deltas, pass_fail=True)


def online_power(trials: int, seed: int) -> None:
    """Per-candidate power at +0.15 with 32 val cases under online error control at the
    defaults (alpha 0.05 over 8 iterations x 2 slots: level 0.05/16; no early accept)."""
    config = GateConfig(bootstrap_samples=200)
    rng = np.random.default_rng([seed, 32, 7])
    level = OnlineErrorControl(0.05, horizon=16).level_for_next()
    hits = {0.15: 0, 0.25: 0}
    for effect in hits:
        for trial in range(trials):
            p = draw_cases(rng, 32)
            base, cand = replay(rng, p), replay(rng, improve(p, effect))
            out = measure(base, cand, seeded(32, trial), config, allow_accept=False)
            hits[effect] += out.final == "accept" and online_p(out.deltas) <= level
    print(
        f"   online control (no test split, level {level:.2g} = 0.05/16), 32 val cases: power "
        f"{fmt(hits[0.15], trials)} at +0.15, {fmt(hits[0.25], trials)} at +0.25"
    )


# --- 2. per campaign ---------------------------------------------------------------------


@dataclass
class Campaign:
    """One simulated campaign's settings."""

    policy: str  # none | confirm | online
    good_at: int | None  # which candidate (1-based) is a true +0.15, None: all useless
    n_val: int = 32
    n_test: int = 16
    test_reps: int = 1
    candidates: int = 16


def run_campaign(rng: np.random.Generator, c: Campaign, seed: int) -> tuple[bool, bool]:
    """(published anything, published a true improvement) for one hill-climbing campaign."""
    config = GateConfig(bootstrap_samples=200)  # the paired gate's CI is reported, not used
    p_val, p_test = draw_cases(rng, c.n_val), draw_cases(rng, c.n_test)
    original_test = p_test
    order = seeded(c.n_val, seed)
    online = OnlineErrorControl(0.05, horizon=c.candidates) if c.policy == "online" else None
    base = replay(rng, p_val)  # the parent's val replays, reused across candidates
    improved = accepted = False
    for index in range(1, c.candidates + 1):
        good = index == c.good_at
        q_val = improve(p_val, 0.15) if good else p_val
        q_test = improve(p_test, 0.15) if good else p_test
        cand = replay(rng, q_val)
        out = measure(base, cand, order, config, allow_accept=online is None)
        decision = out.final
        if online is not None:
            p = 1.0 if out.stopped else online_p(out.deltas)
            decision = online.record(out.final, p_value=p).decision
        if decision == "accept":
            accepted, improved = True, improved or good
            p_val, p_test = q_val, q_test
            base = replay(rng, p_val)
    if not accepted:
        return False, False
    if c.policy == "confirm":
        test = case_ids(c.n_test)
        before = replay(rng, original_test, c.test_reps)
        after = replay(rng, p_test, c.test_reps)
        verdict = confirm(as_scores(test, before), as_scores(test, after), config, pass_fail=True)
        published = verdict.decision == "confirmed"
        return published, published and improved
    return True, improved


ONLY_POLICY = ""
"""Set by ``--policy``: run only this policy's rows (none, confirm or online)."""
POLICIES: list[tuple[str, str, dict[str, int]]] = [
    ("none (today: publish any accepted best)", "none", {}),
    ("confirm on 16 test cases at 0.95 (default)", "confirm", {}),
    ("confirm on 16 test cases x 3 (explicit) reps", "confirm", {"test_reps": 3}),
    ("confirm on 32 test cases", "confirm", {"n_test": 32}),
    ("online fallback, alpha 0.05 over 16, no test", "online", {}),
    ("online fallback, as above, 100 val cases", "online", {"n_val": 100}),
    ("confirm on 64 test cases", "confirm", {"n_test": 64}),
]


def per_campaign(campaigns: int, seed: int) -> None:
    """False-publish rate (16 useless candidates) and power (one +0.15 among 16)."""
    print("\n## 2. Per campaign: 16 candidates, hill-climbing, 32 val cases, defaults (k=1)")
    print(
        "   policy                                         false publish (16 useless)  "
        "publishes a true +0.15 (1 of 16)"
    )
    for index, (name, policy, extra) in enumerate(POLICIES):
        if ONLY_POLICY and policy != ONLY_POLICY:
            continue
        rng = np.random.default_rng([seed, index])
        null = sum(
            run_campaign(rng, Campaign(policy, None, **extra), s)[0] for s in range(campaigns)
        )
        power = 0
        for s in range(campaigns):
            good_at = int(rng.integers(1, 17))
            power += run_campaign(rng, Campaign(policy, good_at, **extra), s)[1]
        print(f"   {name:45s}  {fmt(null, campaigns)}       {fmt(power, campaigns)}")
        if index in (1, 4):
            what = "with a test split (confirm)" if index == 1 else "without one (online)"
            target(
                f"per-campaign false publish <= 5% at defaults, {what}",
                wilson(null, campaigns)[0] <= 0.05,
                fmt(null, campaigns),
            )


# --- 3. adversarial order ----------------------------------------------------------------


def adversarial_order(trials: int, seed: int) -> None:
    """Helps the first half of the file, hurts the second: file order vs seeded order."""
    print("\n## 3. Adversarial file order (helps the first half, hurts the second; zero overall)")
    for n in (32, 100):
        config = GateConfig(bootstrap_samples=200)
        rng = np.random.default_rng([seed, n, 3])
        counts = {"file": [0, 0], "seeded": [0, 0]}
        for trial in range(trials):
            p = draw_cases(rng, n)
            base, cand = replay(rng, p), replay(rng, adversarial(p))
            for name, order in (("file", list(range(n))), ("seeded", seeded(n, trial))):
                out = measure(base, cand, order, config)
                counts[name][0] += out.final == "accept"
                counts[name][1] += out.full == "accept"
        for name, (final, full) in counts.items():
            print(
                f"   n={n:3d} {name:6s} order: accepted {fmt(final, trials)} with early stop, "
                f"{fmt(full, trials)} by the full evaluation"
            )


# --- 4. bootstrap CI coverage at n = 10 --------------------------------------------------

DISTRIBUTIONS: dict[str, tuple[Callable[[np.random.Generator, int], np.ndarray], float]] = {
    "uniform +0.1": (lambda r, n: r.uniform(-0.7, 0.9, n), 0.1),
    "normal sd 0.3": (lambda r, n: r.normal(0.1, 0.3, n), 0.1),
    "ternary -1/0/+1": (lambda r, n: r.choice([-1.0, 0.0, 1.0], n, p=[0.25, 0.35, 0.4]), 0.15),
    "skewed (beta)": (lambda r, n: r.beta(0.5, 3.0, n) - 0.5 / 3.5, 0.0),
}


def ci_coverage(trials: int, seed: int) -> None:
    """Two-sided coverage and lower-bound misses of the bootstrap CI at n = 10."""
    print("\n## 4. Bootstrap 95% CI at n = 10: coverage (lower bound above the mean: false accept)")
    for name, (draw, mean) in DISTRIBUTIONS.items():
        rng = np.random.default_rng([seed, len(name)])
        stats = {"percentile": [0, 0], "expanded": [0, 0]}
        for trial in range(trials):
            x = draw(rng, 10).clip(-1, 1)
            for method, tally in stats.items():
                low, high = bootstrap_ci(x, 0.95, 2000, trial, method=method)  # type: ignore[arg-type]
                tally[0] += low <= mean <= high
                tally[1] += low > mean
        row = "  ".join(
            f"{method} {fmt(c, trials)} (low > mean {100 * m / trials:4.1f}%)"
            for method, (c, m) in stats.items()
        )
        print(f"   {name:16s} {row}")


# --- 5. the no-regression veto -----------------------------------------------------------


def legacy_veto(base: Scores, cand: Scores, pass_score: float = 1.0) -> bool:
    """The rule before issue 16: any case whose mean passed for the parent and not now."""
    return any(np.mean(base[c]) >= pass_score > np.mean(cand[c]) for c in base)


def veto(trials: int, seed: int) -> None:
    """Veto rates of a truly better candidate (+0.15), and of one that breaks a solid case."""
    print("\n## 5. No-regression veto, 32 val cases")
    config = GateConfig(no_regression=True)
    ids = case_ids(32)
    for reps in (1, 3):
        rng = np.random.default_rng([seed, reps, 5])
        good_old = good_new = broken_new = 0
        for _ in range(trials):
            p = draw_cases(rng, 32)
            base = as_scores(ids, replay(rng, p, reps))
            cand = as_scores(ids, replay(rng, improve(p, 0.15), reps))
            good_old += legacy_veto(base, cand)
            good_new += bool(regressions(base, cand, config))
            q = improve(p, 0.15)
            q[0], p[0] = 0.0, 1.0  # case 0: always passed, now always fails
            before, after = replay(rng, p, reps), replay(rng, q, reps)
            broken = regressions(as_scores(ids, before), as_scores(ids, after), config)
            broken_new += ids[0] in broken
        print(
            f"   {reps} repetition(s): better candidate vetoed: before {fmt(good_old, trials)}, "
            f"now {fmt(good_new, trials)}; a truly broken case caught now {fmt(broken_new, trials)}"
        )
        if reps == 1:
            target(
                "noisy 1-repetition +0.15 candidate vetoed far less than before",
                good_new * 4 < good_old,
                f"{fmt(good_new, trials)} vs {fmt(good_old, trials)}",
            )


# --- 6. early-stop bookkeeping -----------------------------------------------------------


class LegacyEarlyStop:
    """The bookkeeping before issue 16: a list of deltas, re-summed on every update."""

    def __init__(self, config: GateConfig, planned: int) -> None:
        self.config, self.planned, self.deltas = config, planned, []

    def update(self, delta: float) -> None:
        self.deltas.append(delta)
        values = [float(d) for d in self.deltas]  # settled() copied and re-summed them all
        total = math.fsum(values)
        mean = total / len(values)
        math.fsum((d - mean) ** 2 for d in values)
        math.fsum(d * d for d in values)


def cpu(run: Callable[[], None]) -> float:
    """CPU seconds of one call."""
    start = time.process_time()
    run()
    return time.process_time() - start


def bookkeeping(quick: bool) -> None:
    """CPU time of early-stop bookkeeping, before and now, as one stopper fed case by case
    and as the scheduler used it (a new stopper over the finished prefix at every check)."""
    print("\n## 6. Early-stop bookkeeping CPU (a null stream that never stops early)")
    config = GateConfig(sequential=False, min_coverage=1.0)
    for n in (400, 1000):
        deltas = (np.random.default_rng(n).uniform(-0.2, 0.2, n)).tolist()

        def stream(kind: type, prefix: bool, deltas: list[float] = deltas, n: int = n) -> None:
            for m in range(1, n + 1) if prefix else (n,):
                stop = kind(config, n)
                for d in deltas[:m]:
                    stop.update(d)

        old = cpu(lambda s=stream: s(LegacyEarlyStop, False))
        new = cpu(lambda s=stream: s(EarlyStop, False))
        line = f"   {n:5d} cases, one stopper: before {old:6.3f} s, now {new:6.4f} s"
        if not quick:
            new_p = cpu(lambda s=stream: s(EarlyStop, True))
            if n == 400:
                old_p = cpu(lambda s=stream: s(LegacyEarlyStop, True))
                line += f"; a new stopper per finished case: before {old_p:5.2f} s"
            else:
                line += f"; a new stopper per finished case: before ~{old_p * 15.6:3.0f} s (n^3)"
            line += f", now {new_p:5.2f} s (n^2: keep one stopper)"
        print(line)


def main() -> None:
    """Run every section and print which targets of issue 16 are met."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small samples: a smoke run")
    parser.add_argument("--trials", type=int, help="measurements per cell")
    parser.add_argument("--campaigns", type=int, help="campaigns per policy")
    parser.add_argument("--seed", type=int, default=16)
    parser.add_argument("--policy", choices=("none", "confirm", "online"), help="one policy")
    parser.add_argument("--only", help="comma-separated sections, e.g. per_campaign,online_power")
    args = parser.parse_args()
    global ONLY_POLICY
    ONLY_POLICY = args.policy or ""
    trials = args.trials or (20 if args.quick else 1000)
    campaigns = args.campaigns or (10 if args.quick else 500)
    start = time.perf_counter()
    sections: list[tuple[Callable[..., None], tuple[object, ...]]] = [
        (preflight, ()),
        (per_candidate, (trials, args.seed)),
        (power_at_defaults, (trials * 2, args.seed)),
        (online_power, (trials * 2, args.seed)),
        (per_campaign, (campaigns, args.seed)),
        (adversarial_order, (trials, args.seed)),
        (ci_coverage, (max(50, trials // 2), args.seed)),
        (veto, (trials, args.seed)),
        (bookkeeping, (args.quick,)),
    ]
    if args.only:
        chosen = set(args.only.split(","))
        sections = [(f, a) for f, a in sections if f.__name__ in chosen]
    for section, section_args in sections:
        began = time.perf_counter()
        section(*section_args)
        print(f"   ({time.perf_counter() - began:.0f} s)")
    print("\n## Targets of issue 16")
    for name, met, detail in TARGETS:
        print(f"   [{'met' if met else 'NOT met'}] {name}: {detail}")
    print(f"\n({time.perf_counter() - start:.0f} s wall, seed {args.seed}, {trials} trials/cell)")


if __name__ == "__main__":
    main()
