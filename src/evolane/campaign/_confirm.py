"""Confirm before publish: the campaign's default error control (DESIGN §6).

A campaign tries many candidates on the same val cases; each useless one passes the val
gate with some probability (about 16% at k = 1), so the best of a campaign is often useless
(about half of default campaigns, by the simulation in ``benchmarks/decisions.py``). The
sealed test split took no part in choosing the best, so a one-sided test of the best
against the seed on it (`stats.confirm`, at the gate's ``confidence``) confirms a best with
no true gain with probability at most 1 - confidence, however many candidates were tried.
`verified_only` and `auto_verified` publish only a confirmed best; `proposal` only reports.

The test split is measured with `confirm_repetitions` replays per case and arm. With pass/fail
scores the test counts full gains (a case every replay of which went from fail to pass), which
more replays only make rarer: one replay per case. With a judge command's scores (the betting
bound on the mean) a small split gets `SMALL_TEST_REPETITIONS` replays per case below
`SMALL_TEST_SPLIT` cases, the same number for both arms. Explicit repetition flags win.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from evolane.campaign._config import CampaignConfig
from evolane.campaign._online import OnlineBudget, online_words, opening_budget, resolved_mode
from evolane.messages import Record, ShortText, Text
from evolane.stats import can_ever_confirm, confirm, no_gain_margin

SMALL_TEST_SPLIT = 32
"""Below this many test cases the confirmation replays each case `SMALL_TEST_REPETITIONS`
times (per arm)."""
SMALL_TEST_REPETITIONS = 3

ConfirmVerdict = Literal["confirmed", "unconfirmed", "indecisive"]


class ConfirmationRecord(Record):
    """The confirmation of the best tree against the seed on the held-out test split."""

    decision: ConfirmVerdict
    published: bool = False
    """Whether the apply policy may publish the best: only when confirmed."""
    n: int = Field(ge=0)
    n_planned: int = Field(ge=0)
    repetitions: int = Field(ge=1)
    mean_delta: float
    p_value: float = Field(ge=0.0, le=1.0)
    level: float = Field(gt=0.0, lt=1.0)
    confidence: float = Field(gt=0.0, lt=1.0)
    reason: ShortText
    sentence: Text
    """The verdict in words, for the summary and report.md."""


def confirm_repetitions(config: CampaignConfig, test_cases: int) -> int:
    """Replays per test case and arm in the confirmation: the larger explicit repetition
    flag when one is given; else 1 with pass/fail scores (the full-gain test gains nothing
    from more); else `SMALL_TEST_REPETITIONS` below `SMALL_TEST_SPLIT` cases, else 1."""
    explicit = [
        r
        for r in (config.baseline_replay_repetitions, config.candidate_replay_repetitions)
        if r is not None
    ]
    if explicit:
        return max(explicit)
    if config.pass_fail:
        return 1
    return SMALL_TEST_REPETITIONS if test_cases < SMALL_TEST_SPLIT else 1


def confirmable(config: CampaignConfig, test_cases: int) -> tuple[bool, str]:
    """Whether ``test_cases`` held-out cases can ever confirm a best, with the test `confirm`
    reads for this campaign's scores and margin, and the one-line why."""
    gate = config.gate
    return can_ever_confirm(
        test_cases, gate.confidence, margin=no_gain_margin(gate), pass_fail=config.pass_fail
    )


def confirmation_of(
    baseline: dict[str, list[float]],
    candidate: dict[str, list[float]],
    config: CampaignConfig,
    test_cases: int,
) -> ConfirmationRecord:
    """`stats.confirm` of the best (``candidate``) against the seed on the test split."""
    gate = config.gate
    result = confirm(baseline, candidate, gate, n_planned=test_cases, pass_fail=config.pass_fail)
    level = f"{result.level:.2g}"
    stats = f"mean {result.mean_delta:+.3g}, p = {result.p_value:.2g}"
    cases = f"the {test_cases} held-out test cases"
    if result.decision == "confirmed":
        sentence = f"the best candidate was confirmed on {cases} ({stats} <= {level})"
    elif result.decision == "unconfirmed":
        sentence = f"the best candidate was not confirmed on {cases} ({stats} > {level})"
    else:
        sentence = (
            f"the best candidate could not be confirmed: only {result.n} of {cases} could be "
            "compared"
        )
    possible, why = confirmable(config, test_cases)
    if result.decision != "confirmed" and not possible:
        sentence += f" ({why})"
    published = result.decision == "confirmed"
    if not published and config.apply != "proposal":
        sentence += ": not published"
    return ConfirmationRecord(
        decision=result.decision,
        published=published,
        n=result.n,
        n_planned=result.n_planned,
        repetitions=confirm_repetitions(config, test_cases),
        mean_delta=result.mean_delta,
        p_value=result.p_value,
        level=result.level,
        confidence=gate.confidence,
        reason=result.reason[:256],
        sentence=sentence[:2048],
    )


def error_control(
    config: CampaignConfig,
    test_cases: int,
    online: OnlineBudget | None = None,
    val_cases: int | None = None,
    val_fed: bool = False,
) -> str:
    """The campaign's error control, in words, for the report: ``online`` with its budget
    (``online``, else a fresh one) and price with ``val_cases`` (``val_fed``: the optimizer
    saw val outcomes, and the guarantee does not hold); ``confirm``; or ``none``."""
    gate = config.gate
    level = 1 - gate.confidence
    mode = resolved_mode(config.error_control, test_cases)
    if mode == "online":
        budget = online or opening_budget(config, config.max_improvement_cycles)
        margin = no_gain_margin(gate)
        return online_words(budget, val_cases, val_fed, margin=margin, pass_fail=config.pass_fail)
    if mode == "none":
        where = (
            f"the best is not confirmed on the {test_cases} test cases before it is published"
            if test_cases
            else "the dataset has no test cases, so the best is not confirmed before it is "
            "published"
        )
        return (
            f"none at the campaign level: {where}, and each candidate tried is one more chance "
            "that a useless edit passes the val gate (about half of default campaigns end with "
            "one): the campaign-level false-publish rate is uncontrolled; use --error-control "
            "online, or add test cases to confirm the best"
        )
    possible, why = confirmable(config, test_cases)
    text = (
        f"confirm before publish: the best is tested against the seed on the "
        f"{test_cases} held-out test cases (one-sided test of no true gain at confidence "
        f"{gate.confidence:g}); a best with no true gain is published with probability at "
        f"most {level:.2g}, however many candidates were tried"
    )
    if not possible:
        text += f"; but {why}, so nothing can be published"
    return text


def publish_blocked(confirmation: ConfirmationRecord | None) -> bool:
    """Whether a confirmation stops `verified_only` / `auto_verified` from publishing."""
    return confirmation is not None and not confirmation.published
