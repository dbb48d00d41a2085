"""Early stopping: an anytime-valid betting test and deterministic "settled" bounds.

`SequentialTest` is a test by betting (Waudby-Smith & Ramdas, "Estimating means of bounded
random variables by betting", JRSS-B 2023; Shafer, "Testing by betting", 2021). Two gamblers
bet on each new delta, one that the mean exceeds the margin and one that it falls short.
Each one's wealth is a nonnegative supermartingale under its null, so by Ville's inequality
it ever reaches 1/alpha with probability at most alpha, however long the test runs and
whenever the caller looks: stopping at the first decision keeps the error level alpha. The
test needs no normal approximation: it is valid for bounded deltas at any number of cases.

`EarlyStop` runs that test at the gate's own level (`sequential_level`) and `settled` (the
certain bounds), only once the coverage rule of the full evaluation is met for sure, and
keeps running sums so each delta costs O(1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from evolane.messages import Decision, GateConfig
from evolane.stats._gates import TOLERANCE
from evolane.stats._levels import (
    gate_level,
    required_cases,
    sequential_level,
    sequential_margin,
)

SequentialDecision = Literal["accept", "reject", "continue"]

DEFAULT_MAX_BET = 0.9
"""Largest fraction of its wealth a gambler stakes on one delta (below 1 keeps wealth > 0)."""

_PRIOR_VARIANCE = 0.25
"""Variance of the one pseudo-observation that steadies the first bets (at mean = margin)."""

_SAFETY = 1e-9
"""Margin by which `settled` wants an accept bound cleared, far above rounding error."""


class SequentialTest:
    """Anytime-valid test for the mean of bounded paired deltas in [-1, 1] (testing by betting).

    ``accept`` once the mean > ``margin`` is shown at level ``alpha``, ``reject`` once the
    mean < ``margin`` is; the first decision sticks. Each direction has level ``alpha`` on its
    own (at a true mean of exactly ``margin`` either error has probability <= alpha); pass
    ``alpha / 2`` for a two-sided guarantee. Bets follow the aGRAPA rule (a Kelly-style
    fraction mean / (variance + mean^2) from past deltas only), capped at ``max_bet``.
    """

    __slots__ = (
        "_decision",
        "_log_down",
        "_log_threshold",
        "_log_up",
        "_m2",
        "_margin",
        "_max_bet",
        "_mean",
        "_n",
    )

    def __init__(
        self, alpha: float = 0.05, *, margin: float = 0.0, max_bet: float = DEFAULT_MAX_BET
    ) -> None:
        """Start with unit wealth on both sides; ``margin`` in (-1, 1) is the mean under test."""
        if not 0.0 < alpha < 1.0:
            raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
        if not -1.0 < margin < 1.0:
            raise ValueError(f"margin must lie in (-1, 1), got {margin}")
        if not 0.0 < max_bet < 1.0:
            raise ValueError(f"max_bet must lie in (0, 1), got {max_bet}")
        self._log_threshold = math.log(1.0 / alpha)
        self._margin = margin
        self._max_bet = max_bet
        self._n = 0
        self._mean = 0.0  # running mean of delta - margin
        self._m2 = 0.0  # running sum of squared deviations (Welford)
        self._log_up = 0.0
        self._log_down = 0.0
        self._decision: SequentialDecision = "continue"

    def _bets(self) -> tuple[float, float]:
        """The stakes (up, down) for the next delta, from the past deltas only (predictable)."""
        n = self._n
        mean = self._mean * n / (n + 1)  # shrunk towards the null by one pseudo-observation
        variance = (_PRIOR_VARIANCE + self._m2) / (n + 1)
        fraction = mean / (variance + mean * mean)
        up = min(max(fraction, 0.0), self._max_bet / (1.0 + self._margin))
        down = min(max(-fraction, 0.0), self._max_bet / (1.0 - self._margin))
        return up, down

    def update(self, delta: float) -> None:
        """Take one per-case delta in [-1, 1], in arrival order."""
        if not -1.0 <= delta <= 1.0:  # also refuses NaN
            raise ValueError(f"a paired delta must lie in [-1, 1], got {delta}")
        excess = delta - self._margin
        up, down = self._bets()
        self._log_up += math.log1p(up * excess)
        self._log_down += math.log1p(-down * excess)
        self._n += 1
        step = excess - self._mean
        self._mean += step / self._n
        self._m2 += step * (excess - self._mean)
        if self._decision == "continue":
            if self._log_up >= self._log_threshold:
                self._decision = "accept"
            elif self._log_down >= self._log_threshold:
                self._decision = "reject"

    @property
    def decision(self) -> SequentialDecision:
        """``accept`` (mean > margin shown), ``reject`` (mean < margin shown) or ``continue``."""
        return self._decision

    @property
    def n(self) -> int:
        """How many deltas the test has taken."""
        return self._n

    @property
    def wealth(self) -> tuple[float, float]:
        """The two gamblers' wealth (up, down): e-values against mean <= / >= margin."""
        return math.exp(self._log_up), math.exp(self._log_down)

    @property
    def log_wealth(self) -> tuple[float, float]:
        """The natural logs of `wealth` (no overflow however long the test runs)."""
        return self._log_up, self._log_down

    @property
    def log_threshold(self) -> float:
        """log(1 / alpha): the log-wealth at which a gambler's side is shown."""
        return self._log_threshold


class Running:
    """Count, compensated sum, sum of squares and spread of a stream of deltas, O(1) each.

    The sums use Neumaier's compensated summation and the spread (sum of squared deviations
    from the mean) Welford's update, so they stay accurate to a few ulps at any length;
    `settled` keeps a margin (1e-9) far above that.
    """

    __slots__ = ("_sq", "_sq_c", "_sum", "_sum_c", "mean", "n", "spread")

    def __init__(self, deltas: Sequence[float] = ()) -> None:
        """Start empty, or summarise ``deltas``."""
        self.n = 0
        self._sum = self._sum_c = self._sq = self._sq_c = 0.0
        self.mean = 0.0
        self.spread = 0.0
        for d in deltas:
            self.add(d)

    @staticmethod
    def _neumaier(total: float, comp: float, value: float) -> tuple[float, float]:
        new = total + value
        if abs(total) >= abs(value):
            comp += (total - new) + value
        else:
            comp += (value - new) + total
        return new, comp

    def add(self, delta: float) -> None:
        """Take one delta in [-1, 1]."""
        if not -1.0 <= delta <= 1.0:  # also refuses NaN
            raise ValueError(f"a paired delta must lie in [-1, 1], got {delta}")
        self.n += 1
        self._sum, self._sum_c = self._neumaier(self._sum, self._sum_c, delta)
        self._sq, self._sq_c = self._neumaier(self._sq, self._sq_c, delta * delta)
        step = delta - self.mean
        self.mean += step / self.n
        self.spread += step * (delta - self.mean)

    @property
    def total(self) -> float:
        """The sum of the deltas."""
        return self._sum + self._sum_c

    @property
    def squares(self) -> float:
        """The sum of the squared deltas."""
        return self._sq + self._sq_c


Settlement = tuple[Decision, str]


def _settle(
    seen: Running, remaining: int, config: GateConfig, noun: str = "cases"
) -> Settlement | None:
    """`settled` on a running summary, with the reason (of ``noun``) and its numbers: O(1)."""
    if config.gate == "strict":
        return None  # the strict gate's reject is found by EarlyStop from the deltas
    final_n = seen.n + remaining
    if config.gate != "paired" or final_n < max(config.min_cases, 2):
        return None
    total, k = seen.total, config.k_se
    floor = max(0.0, config.min_effect)
    # Reject: rounding here is far below the tie tolerance, and decide() rejects ties.
    highest = (total + remaining) / final_n
    se_low = math.sqrt(max(0.0, seen.spread) / (final_n * (final_n - 1)))
    if highest <= floor or highest <= k * se_low:
        bar = max(floor, k * se_low)
        return "reject", (
            f"settled: even if the {remaining} remaining {noun} all gained +1, the mean "
            f"{highest:+.4g} could not exceed {bar:.4g} (k*SE >= {k:.2f} x {se_low:.4g}, "
            f"min_effect {floor:g}): rejected"
        )
    if config.no_regression:
        return None
    lowest = (total - remaining) / final_n
    if lowest <= _SAFETY:
        return None
    squares = seen.squares + remaining
    spread = max(0.0, squares - final_n * lowest * lowest)
    se_high = math.sqrt(spread / (final_n * (final_n - 1)))
    bar = max(k * se_high, config.min_effect)
    if lowest > bar + _SAFETY:
        return "accept", (
            f"settled: even if the {remaining} remaining {noun} all lost -1, the mean "
            f"{lowest:+.4g} would exceed k*SE <= {k:.2f} x {se_high:.4g} and min_effect "
            f"{config.min_effect:g}: accepted"
        )
    return None


def settled(deltas: Sequence[float], remaining: int, config: GateConfig) -> Decision | None:
    """The gate's final decision if ``remaining`` more deltas in [-1, 1] cannot change it.

    Rigorous (never wrong) and conservative, for the paired gate: *reject* is certain when
    even all-(+1) remaining deltas leave the final mean <= max(0, min_effect), or <= k times a
    lower bound on the final SE (the spread already seen); *accept* is certain when even
    all-(-1) remaining deltas keep it > min_effect, > 0 and > k times an upper bound on the
    final SE (never with ``no_regression``: a later case could be vetoed). The gate's rule
    keeps the answer when fewer than ``remaining`` cases arrive (a missing case moves the
    mean and the SE less than a -1 or +1 would), but then the coverage guard may say
    indecisive: `EarlyStop` adds the full coverage rule. The strict gate is settled on reject
    by one worse case; the other gates never settle early. ``min_cases`` must be reachable
    (seen + remaining), else None. Reads the deltas once: O(len(deltas)).
    """
    if remaining < 0:
        raise ValueError(f"remaining must be >= 0, got {remaining}")
    seen = Running([float(d) for d in deltas])
    if config.gate == "strict":
        return "reject" if seen.n and min(float(d) for d in deltas) < -TOLERANCE else None
    verdict = _settle(seen, remaining, config)
    return None if verdict is None else verdict[0]


EarlySource = Literal["sequential", "settled", "coverage"]


class EarlyStop:
    """Stop a measurement once its decision is known: the sequential test, `settled`, or a
    coverage guard that can no longer be met.

    Feed each case's delta in arrival order (None for a case that finished but is not
    comparable, e.g. an infrastructure failure); `update` returns the decision once the
    measurement may stop. Rules, each O(1) per case:

    - *Coverage first*: no accept or reject before the comparable cases reach
      `required_cases` of ``planned`` (``min_cases``, and ``min_coverage`` of the plan in
      exact arithmetic). Then the full evaluation can no longer be indecisive for coverage,
      whatever the remaining cases do. Once so many cases have failed that the rule can no
      longer be met, the decision is ``indecisive`` (source ``coverage``).
    - *Sequential* (paired and bootstrap gates, ``config.sequential``): the betting test at
      `sequential_level` = min(the gate's own level, ``sequential_alpha``) against the
      gate's margin; it decides when one gambler's *current* wealth is >= 1/level.
    - *Settled*: `settled` (certain), and the strict gate's reject on one worse case.
    - With ``no_regression`` (a later case could be vetoed), or ``allow_accept=False`` (the
      online error control needs the full evaluation's p-value), only a reject stops early.
    - Never on the last case: nothing remains to skip, and the full evaluation decides (a
      decision there was reported as "early stop after 26 of 26 cases").

    Early and full decisions agree on >= 99% of measurements at k in {1, 2, 3}, 10 to 100
    cases (benchmarks/decisions.py measures it).
    """

    __slots__ = (
        "_allow_accept",
        "_config",
        "_decision",
        "_noun",
        "_planned",
        "_reason",
        "_required",
        "_running",
        "_seen",
        "_source",
        "_test",
        "_worse",
    )

    def __init__(
        self, config: GateConfig, planned: int, *, allow_accept: bool = True, noun: str = "cases"
    ) -> None:
        """Track one measurement of ``planned`` cases judged under ``config``; ``noun``: what
        the values fed are, in the reasons (``clusters`` when each is a cluster's mean delta,
        `measure.CasePrefix`)."""
        if planned < 0:
            raise ValueError(f"planned must be >= 0, got {planned}")
        self._config = config
        self._planned = planned
        self._noun = noun
        self._required = required_cases(planned, config)
        self._allow_accept = allow_accept and not config.no_regression
        self._running = Running()
        self._seen = 0
        self._worse = 0
        self._decision: Decision | None = None
        self._source: EarlySource | None = None
        self._reason = ""
        self._test: SequentialTest | None = None
        level = sequential_level(config)
        if config.sequential and level is not None:
            self._test = SequentialTest(level, margin=sequential_margin(config))

    def update(self, delta: float | None) -> Decision | None:
        """Take one more case (its delta, or None when not comparable); the decision once
        the measurement may stop, else None."""
        if self._decision is not None:
            return self._decision
        if self._seen >= self._planned:
            raise ValueError(f"more cases than the {self._planned} planned")
        self._seen += 1
        if delta is not None:
            delta = float(delta)
            self._running.add(delta)
            self._worse += delta < -TOLERANCE
            if self._test is not None:
                self._test.update(delta)
        if self._seen == self._planned:  # nothing remains: the full evaluation decides
            return None
        if self._check_coverage() is not None or self._running.n < self._required:
            return self._decision
        verdict = self._sequential() or self._settled()
        if verdict is not None:
            self._stop(*verdict)
        return self._decision

    def _stop(self, source: EarlySource, decision: Decision, reason: str) -> None:
        self._decision, self._source = decision, source
        self._reason = f"early stop after {self._seen} of {self._planned} {self._noun}, {reason}"[
            :256
        ]

    def _check_coverage(self) -> Decision | None:
        """Stop as indecisive once the comparable cases can no longer reach the minimum."""
        reachable = self._running.n + self._planned - self._seen
        if reachable < self._required:
            self._stop(
                "coverage",
                "indecisive",
                f"coverage: at most {reachable} comparable {self._noun} of {self._planned}, "
                f"< {self._required} needed: indecisive",
            )
        return self._decision

    def _sequential(self) -> tuple[EarlySource, Decision, str] | None:
        test = self._test
        if test is None:
            return None
        up, down = test.log_wealth
        threshold = test.log_threshold
        level = math.exp(-threshold)
        config = self._config
        shown = f"(level {level:.3g} = min(gate {gate_level(config):.3g}, sequential_alpha "
        shown += f"{config.sequential_alpha:g}))"
        margin = sequential_margin(config)
        if up >= threshold and self._allow_accept:
            return (
                "sequential",
                "accept",
                (
                    f"sequential: e-value {math.exp(up):.3g} >= 1/level shows mean > {margin:g} "
                    f"{shown}: accepted"
                ),
            )
        if down >= threshold:
            return (
                "sequential",
                "reject",
                (
                    f"sequential: e-value {math.exp(down):.3g} >= 1/level shows mean < {margin:g} "
                    f"{shown}: rejected"
                ),
            )
        return None

    def _settled(self) -> tuple[EarlySource, Decision, str] | None:
        if self._config.gate == "strict":
            if self._worse:
                return (
                    "settled",
                    "reject",
                    (f"settled: strict: candidate < baseline on {self._worse} case(s): rejected"),
                )
            return None
        verdict = _settle(self._running, self._planned - self._seen, self._config, self._noun)
        if verdict is None or (verdict[0] == "accept" and not self._allow_accept):
            return None
        return "settled", verdict[0], verdict[1]

    @property
    def decision(self) -> Decision | None:
        """The early decision, or None while the measurement must go on."""
        return self._decision

    @property
    def source(self) -> EarlySource | None:
        """Which rule stopped the measurement (None while it goes on)."""
        return self._source

    @property
    def reason(self) -> str:
        """The stopping rule with its numbers ("" while the measurement goes on)."""
        return self._reason

    @property
    def n(self) -> int:
        """How many comparable deltas have been taken."""
        return self._running.n

    @property
    def seen(self) -> int:
        """How many cases have been taken, comparable or not."""
        return self._seen

    @property
    def required(self) -> int:
        """Comparable cases needed before any accept or reject (`required_cases`)."""
        return self._required
