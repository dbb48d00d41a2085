"""Early stopping: an anytime-valid betting test and deterministic "settled" bounds.

`SequentialTest` is a test by betting (Waudby-Smith & Ramdas, "Estimating means of bounded
random variables by betting", JRSS-B 2023; Shafer, "Testing by betting", 2021). Two gamblers
bet on each new delta, one that the mean exceeds the margin and one that it falls short.
Each one's wealth is a nonnegative supermartingale under its null, so by Ville's inequality
it ever reaches 1/alpha with probability at most alpha, however long the test runs and
whenever the caller looks: stopping at the first decision keeps the error level alpha.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal

from evolane.messages import Decision, GateConfig
from evolane.stats._gates import TOLERANCE

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


def settled(deltas: Sequence[float], remaining: int, config: GateConfig) -> Decision | None:
    """The gate's final decision if ``remaining`` more deltas in [-1, 1] cannot change it.

    Rigorous (never wrong) and conservative, for the paired gate: *reject* is certain when
    even all-(+1) remaining deltas leave the final mean <= max(0, min_effect), or <= k times a
    lower bound on the final SE (the spread already seen); *accept* is certain when even
    all-(-1) remaining deltas keep it > min_effect, > 0 and > k times an upper bound on the
    final SE (never with ``no_regression``: a later case could be vetoed). The strict gate is
    settled on reject by one worse case; the other gates never settle early. Assumes all
    remaining cases arrive; the coverage guard (``min_cases``) must hold at the end, else None.
    """
    if remaining < 0:
        raise ValueError(f"remaining must be >= 0, got {remaining}")
    values = [float(d) for d in deltas]
    if not all(-1.0 <= d <= 1.0 for d in values):
        raise ValueError("paired deltas must lie in [-1, 1]")
    if config.gate == "strict":
        return "reject" if any(d < -TOLERANCE for d in values) else None
    final_n = len(values) + remaining
    if config.gate != "paired" or final_n < max(config.min_cases, 2):
        return None
    total = math.fsum(values)
    if values:
        seen_mean = total / len(values)
        spread = math.fsum((d - seen_mean) ** 2 for d in values)
    else:
        spread = 0.0
    k = config.k_se
    # Reject: rounding here is far below the tie tolerance, and decide() rejects ties.
    highest = (total + remaining) / final_n
    se_low = math.sqrt(spread / (final_n * (final_n - 1)))
    if highest <= max(0.0, config.min_effect) or highest <= k * se_low:
        return "reject"
    if config.no_regression:
        return None
    lowest = (total - remaining) / final_n
    if lowest <= _SAFETY:
        return None
    squares = math.fsum(d * d for d in values) + remaining
    se_high = math.sqrt(max(0.0, squares - final_n * lowest * lowest) / (final_n * (final_n - 1)))
    bar = max(k * se_high, config.min_effect)
    return "accept" if lowest > bar + _SAFETY else None


class EarlyStop:
    """Stop a measurement at the first of: the sequential test decides, or `settled` does.

    Feed per-case deltas in arrival order; `update` returns the decision once the
    measurement may stop. The sequential test is used for the paired and bootstrap gates
    when ``config.sequential`` (at ``sequential_alpha``, margin max(0, min_effect)) and only
    once ``min_cases`` deltas are in; with ``no_regression`` only a reject stops early
    (an unseen case could still be vetoed).
    """

    __slots__ = ("_config", "_decision", "_deltas", "_planned", "_source", "_test")

    def __init__(self, config: GateConfig, planned: int) -> None:
        """Track one measurement of ``planned`` cases judged under ``config``."""
        if planned < 0:
            raise ValueError(f"planned must be >= 0, got {planned}")
        self._config = config
        self._planned = planned
        self._deltas: list[float] = []
        self._decision: Decision | None = None
        self._source: Literal["sequential", "settled"] | None = None
        self._test: SequentialTest | None = None
        if config.sequential and config.gate in ("paired", "bootstrap"):
            margin = max(0.0, config.min_effect)
            self._test = SequentialTest(config.sequential_alpha, margin=margin)

    def update(self, delta: float) -> Decision | None:
        """Take one more case's delta; the decision once the measurement may stop, else None."""
        if self._decision is not None:
            return self._decision
        if len(self._deltas) >= self._planned:
            raise ValueError(f"more deltas than the {self._planned} planned cases")
        self._deltas.append(float(delta))
        if self._test is not None:
            self._test.update(delta)
            verdict = self._test.decision
            allowed = verdict == "reject" or not self._config.no_regression
            if verdict != "continue" and allowed and self.n >= self._config.min_cases:
                self._decision, self._source = verdict, "sequential"
                return self._decision
        final = settled(self._deltas, self._planned - self.n, self._config)
        if final is not None:
            self._decision, self._source = final, "settled"
        return self._decision

    @property
    def decision(self) -> Decision | None:
        """The early decision, or None while the measurement must go on."""
        return self._decision

    @property
    def source(self) -> Literal["sequential", "settled"] | None:
        """Which rule stopped the measurement (None while it goes on)."""
        return self._source

    @property
    def n(self) -> int:
        """How many deltas have been taken."""
        return len(self._deltas)
