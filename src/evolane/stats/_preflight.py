"""Preflight: what a gate can accept before anything runs (DESIGN §6).

Pure functions of the configuration, the number of val cases and the repetitions: the
campaign prints `min_acceptable_gain` before spending, and refuses a configuration for which
`can_ever_accept` is False. With pass/fail scores the answer is exact (it is the gate's own
rule, evaluated on the most favourable sample of each size); with continuous scores it is
the gain in units of the per-case spread of the deltas.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Literal

import numpy as np

from evolane.messages import GateConfig
from evolane.stats._bootstrap import expanded_tail
from evolane.stats._dist import t_quantile
from evolane.stats._gates import PairedSample, beyond, judge_sample, regression_p_value
from evolane.stats._levels import as_fraction, coverage_shortfall, required_cases
from evolane.stats._online import no_gain_margin, no_gain_p_value

ScoreKind = Literal["binary", "continuous"]
Repetitions = int | tuple[int, int]
"""Repetitions per case: one number for both arms, or (baseline, candidate)."""


@dataclass(frozen=True, slots=True)
class MinimumGain:
    """The smallest mean gain (candidate minus baseline) the gate can accept.

    ``possible`` is False when no candidate can ever be accepted; then ``mean`` and
    ``units`` are None. Binary scores: ``units`` is the smallest accepted total gain in
    steps of ``unit`` = 1/lcm(repetitions) (with one repetition: cases fixed, none broken)
    and ``mean`` = units * unit / n. Continuous scores: ``mean`` is the gain needed when the
    per-case deltas have spread ``sd`` (or per unit of spread when no ``sd`` is given).
    ``reason`` is one line for the preflight print.
    """

    possible: bool
    mean: float | None
    units: int | None
    unit: float | None
    n: int
    reason: str


def _reps(repetitions: Repetitions) -> tuple[int, int]:
    base, cand = (repetitions, repetitions) if isinstance(repetitions, int) else repetitions
    if base < 1 or cand < 1:
        raise ValueError(f"repetitions must be >= 1, got {repetitions}")
    return base, cand


def balanced_deltas(n: int, units: int, per_case: int) -> np.ndarray:
    """The most favourable sample with a total gain of ``units`` steps of 1/``per_case``:
    spread as evenly as the steps allow (smallest spread for the mean), none negative."""
    if not 0 <= units <= n * per_case:
        raise ValueError(f"units must lie in [0, {n * per_case}], got {units}")
    low, extra = divmod(units, n)
    steps = np.full(n, low, dtype=np.int64)
    steps[:extra] += 1
    return steps / per_case


def full_gain_deltas(n: int, units: int, per_case: int) -> np.ndarray:
    """The sample with a total gain of ``units`` steps of 1/``per_case`` most favourable to
    the full-gain sign test: as many cases as the steps allow gain 1, one case the rest."""
    if not 0 <= units <= n * per_case:
        raise ValueError(f"units must lie in [0, {n * per_case}], got {units}")
    full, rest = divmod(units, per_case)
    deltas = np.zeros(n)
    deltas[:full] = 1.0
    if rest:
        deltas[full] = rest / per_case
    return deltas


def _accepts(
    config: GateConfig,
    n: int,
    units: int,
    per_case: int,
    level: float | None = None,
    pass_fail: bool = True,
    exact: bool = False,
) -> bool:
    """Whether the gate (and, with ``level``, online control) accepts the most favourable
    sample of ``units`` steps: spread evenly for the gate alone and the betting bound,
    gathered into full gains for the full-gain sign test (the same with one repetition).
    ``exact``: the gate's own bootstrap at any size (see `_gate_accepts`)."""
    gathered = level is not None and pass_fail
    deltas = (full_gain_deltas if gathered else balanced_deltas)(n, units, per_case)
    if not _gate_accepts(config, deltas, exact):
        return False
    return (
        level is None or _p_value(deltas, no_gain_margin(config), pass_fail, config.seed) <= level
    )


_EXACT_BOOTSTRAP = 1 << 23
"""Resampled values (cases x resamples) up to which the preflight's search runs the gate's
own bootstrap; past it, the bootstrap gate's CI is drawn from the same distribution in
O(resamples) (`_bootstrap_accepts`): 10,000 resamples of n cases at each step of the search
took minutes from 10,000 cases on (found by review)."""
_CHECKED_BOOTSTRAP = 1 << 28
"""Resampled values up to which the bar found that way is checked with the gate's own
bootstrap (about 2 s a check; a few checks): the bar is then exactly the gate's."""


def _gate_accepts(config: GateConfig, deltas: np.ndarray, exact: bool = False) -> bool:
    """Whether the gate's rule (`judge_sample`, as `decide` runs it) accepts ``deltas``. Only
    the bootstrap gate reads the CI, so the others are judged with a single resample; unless
    ``exact``, a bootstrap over `_EXACT_BOOTSTRAP` is drawn in closed form."""
    n = deltas.size
    if config.gate != "bootstrap":
        config = config.model_copy(update={"bootstrap_samples": 1})  # the CI is not read
    elif not exact and _drawn(config, n):
        return coverage_shortfall(n, n, config) is None and _bootstrap_accepts(config, deltas)
    sample = PairedSample(_ids(n), np.zeros(n), deltas)
    return judge_sample(sample, config, n).decision == "accept"


def _drawn(config: GateConfig, n: int) -> bool:
    """Whether the preflight's search draws the bootstrap gate's CI in closed form."""
    return config.gate == "bootstrap" and n >= 2 and n * config.bootstrap_samples > _EXACT_BOOTSTRAP


@lru_cache(maxsize=4)
def _ids(n: int) -> list[str]:
    return [f"c{i}" for i in range(n)]


def _bootstrap_accepts(config: GateConfig, deltas: np.ndarray) -> bool:
    """The bootstrap gate's rule (the expanded-percentile CI's lower bound above
    min_effect, a tie rejecting) on a sample of few distinct values: a resample's mean is
    then sum(value x count) / n with the counts multinomial, so each of the seeded resamples
    costs one multinomial draw, not n. The same distribution as the gate's own resamples,
    not the same draws: at the boundary the bar may differ from a run's by Monte Carlo noise."""
    n = deltas.size
    values, counts = np.unique(deltas, return_counts=True)
    low = float(values[0])
    if values.size > 1:
        rng = np.random.default_rng(np.random.SeedSequence(config.seed))
        draws = rng.multinomial(n, counts / n, size=config.bootstrap_samples)
        means = draws @ values / n
        low = float(np.quantile(means, expanded_tail(n, config.confidence)))
        low = min(max(low, float(values[0])), float(values[-1]))
    return beyond(low, config.min_effect)


def _p_value(deltas: np.ndarray, margin: float, pass_fail: bool, seed: int) -> float:
    """`no_gain_p_value` of ``deltas``; the betting bound's is cached by the runs of equal
    values in order (a few, in the samples the preflight builds): the search and the online
    bar ask for the same samples, and the bound reads every case in Python."""
    if pass_fail or deltas.size == 0:
        return no_gain_p_value(deltas, margin=margin, pass_fail=pass_fail, order_seed=seed)
    edges = np.flatnonzero(np.diff(deltas)) + 1
    starts = np.concatenate(([0], edges))
    lengths = np.diff(np.concatenate((starts, [deltas.size])))
    runs = tuple(zip(deltas[starts].tolist(), lengths.tolist(), strict=True))
    return _betting_p_value(runs, margin, seed)


@lru_cache(maxsize=256)
def _betting_p_value(runs: tuple[tuple[float, int], ...], margin: float, seed: int) -> float:
    deltas = np.concatenate([np.full(count, value) for value, count in runs])
    return no_gain_p_value(deltas, margin=margin, pass_fail=False, order_seed=seed)


def online_p_value(deltas: np.ndarray, config: GateConfig, pass_fail: bool = False) -> float:
    """The p-value online error control reads: `no_gain_p_value` of the per-case deltas
    against the margin `no_gain_margin` (``pass_fail``: every score is 0 or 1 by
    construction)."""
    margin = no_gain_margin(config)
    return no_gain_p_value(deltas, margin=margin, pass_fail=pass_fail, order_seed=config.seed)


def _impossible(config: GateConfig, n: int) -> str | None:
    needed = required_cases(n, config)
    if n < needed:
        return (
            f"with {n} val cases the {config.gate} gate can never accept: it needs at least "
            f"{needed} comparable cases (min_cases {config.min_cases}"
            + (", and 2 for an SE" if config.gate in ("paired", "bootstrap") else "")
            + "); add val cases (or, embedding evolane, lower GateConfig.min_cases)"
        )
    return None


def _binary(
    config: GateConfig,
    n: int,
    repetitions: Repetitions,
    level: float | None = None,
    pass_fail: bool = True,
) -> MinimumGain:
    base, cand = _reps(repetitions)
    per_case = math.lcm(base, cand)
    top = n * per_case
    online = "" if level is None else f" and online control at level {level:.2g}"
    if not _accepts(config, n, top, per_case, level, pass_fail):
        reason = f"with {n} val cases not even fixing every case passes the {config.gate} gate"
        return MinimumGain(False, None, None, None, n, reason + online)
    if _accepts(config, n, 0, per_case, level, pass_fail):
        reason = (
            f"with {n} val cases the {config.gate} gate accepts a candidate that changes "
            f"nothing (min_effect {config.min_effect:g} < 0 is a non-inferiority margin)"
        )
        return MinimumGain(True, 0.0, 0, 1.0 / per_case, n, reason)
    accepts = partial(_accepts, config, n, per_case=per_case, level=level, pass_fail=pass_fail)
    high = smallest_true(accepts, 0, top)
    if _drawn(config, n) and n * config.bootstrap_samples <= _CHECKED_BOOTSTRAP:
        exact = partial(accepts, exact=True)  # the closed form may be a step off: check
        while high < top and not exact(high):
            high += 1
        while high > 1 and exact(high - 1):
            high -= 1
    mean = high / (n * per_case)
    rule = _rule(config) + online
    if per_case == 1:
        how = f"fix at least {high} case(s) while breaking none (each broken case raises the bar)"
    elif level is not None and pass_fail:
        how = (
            f"gain at least {high} steps of 1/{per_case} of a case, at least {high // per_case} "
            f"case(s) fixed in all {per_case} replays (online control counts only those), "
            "none worse"
        )
    else:
        how = (
            f"gain at least {high} steps of 1/{per_case} of a case (e.g. {high} case(s) each "
            f"1/{per_case} better), none worse"
        )
    reason = (
        f"with {n} val cases, pass/fail scores ({base}/{cand} repetitions) and {rule}, a "
        f"candidate must {how}: mean gain >= {mean:.4g}"
    )
    if config.gate == "threshold":
        reason += f", and its mean score must reach {config.threshold:g}"
    return MinimumGain(True, mean, high, 1.0 / per_case, n, reason)


def _rule(config: GateConfig) -> str:
    if config.gate == "paired":
        floor = f", min_effect {config.min_effect:g}" if config.min_effect else ""
        return f"k = {config.k_se:g}{floor}"
    if config.gate == "bootstrap":
        return f"a {config.confidence:g} bootstrap CI above min_effect {config.min_effect:g}"
    return f"the {config.gate} gate"


def _continuous(config: GateConfig, n: int, sd: float | None) -> MinimumGain:
    if config.gate == "paired":
        factor = config.k_se / math.sqrt(n)
        what = f"k*SE = {config.k_se:g}/sqrt({n})"
    elif config.gate == "bootstrap":
        factor = t_quantile(1.0 - (1.0 - config.confidence) / 2.0, n - 1) / math.sqrt(n)
        what = f"about t_{n - 1}/sqrt({n}) (the CI's half-width)"
    else:
        factor = 0.0
        what = "any positive gain"
    floor = max(0.0, config.min_effect)
    if sd is None:
        mean = max(factor, floor) if factor else floor
        reason = (
            f"with {n} val cases and continuous scores ({_rule(config)}), the mean gain must "
            f"exceed {what} = {factor:.3g} x the per-case sd of the deltas"
        )
    else:
        mean = max(factor * sd, floor)
        reason = (
            f"with {n} val cases, continuous scores and per-case sd {sd:g} ({_rule(config)}), "
            f"the mean gain must exceed about {mean:.3g}"
        )
    if floor:
        reason += f" and min_effect {floor:g}"
    return MinimumGain(True, mean, None, None, n, reason)


def min_acceptable_gain(
    config: GateConfig,
    n_val: int,
    repetitions: Repetitions = 1,
    scores: ScoreKind = "binary",
    *,
    sd: float | None = None,
    level: float | None = None,
    pass_fail: bool = True,
) -> MinimumGain:
    """The smallest mean gain the gate can accept with ``n_val`` val cases (and, with an
    online ``level``, whose `online_p_value` also reaches it: binary scores only, read with
    the campaign's test: ``pass_fail`` when no judge command scores, else the betting bound).

    Binary (pass/fail) scores: exact. Per-case deltas are multiples of 1/lcm(repetitions);
    for a given total gain the sample with the smallest spread is the most favourable (the
    gain spread evenly, no case worse), and acceptance grows with the gain, so a bisection
    with the gate's own rule (`judge_sample`, the same code as `decide`, seed included)
    finds the smallest accepted total: that sample is accepted, and *no* sample with one
    step less is. E.g. 16 cases, 1 repetition, k = 1: fix 2 cases (mean 0.125); fixing one
    gives mean == SE, a tie, rejected. Continuous scores: approximate (the sample SE varies).
    The no-regression veto never blocks a candidate that breaks nothing, so it is ignored.
    Online with pass/fail scores and repetitions, the full-gain sign test counts only cases
    fixed in every replay, so there the samples gather the gain into such cases.
    """
    if n_val < 0:
        raise ValueError(f"n_val must be >= 0, got {n_val}")
    if sd is not None and not sd >= 0.0:
        raise ValueError(f"sd must be >= 0, got {sd}")
    refusal = _impossible(config, n_val)
    if refusal is not None:
        return MinimumGain(False, None, None, None, n_val, refusal)
    if scores == "binary":
        return _binary(config, n_val, repetitions, level, pass_fail)
    if scores == "continuous":
        return _continuous(config, n_val, sd)
    raise ValueError(f"scores must be 'binary' or 'continuous', got {scores!r}")


def can_ever_accept(
    config: GateConfig, n_val: int, repetitions: Repetitions = 1, scores: ScoreKind = "binary"
) -> tuple[bool, str]:
    """Whether any candidate can be accepted with ``n_val`` val cases, and the one-line why.

    False when there are fewer val cases than the coverage guard needs (``min_cases``,
    ``min_coverage``, 2 for an SE), or when not even a candidate that fixes every case
    would pass: the campaign should refuse to start (exit 2) rather than spend its budget.
    """
    gain = min_acceptable_gain(config, n_val, repetitions, scores)
    return gain.possible, gain.reason


def regression_veto_note(config: GateConfig, repetitions: Repetitions) -> str | None:
    """A warning when ``no_regression`` can never veto at these repetitions, else None.

    A case is vetoed only when its exact p-value 1/C(r_b + r_c, r_b) <= regression_alpha
    (see `regressions`); with one repetition per arm that is 0.5.
    """
    if not config.no_regression:
        return None
    base, cand = _reps(repetitions)
    p = regression_p_value(base, cand)
    if p <= config.regression_alpha:
        return None
    return (
        f"no_regression cannot veto any case with {base}/{cand} repetitions: a consistent "
        f"pass -> fail has p = {p:.3g} > regression_alpha {config.regression_alpha:g}; use "
        f"3/3 repetitions or more (--baseline-replay-repetitions 3 "
        f"--candidate-replay-repetitions 3), or the strict gate (embedding evolane, "
        f"GateConfig.regression_alpha = 1 vetoes at one repetition, for deterministic replays)"
    )


def best_case_p_value(n: int, *, margin: float = 0.0, pass_fail: bool = True) -> float:
    """The smallest p-value `no_gain_p_value` gives on ``n`` cases: every case a full gain
    (+1). Nothing a candidate does on ``n`` cases gets below it."""
    if n < 1:
        return 1.0
    return no_gain_p_value(np.ones(n), margin=margin, pass_fail=pass_fail)


def fewest_gains(
    n: int, level: float, *, margin: float = 0.0, pass_fail: bool = True, order_seed: int = 0
) -> int | None:
    """The fewest full gains (+1; the other cases unchanged, after them) among ``n`` cases
    whose `no_gain_p_value` reaches ``level``; None when not even ``n`` do.

    The test the campaign reads, not a formula for one: with pass/fail scores the full-gain
    sign test (2^-k at margin 0; with a margin the unchanged cases count against), with a
    judge command's scores the betting bound, which needs a case or two more."""
    if not 0.0 < level <= 1.0:
        raise ValueError(f"level must lie in (0, 1], got {level}")

    def reaches(k: int) -> bool:
        deltas = np.zeros(n)
        deltas[:k] = 1.0  # the betting bound reads them in its own order (``order_seed``)
        return _p_value(deltas, margin, pass_fail, order_seed) <= level

    if not reaches(n):
        return None
    return 0 if reaches(0) else smallest_true(reaches, 0, n)


def smallest_true(holds: Callable[[int], bool], low: int, high: int) -> int:
    """The smallest ``k`` in (``low``, ``high``] with ``holds(k)``, for a ``holds`` that is
    False at ``low``, True at ``high`` and monotone: galloping up from ``low`` (1, 2, 4...
    steps), then bisecting, so a small answer costs a few calls however large ``high`` is."""
    step = 1
    while low + step < high:
        if holds(low + step):
            high = low + step
            break
        low, step = low + step, step * 2
    while high - low > 1:  # invariant: False at `low`, True at `high`
        middle = (low + high) // 2
        if holds(middle):
            high = middle
        else:
            low = middle
    return high


_MAX_CASES = 1 << 20


def fewest_cases(level: float, *, margin: float = 0.0, pass_fail: bool = True) -> int:
    """The fewest cases on which any candidate can reach ``level``: every one a full gain."""
    if not 0.0 < level <= 1.0:
        raise ValueError(f"level must lie in (0, 1], got {level}")
    if level >= 1.0:
        return 0
    high = 1
    while best_case_p_value(high, margin=margin, pass_fail=pass_fail) > level:
        if high >= _MAX_CASES:
            return _MAX_CASES
        high *= 2
    low = high // 2  # `low` cases do not reach it (or low == 0 < 1 == high)
    while high - low > 1:
        middle = (low + high) // 2
        if best_case_p_value(middle, margin=margin, pass_fail=pass_fail) <= level:
            high = middle
        else:
            low = middle
    return high


def _test_words(margin: float, pass_fail: bool) -> str:
    test = "the full-gain sign test" if pass_fail else "the betting bound"
    return test + (f" at margin {margin:g}" if margin > 0.0 else "")


def can_ever_confirm(
    n_test: int, confidence: float, *, margin: float = 0.0, pass_fail: bool = True
) -> tuple[bool, str]:
    """Whether `confirm` can ever confirm with ``n_test`` held-out cases at ``confidence``,
    and the one-line why: the p-value of every case a full gain (`best_case_p_value`) of
    the test `confirm` reads (``pass_fail``: every score is 0 or 1; ``margin``: the gate's
    min_effect, when positive). At 0.95 with pass/fail scores 5 cases are the fewest."""
    level = float(1 - as_fraction(confidence))
    floor = best_case_p_value(n_test, margin=margin, pass_fail=pass_fail)
    if n_test >= 1 and floor <= level:
        return True, f"{n_test} held-out cases can confirm at level {level:.3g}"
    fewest = fewest_cases(level, margin=margin, pass_fail=pass_fail)
    return False, (
        f"{n_test} held-out cases can never confirm at level {level:.3g}: the smallest "
        f"possible p-value ({_test_words(margin, pass_fail)}, every case a full gain) is "
        f"{floor:.3g} > {level:.3g} (needs >= {fewest} cases)"
    )


def online_cases_needed(
    level: float,
    n_val: int | None = None,
    *,
    margin: float = 0.0,
    pass_fail: bool = True,
    order_seed: int = 0,
) -> int | None:
    """The fewest val cases of ``n_val`` a candidate must turn into full gains (+1, the rest
    unchanged) for its p-value to reach ``level`` (`fewest_gains`); None when not even all
    of them do. Without ``n_val``: on as many cases as it takes (`fewest_cases`)."""
    if n_val is None:
        return fewest_cases(level, margin=margin, pass_fail=pass_fail)
    return fewest_gains(n_val, level, margin=margin, pass_fail=pass_fail, order_seed=order_seed)


def can_ever_pass_online(
    n_val: int, level: float, *, margin: float = 0.0, pass_fail: bool = True, order_seed: int = 0
) -> tuple[bool, str]:
    """Whether a candidate measured on ``n_val`` val cases can reach the online ``level``
    with the p-value online control reads (``pass_fail``, ``margin``: as for
    `can_ever_confirm`), and the one-line why."""
    needed = online_cases_needed(
        level, n_val, margin=margin, pass_fail=pass_fail, order_seed=order_seed
    )
    test = _test_words(margin, pass_fail)
    if needed is not None:
        gain = "fix" if pass_fail else "gain the full score on"
        return True, (
            f"online error control tests each candidate at level {level:.2g}: it must "
            f"{gain} at least {needed} of the {n_val} val cases with none worse ({test})"
        )
    fewest = fewest_cases(level, margin=margin, pass_fail=pass_fail)
    floor = best_case_p_value(n_val, margin=margin, pass_fail=pass_fail)
    return False, (
        f"with {n_val} val cases online error control can never accept: the smallest "
        f"p-value ({test}, every case a full gain) is {floor:.2g} > level {level:.2g} "
        f"(needs >= {fewest} val cases)"
    )
