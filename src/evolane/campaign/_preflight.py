"""Preflight: what the gate can accept with this dataset and these settings, said (and a
hopeless configuration refused) before anything runs or is written (DESIGN §6).

The lines come from `stats.min_acceptable_gain` and its siblings: the smallest mean gain the
gate can accept with this many val cases and repetitions (exact for pass/fail scores; with
a judge that grades, also the gain in units of the per-case spread), a `--no-regression`
that can never veto, a test split too small to ever confirm. A configuration in which no
candidate can ever be accepted (fewer val cases than the coverage guard needs) is refused
with an `InputError` (exit 2) naming the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

from evolane.campaign._config import CampaignConfig
from evolane.stats import (
    can_ever_accept,
    can_ever_confirm,
    min_acceptable_gain,
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
    config: CampaignConfig, val_cases: int, test_cases: int, repetitions: tuple[int, int]
) -> Preflight:
    """The preflight of ``config`` on a dataset with ``val_cases`` and ``test_cases``, with
    the val measurement's (baseline, candidate) ``repetitions``."""
    gate = config.gate
    possible, why = can_ever_accept(gate, val_cases, repetitions)
    if not possible:
        return Preflight(False, why, None, (why,))
    binary = min_acceptable_gain(gate, val_cases, repetitions, "binary")
    lines = [binary.reason]
    if config.measure.judge and gate.gate in ("paired", "bootstrap"):  # a judge may grade
        lines.append(min_acceptable_gain(gate, val_cases, repetitions, "continuous").reason)
    veto = regression_veto_note(gate, repetitions)
    if veto is not None:
        lines.append(veto)
    if test_cases > 0:
        confirmable, reason = can_ever_confirm(test_cases, gate.confidence)
        if not confirmable:
            lines.append(f"{reason}: verified_only / auto_verified will never publish")
    else:
        lines.append("no test cases: the best is published without a confirmation")
    return Preflight(True, None, binary.mean, tuple(line[:256] for line in lines))
