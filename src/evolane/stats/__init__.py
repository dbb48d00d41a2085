"""Paired statistics: gates, the bootstrap CI, early stopping and campaign error control
(DESIGN §6).

The gates judge a candidate against its baseline from per-case repetition scores; cases
are the independent sample, or clusters of them when cases name one (`Clusters`).
`EarlyStop` lets a measurement stop as soon as its decision is known, at the gate's own
level (`sequential_level`) and under the same coverage rule as the full evaluation.
`min_acceptable_gain` and `can_ever_accept` say before anything runs what the gate can
accept; `confirm` and `OnlineErrorControl` bound the probability that a campaign publishes
an edit with no true effect; `case_order` is the seeded reading order and `seed_for`
derives seeds. The gate's records (`GateConfig`, `GateResult`) live in `evolane.messages`.
"""

from typing import TYPE_CHECKING

from evolane._lazy import lazy_exports

if TYPE_CHECKING:
    from evolane.stats._bootstrap import (
        BootstrapMethod,
        bootstrap_ci,
        bootstrap_means,
        expanded_tail,
    )
    from evolane.stats._bounded import bounded_mean_ci, case_mean_ci, clopper_pearson
    from evolane.stats._clusters import (
        Clusters,
        cluster_ends,
        cluster_means,
        clustered,
        count_clusters,
        planned_clusters,
        together,
    )
    from evolane.stats._dist import normal_cdf, normal_quantile, t_cdf, t_quantile
    from evolane.stats._gates import (
        CLUSTERED_GATES,
        TOLERANCE,
        CaseScores,
        PairedSample,
        decide,
        judge_clusters,
        judge_sample,
        mean_and_se,
        paired_deltas,
        paired_sample,
        regression_p_value,
        regressions,
    )
    from evolane.stats._levels import (
        as_fraction,
        coverage_shortfall,
        gate_level,
        minimum_cases,
        required_cases,
        sequential_level,
        sequential_margin,
    )
    from evolane.stats._matrix import (
        ScoreMatrix,
        decide_matrices,
        matrix_regressions,
        matrix_sample,
    )
    from evolane.stats._online import (
        Confirmation,
        ConfirmDecision,
        OnlineErrorControl,
        OnlineVerdict,
        confirm,
        no_gain_lower_bound,
        no_gain_margin,
        no_gain_p_value,
        sign_flip_p_value,
    )
    from evolane.stats._order import case_order, cluster_order
    from evolane.stats._preflight import (
        MinimumGain,
        Repetitions,
        ScoreKind,
        balanced_deltas,
        best_case_p_value,
        can_ever_accept,
        can_ever_confirm,
        can_ever_pass_online,
        min_acceptable_gain,
        online_cases_needed,
        online_p_value,
        regression_veto_note,
    )
    from evolane.stats._seeds import seed_for
    from evolane.stats._sequential import (
        DEFAULT_MAX_BET,
        EarlySource,
        EarlyStop,
        Running,
        SequentialDecision,
        SequentialTest,
        settled,
    )

__all__ = [
    "CLUSTERED_GATES",
    "DEFAULT_MAX_BET",
    "TOLERANCE",
    "BootstrapMethod",
    "CaseScores",
    "Clusters",
    "ConfirmDecision",
    "Confirmation",
    "EarlySource",
    "EarlyStop",
    "MinimumGain",
    "OnlineErrorControl",
    "OnlineVerdict",
    "PairedSample",
    "Repetitions",
    "Running",
    "ScoreKind",
    "ScoreMatrix",
    "SequentialDecision",
    "SequentialTest",
    "as_fraction",
    "balanced_deltas",
    "best_case_p_value",
    "bootstrap_ci",
    "bootstrap_means",
    "bounded_mean_ci",
    "can_ever_accept",
    "can_ever_confirm",
    "can_ever_pass_online",
    "case_mean_ci",
    "case_order",
    "clopper_pearson",
    "cluster_ends",
    "cluster_means",
    "cluster_order",
    "clustered",
    "confirm",
    "count_clusters",
    "coverage_shortfall",
    "decide",
    "decide_matrices",
    "expanded_tail",
    "gate_level",
    "judge_clusters",
    "judge_sample",
    "matrix_regressions",
    "matrix_sample",
    "mean_and_se",
    "min_acceptable_gain",
    "minimum_cases",
    "no_gain_lower_bound",
    "no_gain_margin",
    "no_gain_p_value",
    "normal_cdf",
    "normal_quantile",
    "online_cases_needed",
    "online_p_value",
    "paired_deltas",
    "paired_sample",
    "planned_clusters",
    "regression_p_value",
    "regression_veto_note",
    "regressions",
    "required_cases",
    "seed_for",
    "sequential_level",
    "sequential_margin",
    "settled",
    "sign_flip_p_value",
    "t_cdf",
    "t_quantile",
    "together",
]

__getattr__ = lazy_exports(__name__)
