"""Preflight: what the gate can accept with this dataset and these settings, said (and a
hopeless configuration refused) before anything runs or is written (DESIGN §6).

The lines come from `stats.min_acceptable_gain` and its siblings: the smallest mean gain the
gate can accept with this many val cases and repetitions (exact for pass/fail scores; with
a judge that grades, also the gain in units of the per-case spread), a `--no-regression`
that can never veto, a test split too small to ever confirm, and in ``online`` error control
the level each candidate is tested at and how many val cases it must improve. A
configuration in which no candidate can ever be accepted (fewer val cases than the coverage
guard needs; in online mode, too few val cases for the test of no true gain to reach the
highest level any candidate can get, even with every case a full gain; ``confirm`` without
test cases) is refused with an `InputError` (exit 2) naming the reason.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from evolane.campaign._config import CampaignConfig
from evolane.campaign._confirm import (
    confirm_repetitions,
    confirmable,
    even_gain_needed,
    first_confirm_level,
)
from evolane.campaign._online import OnlineBudget, opening_budget, resolved_mode
from evolane.inputs import Dataset, case_clusters
from evolane.stats import (
    CLUSTERED_GATES,
    can_ever_accept,
    can_ever_pass_online,
    clustered,
    count_clusters,
    min_acceptable_gain,
    no_gain_margin,
    regression_veto_note,
)


@dataclass(frozen=True)
class Preflight:
    """What the gate can accept: ``possible`` (else ``refusal`` says why), the smallest mean
    gain with pass/fail scores (``min_gain``), and the lines to print."""

    possible: bool
    refusal: str | None
    min_gain: float | None
    lines: tuple[str, ...]


def preflight(
    config: CampaignConfig,
    val_cases: int,
    test_cases: int,
    repetitions: tuple[int, int],
    online: OnlineBudget | None = None,
    confirmations: OnlineBudget | None = None,
    *,
    clusters: tuple[int | None, int | None] = (None, None),
) -> Preflight:
    """The preflight of ``config`` on a dataset with ``val_cases`` and ``test_cases``, with
    the val measurement's (baseline, candidate) ``repetitions``; under a continued
    campaign's stored budgets: ``online`` (in online mode) and ``confirmations`` (the level
    its next confirmation gets), else fresh ones. ``clusters``: how many clusters the val
    and the test cases fall into when two of them share one (`stats.clustered`), else None:
    the gate and the tests of no true gain then count clusters (`cluster_units`)."""
    gate = config.gate
    clustered_lines = cluster_lines(config, (val_cases, test_cases), clusters)
    grouped = clusters[0] if gate.gate in CLUSTERED_GATES else None  # what the gate counts
    online_val = clusters[0] or val_cases  # what the test of no true gain counts
    val_cases, tested = grouped or val_cases, clusters[1] or test_cases
    mode = resolved_mode(config.error_control, test_cases)
    if mode == "confirm" and not test_cases:
        why = (
            "--error-control confirm: the dataset has no test cases to confirm the best on; "
            "add some, or use --error-control online"
        )
        return Preflight(False, why, None, (why,))
    possible, why = can_ever_accept(gate, val_cases, repetitions)
    if not possible:
        why = _by_cluster(why, grouped)
        return Preflight(False, why, None, (why,))
    level, online_lines = None, []
    if mode == "online":
        budget = online or opening_budget(config, config.max_improvement_cycles)
        refusal, level, online_lines = _online(budget, online_val, config, clusters[0] is not None)
        if refusal is not None:
            refusal = _by_cluster(refusal, clusters[0])
            return Preflight(False, refusal, None, (refusal,))
    if online_val != val_cases:  # the gate counts cases, online control clusters: own lines
        level = None
    binary = min_acceptable_gain(
        gate, val_cases, repetitions, "binary", level=level, pass_fail=_pass_fail(config, clusters)
    )
    lines = [*clustered_lines, _by_cluster(binary.reason, grouped)]
    if config.measure.judge and gate.gate in ("paired", "bootstrap"):  # a judge may grade
        continuous = min_acceptable_gain(gate, val_cases, repetitions, "continuous").reason
        lines.append(_by_cluster(continuous, grouped))
    veto = regression_veto_note(gate, repetitions)
    if veto is not None:
        lines.append(veto)
    lines += [_by_cluster(line, clusters[0]) for line in online_lines]
    if mode == "confirm":
        next_level = confirmations.next_level if confirmations is not None else None
        possible_here, reason = confirmable(config, tested, next_level, clusters[1] is not None)
        if not possible_here:
            lines.append(f"{reason}: verified_only / auto_verified will never publish")
        elif not config.pass_fail:
            lines += _even_gain_line(config, tested, next_level, clusters[1] is not None)
        replays = confirm_repetitions(config, test_cases)
        if config.pass_fail and replays > 1 and clusters[1] is None:
            lines.append(
                "warning: with pass/fail scores the confirmation counts only test cases fixed "
                f"in all {replays} replays (the repetition flags): far less power than one "
                "replay a case; drop the flags, or score with a judge command"
            )
    elif mode == "none":
        where = "no test cases" if not test_cases else "--error-control none"
        lines.append(
            f"{where}: the best is published without a confirmation (the campaign-level "
            "false-publish rate is uncontrolled)"
        )
    elif test_cases:
        lines.append(f"the {test_cases} test cases are scored, not used to confirm the best")
    return Preflight(True, None, binary.mean, tuple(line[:256] for line in lines))


EVEN_GAIN_WORTH_SAYING = 0.05
"""The gain on every test case a graded confirmation needs from which the preflight says it."""


def _even_gain_line(
    config: CampaignConfig, tested: int, level: float | None, grouped: bool
) -> list[str]:
    """The line saying how large a gain on every test case (cluster) a graded confirmation
    needs (`even_gain_needed`), when it is large enough to keep realistic gains unpublished."""
    level = first_confirm_level(config) if level is None else level
    gain = even_gain_needed(config, tested, level)
    if gain is None or gain < EVEN_GAIN_WORTH_SAYING:
        return []
    unit = "clusters" if grouped else "cases"
    return [
        f"graded scores: confirming on {tested} test {unit} needs a gain of about +{gain:.2f} "
        f"on every one at {level:.2g} (the test holds for any score distribution): a smaller "
        "true gain is rarely published; add test cases for more power"
    ]


def cluster_lines(
    config: CampaignConfig, cases: tuple[int, int], clusters: tuple[int | None, int | None]
) -> list[str]:
    """The lines saying that the (val, test) ``cases`` are clustered, and into how many
    ``clusters`` (None: not clustered), and what counts them."""
    lines = []
    for split, count, groups in zip(("val", "test"), cases, clusters, strict=True):
        if groups is None:
            continue
        what = "the confirmation tests each cluster's mean delta (betting bound)"
        if split == "val" and config.gate.gate in CLUSTERED_GATES:
            early = "; early stop reads whole clusters" if config.gate.sequential else ""
            what = (
                f"the {config.gate.gate} gate judges each cluster's mean delta (SE, bootstrap, "
                f"min_cases and min_coverage over clusters{early})"
            )
        elif split == "val":
            what = (
                f"the {config.gate.gate} gate, which has no error level, judges cases; online "
                "control tests each cluster's mean delta"
            )
        lines.append(
            f"the {count} {split} cases are clustered (a session's turns, or metadata.cluster):"
            f" {groups} clusters decide, not {count} cases; {what}"
        )
    return lines


def _pass_fail(config: CampaignConfig, clusters: tuple[int | None, int | None]) -> bool:
    """Whether online control reads the full-gain sign test: pass/fail scores, val not
    clustered (a cluster's mean is read with the betting bound)."""
    return config.pass_fail and clusters[0] is None


def _by_cluster(reason: str, groups: int | None) -> str:
    """A minimum-gain line in clusters when the val cases are clustered."""
    if groups is None:
        return reason
    for case, cluster in _IN_CLUSTERS:
        reason = reason.replace(case, cluster)
    return reason


_IN_CLUSTERS = (
    (" val cases", " val clusters"),
    (" comparable cases", " comparable clusters"),
    (" case(s)", " whole cluster(s)"),
    ("each broken case", "each broken cluster"),
    ("per-case sd", "per-cluster sd"),
    ("every case a full gain", "every cluster a full gain"),
)
"""What the val gate's lines say of cases, said of clusters (`_by_cluster`)."""


def cluster_counts(
    dataset: Dataset, splits: Mapping[str, Sequence[str]]
) -> tuple[int | None, int | None]:
    """How many clusters the val and the test cases (``splits``: the ids of each split)
    fall into (`inputs.case_clusters`), each None when no two of its cases share one (the
    statistics then count cases)."""
    clusters = case_clusters(dataset)
    if not clusters:
        return None, None

    def count(ids: Sequence[str]) -> int | None:
        return count_clusters(ids, clusters) if clustered(ids, clusters) else None

    return count(splits.get("val", ())), count(splits.get("test", ()))


def _online(
    budget: OnlineBudget, val_cases: int, config: CampaignConfig, grouped: bool = False
) -> tuple[str | None, float, list[str]]:
    """(refusal, level, lines) of online mode: refused only when no candidate can reach the
    highest level any can get (the budget's own, or one carried from an accepted
    predecessor), warned when only a carried level can be reached. ``grouped``: val is
    clustered (``val_cases`` counts clusters, read with the betting bound)."""
    base, carried = budget.base_level, budget.next_level
    best = max(base, carried)
    spread = f"alpha {budget.alpha:g} over {budget.horizon} candidates"
    advice = "add val cases, add test cases (the best is then confirmed instead) or use "
    advice += "--error-control none"
    if best <= 0.0:
        why = f"the online error budget ({spread}) is spent: no candidate can be accepted"
        return f"{why}; {advice}", best, []
    gate = config.gate
    reach = partial(
        can_ever_pass_online,
        val_cases,
        margin=no_gain_margin(gate),
        pass_fail=config.pass_fail and not grouped,
        order_seed=gate.seed,
    )
    reachable, why = reach(best)
    if not reachable:
        return f"{why} ({spread}); {advice}", best, []
    at_base, why = reach(base) if base > 0.0 else (False, "")
    if at_base:
        tested = f", {len(budget.tests)} tested" if budget.tests else ""
        return None, base, [f"{why} ({spread}{tested})"]
    warning = (
        f"warning: at the budget's own level ({base:.2g}, {spread}) no candidate can be "
        f"accepted with {val_cases} val cases; only the next one can, at the level {carried:.2g} "
        "carried from the last accepted candidate"
    )
    return None, carried, [warning]
