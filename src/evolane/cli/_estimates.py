"""The estimate in words, for ``estimate``, ``optimize --dry-run`` and ``doctor``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from evolane.cli._amounts import count


def judge_calls(calls: int, samples: int) -> str:
    """``calls`` judge calls in words, with the model requests they make at ``samples``
    answers each (the built-in model judge's ``--judge-samples``)."""
    if samples <= 1:
        return f"{calls} judge calls"
    return f"{calls} judge calls x {samples} samples = {calls * samples} model requests"


def estimate_lines(estimate: Any) -> list[str]:
    """The estimate in words: counts (judge retries apart: not certain), the wall range, the
    worst case when the range is a realistic one, and what it rests on."""
    high = estimate.wall_high_seconds
    low = "?" if estimate.wall_low_seconds is None else f"{estimate.wall_low_seconds:.0f} s"
    more = estimate.judge_retries_max
    retries = f" (+ up to {more} retries)" if more else ""
    judges = judge_calls(estimate.judge_calls_max, getattr(estimate, "judge_samples", 1))
    lines = [
        f"estimate: at most {estimate.replays_max} replays, {judges}{retries}, "
        f"{estimate.optimizer_calls_max} optimizer calls; wall {low} .. "
        f"{high:.0f} s (val {estimate.val_cases} cases x {estimate.baseline_repetitions}/"
        f"{estimate.candidate_repetitions} repetitions, test {estimate.test_cases}); "
        f"{estimate.basis}"
    ]
    if estimate.wall_worst_seconds is not None:
        lines.append(
            f"worst case: {estimate.wall_worst_seconds:.0f} s (every unit into its timeout and "
            "kill grace, every judge call retried)"
        )
    return lines


def ceiling_lines(estimate: Any, ceilings: dict[str, float | None]) -> list[str]:
    """Each ceiling set (``max_tokens``, ``max_cost_usd``, ``wall_clock_budget``) against
    what the estimate says this run may spend: below it, the run may stop budget limited
    (exit 3); a spend no earlier run tells is said to be unknown. A ceiling counts the whole
    campaign: a later cycle gets what its earlier ones left (``estimate.campaign_used``).
    The wall is compared only against a realistic range (a probe or an earlier run)."""
    lines = []
    used = getattr(estimate, "campaign_used", None)
    spends = (
        ("--max-tokens", ceilings.get("max_tokens"), estimate.tokens, count, "tokens"),
        ("--max-cost-usd", ceilings.get("max_cost_usd"), estimate.cost_usd, _dollars, "cost_usd"),
    )
    for flag, ceiling, spend, shown, dimension in spends:
        if ceiling is None:
            continue
        spent = (getattr(used, dimension, None) or 0.0) if used is not None else 0.0
        left, named = _left(flag, ceiling, spent, shown)
        if spend is None:
            lines.append(
                f"ceiling: {named}: this run's spend is unknown (no earlier run in this store "
                "with these commands reported it)"
            )
        elif spend > left:
            lines.append(
                f"ceiling: {named} is below the ~{shown(spend)} this run may spend: it may "
                "stop there, budget limited (exit 3)"
            )
        else:
            lines.append(f"ceiling: {named} covers this run's ~{shown(spend)}")
    budget, low = ceilings.get("wall_clock_budget"), estimate.wall_low_seconds
    if budget is not None and low is not None:
        spent = (getattr(used, "wall_seconds", None) or 0.0) if used is not None else 0.0
        left, named = _left("--wall-clock-budget", budget, spent, lambda s: f"{s:.0f} s")
        if low >= left:
            why = "is below even a lucky run's wall: it will stop budget limited (exit 3)"
        elif estimate.wall_high_seconds >= left:
            why = "is within the wall range: the run may stop there, budget limited (exit 3)"
        else:
            why = f"covers the wall range (up to {estimate.wall_high_seconds:.0f} s)"
        lines.append(f"ceiling: {named} {why}")
    return lines


def _left(
    flag: str, ceiling: float, spent: float, shown: Callable[[float], str]
) -> tuple[float, str]:
    """What is left of a campaign's ``ceiling`` after ``spent``, and the ceiling in words
    (with what the campaign has spent of it, when it has)."""
    if not spent:
        return ceiling, f"{flag} {shown(ceiling)}"
    left = max(0.0, ceiling - spent)
    return left, f"{flag} {shown(ceiling)} ({shown(left)} left: the campaign spent {shown(spent)})"


def _dollars(value: float) -> str:
    return f"${value:.2f}"
