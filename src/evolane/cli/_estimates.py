"""The estimate in words, for ``estimate``, ``optimize --dry-run`` and ``doctor``."""

from __future__ import annotations

from typing import Any


def estimate_lines(estimate: Any) -> list[str]:
    """The estimate in words: counts (judge retries apart: not certain), the wall range, the
    worst case when the range is a realistic one, and what it rests on."""
    high = estimate.wall_high_seconds
    low = "?" if estimate.wall_low_seconds is None else f"{estimate.wall_low_seconds:.0f} s"
    more = estimate.judge_retries_max
    retries = f" (+ up to {more} retries)" if more else ""
    lines = [
        f"estimate: at most {estimate.replays_max} replays, {estimate.judge_calls_max} judge "
        f"calls{retries}, {estimate.optimizer_calls_max} optimizer calls; wall {low} .. "
        f"{high:.0f} s (val {estimate.val_cases} cases x {estimate.baseline_repetitions}/"
        f"{estimate.candidate_repetitions} repetitions, test {estimate.test_cases}); "
        f"{estimate.basis}"
    ]
    if estimate.wall_worst_seconds is not None:
        lines.append(
            f"worst case: {estimate.wall_worst_seconds:.0f} s (every unit into its timeout, "
            "every judge call retried)"
        )
    return lines
