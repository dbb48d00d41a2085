"""Paired statistics: gates, the bootstrap CI, and early stopping (DESIGN §6).

The gates judge a candidate against its baseline from per-case repetition scores; cases
are the independent sample. `SequentialTest` and `settled` let a measurement stop as soon
as its decision is known, at a chosen error level or with certainty respectively. The gate's
records (`GateConfig`, `GateResult`) live in `evolane.messages`; `seed_for` derives seeds.
"""

from evolane.stats._bootstrap import bootstrap_ci, bootstrap_means
from evolane.stats._gates import (
    TOLERANCE,
    PairedSample,
    decide,
    mean_and_se,
    paired_deltas,
    paired_sample,
    regressions,
)
from evolane.stats._seeds import seed_for
from evolane.stats._sequential import (
    DEFAULT_MAX_BET,
    EarlyStop,
    SequentialDecision,
    SequentialTest,
    settled,
)

__all__ = [
    "DEFAULT_MAX_BET",
    "TOLERANCE",
    "EarlyStop",
    "PairedSample",
    "SequentialDecision",
    "SequentialTest",
    "bootstrap_ci",
    "bootstrap_means",
    "decide",
    "mean_and_se",
    "paired_deltas",
    "paired_sample",
    "regressions",
    "seed_for",
    "settled",
]
