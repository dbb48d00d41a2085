"""The error level each gate works at, and the exact coverage rule (DESIGN §6).

Both the full evaluation (`decide`) and early stopping (`EarlyStop`) read these, so the two
can never disagree on what a gate's level or its coverage minimum is.
"""

from __future__ import annotations

import math
from fractions import Fraction

from evolane.messages import GateConfig
from evolane.stats._dist import normal_cdf

MAX_DENOMINATOR = 10**6
"""`as_fraction` reads a share as the nearest fraction with at most this denominator."""


def as_fraction(value: float) -> Fraction:
    """The share ``value`` as the fraction it stands for: the nearest one with a denominator
    of at most 10^6.

    ``as_fraction(0.28) == Fraction(7, 25)``: the number the user typed, not the nearest
    binary double (0.28000000000000002665...), so 7 of 25 cases meets ``min_coverage =
    0.28``; likewise ``as_fraction(2 / 11) == Fraction(2, 11)``. Every decimal of up to six
    digits and every ratio with a denominator up to 10^6 is recovered exactly (two such
    fractions differ by far more than a double's rounding).
    """
    if not math.isfinite(value):
        raise ValueError(f"not a finite number: {value}")
    return Fraction(value).limit_denominator(MAX_DENOMINATOR)


def minimum_cases(config: GateConfig) -> int:
    """The fewest comparable cases a gate judges: ``min_cases``, and 2 for an SE or a CI."""
    return max(config.min_cases, 2 if config.gate in ("paired", "bootstrap") else 1)


def required_cases(planned: int, config: GateConfig) -> int:
    """Comparable cases the coverage guard needs out of ``planned``, in exact arithmetic.

    The larger of `minimum_cases` and ceil(min_coverage * planned), with ``min_coverage``
    read exactly (`as_fraction`): 25 planned at 0.28 need exactly 7.
    """
    if planned < 0:
        raise ValueError(f"planned must be >= 0, got {planned}")
    share = math.ceil(as_fraction(config.min_coverage) * planned)
    return max(minimum_cases(config), share)


def coverage_shortfall(n: int, planned: int, config: GateConfig) -> str | None:
    """Why ``n`` comparable of ``planned`` cases are too few to judge, or None when enough."""
    needed = minimum_cases(config)
    if n < needed:
        detail = " (SE undefined)" if n < 2 <= needed else ""
        return f"coverage: n={n} < {needed} comparable cases{detail}: indecisive"
    if Fraction(n) < as_fraction(config.min_coverage) * planned:
        return (
            f"coverage: {n}/{planned} comparable < min_coverage {config.min_coverage:g} "
            f"(needs {required_cases(planned, config)}): indecisive"
        )
    return None


def gate_level(config: GateConfig) -> float | None:
    """The one-sided false-accept level the gate itself is built for, or None (no level).

    - paired: 1 - Phi(k_se), the level of "mean > k*SE" when the mean is normal (k = 1:
      0.159, k = 2: 0.023, k = 3: 0.00135). At few cases the real level of the k*SE rule is
      Student t's P(T > k), which is larger; using the normal level keeps any test tied to
      it at least as strict as the gate.
    - bootstrap: (1 - confidence) / 2, the one-sided level of a two-sided interval's lower
      bound (0.025 at the default 0.95).
    - strict and threshold have no error level.
    """
    if config.gate == "paired":
        return 1.0 - normal_cdf(config.k_se)
    if config.gate == "bootstrap":
        return float((1 - as_fraction(config.confidence)) / 2)
    return None


def sequential_level(config: GateConfig) -> float | None:
    """The level of the early-stop sequential test: min(gate level, ``sequential_alpha``).

    ``sequential_alpha`` is only a cap: it can make early decisions stricter than the gate,
    never looser (k = 3 runs the sequential test at 0.00135 whatever it says). None for the
    gates without a level, which never stop on the sequential test.
    """
    level = gate_level(config)
    if level is None:
        return None
    return min(level, config.sequential_alpha)


def sequential_margin(config: GateConfig) -> float:
    """The mean the sequential test tests against: the bar the gate's accept must clear.

    paired: max(0, min_effect) (k*SE >= 0 dominates a negative min_effect); bootstrap:
    min_effect (a negative one is a non-inferiority margin).
    """
    if config.gate == "paired":
        return max(0.0, config.min_effect)
    return config.min_effect
