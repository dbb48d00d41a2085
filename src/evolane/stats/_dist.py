"""Normal, beta and Student t distribution functions without SciPy (stdlib `math` only).

The t CDF is the regularised incomplete beta function, evaluated by its continued fraction
(modified Lentz); the quantile inverts it by bisection. Both are accurate to about 1e-12,
far finer than any decision here needs.
"""

from __future__ import annotations

import math
from statistics import NormalDist

_NORMAL = NormalDist()
_EPS = 1e-15
_TINY = 1e-300


def normal_cdf(x: float) -> float:
    """P(Z <= x) for a standard normal Z."""
    return _NORMAL.cdf(x)


def normal_quantile(p: float) -> float:
    """The x with P(Z <= x) = p, for p in (0, 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    return _NORMAL.inv_cdf(p)


def _beta_fraction(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    result = d
    for m in range(1, 10_000):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + numerator / c
            c = c if abs(c) > _TINY else _TINY
            result *= c * d
        if abs(c * d - 1.0) < _EPS:
            break
    return result


def beta_regularized(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b) for a, b > 0 and x in [0, 1]."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must lie in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def beta_quantile(p: float, a: float, b: float) -> float:
    """The x in [0, 1] with I_x(a, b) = p, for p in (0, 1) and a, b > 0 (bisection)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if a <= 0.0 or b <= 0.0:
        raise ValueError(f"a and b must be > 0, got {a}, {b}")
    low, high = 0.0, 1.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if middle in (low, high):
            break
        if beta_regularized(a, b, middle) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0


def t_cdf(x: float, df: float) -> float:
    """P(T <= x) for Student's t with ``df`` > 0 degrees of freedom."""
    if df <= 0:
        raise ValueError(f"df must be > 0, got {df}")
    if math.isinf(x):
        return 1.0 if x > 0 else 0.0
    tail = 0.5 * beta_regularized(df / 2.0, 0.5, df / (df + x * x))
    return 1.0 - tail if x > 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The x with P(T <= x) = p for Student's t with ``df`` degrees of freedom, p in (0, 1)."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p must lie in (0, 1), got {p}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    low, high = 0.0, max(1.0, normal_quantile(p))
    while t_cdf(high, df) < p:
        low, high = high, high * 2.0
    for _ in range(200):
        middle = (low + high) / 2.0
        if middle in (low, high):
            break
        if t_cdf(middle, df) < p:
            low = middle
        else:
            high = middle
    return (low + high) / 2.0
