"""The synthetic sleeper workload: a replay, judge and optimizer with controlled timing and faults.

``python -m evolane.examples.sleeper init|replay|judge|optimize``: the replay sleeps a seeded
log-normal duration and, at configured rates, fails, hangs, ignores SIGTERM, leaves a setsid
escaper behind or floods stdout; the judge's score has a known true effect per candidate. The
pure functions below let tests and benchmarks check rates and scores without a process.
Standard library only.
"""

from evolane.examples.sleeper.workload import (
    FAULT_MODES,
    MODES,
    NOISE_SD,
    SPLITS,
    Plan,
    SleeperConfig,
    base_score,
    case_id,
    choose_effect,
    dataset_rows,
    noise,
    plan,
    score,
    split_counts,
    variant_of,
)

__all__ = [
    "FAULT_MODES",
    "MODES",
    "NOISE_SD",
    "SPLITS",
    "Plan",
    "SleeperConfig",
    "base_score",
    "case_id",
    "choose_effect",
    "dataset_rows",
    "noise",
    "plan",
    "score",
    "split_counts",
    "variant_of",
]
