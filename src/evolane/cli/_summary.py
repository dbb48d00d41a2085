"""The final summary of ``evolane optimize``: what happened, where the report is, how to resume."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.markup import escape

from evolane.cli._amounts import role_spend
from evolane.cli._output import reader_may_leave, test_delta_text
from evolane.cli._resumable import failed_advice
from evolane.inputs import one_line
from evolane.messages import printable
from evolane.views import token_count

_UNPUBLISHED = frozenset({"refused", "rolled_back", "recovered", "unconfirmed"})
"""Apply statuses of an ``auto_verified`` publish that left the target as it was."""


def _ci(score: Any) -> str:
    if score is None:
        return "n/a"
    return f"{score.mean:.3f} [{score.ci_low:.3f}, {score.ci_high:.3f}]"


def _test_result(report: Any) -> list[str]:
    """The sealed test measurement of best vs seed, the confirmation made on it, and the
    campaign's error control in words."""
    test, lines = report.test, []
    if test is not None:
        lines.append(f"test delta: {test_delta_text(test, report.confirmation)}")
    if report.confirmation is not None:
        lines.append(f"confirmation: {report.confirmation.sentence}")
    if report.error_control:
        lines.append(f"error control: {report.error_control}")
    return lines


def val_note(report: Any) -> str:
    """A warning on the val line: its scores are optimistic when val fed the optimizer, and
    a best's are whenever it was chosen on these very replays (found by review: a useless
    best's val gain was positive in 83 of 83 campaigns, +0.12 on average); test is honest,
    unless the best was published on it (`campaign.PUBLISHED_ON_TEST`, said on its line)."""
    from evolane.campaign import published_on_test

    splits = report.splits
    if splits and splits.optimistic:
        return "  (optimistic: val fed the optimizer)"
    if report.selected is not None and published_on_test(report.confirmation):
        return "  (optimistic: the best was chosen on these replays)"  # and test: see its line
    if report.selected is not None:
        return "  (optimistic: the best was chosen on these replays; test is the honest figure)"
    return ""


def _said(text: str) -> str:
    """A note that may quote a command (its stderr) on one line, as text: found by review,
    an optimizer that could not run wrote ``\\nfinished  campaign ...: complete`` and
    ``\\nbest: ...`` into the summary's note, lines of their own that read as the summary's."""
    return printable(one_line(text))


def print_summary(outcome: Any, flags: dict[str, Any]) -> None:
    """Print the summary (to stderr when stdout carries the JSONL event stream); a reader
    that went away ends it quietly (`reader_may_leave`)."""
    with reader_may_leave():
        _print_summary(outcome, flags)


def _print_summary(outcome: Any, flags: dict[str, Any]) -> None:
    from evolane.campaign import dropped_on_host as dropped

    stream = sys.stderr if flags.get("progress") == "jsonl" else sys.stdout
    console = Console(file=stream, highlight=False, soft_wrap=True)
    store = flags["store"]
    if outcome is None or outcome.report is None:
        run = flags.get("resume") or flags.get("run_id")
        console.print("[bold]interrupted[/bold]: cancelled at once; finished units are kept.")
        if run:
            console.print(escape(f"resume: evolane optimize --resume {run} --store {store}"))
        return
    report, run_dir = outcome.report, outcome.run_dir
    scores, spent = report.scores, report.budget.spent
    best = "the seed (nothing accepted)" if report.selected is None else report.best.digest[:19]
    lines = [
        f"[bold]{report.status}[/bold]  campaign {report.campaign_id}: {report.campaign_status}"
        f"  (run {report.run_id}, {report.wall_text()})",
        f"best: {best}",
        f"val:  {_ci(scores.baseline_val)} -> {_ci(scores.best_val)}{val_note(report)}",
        f"test: {_ci(scores.baseline_test)} -> {_ci(scores.best_test)}  (sealed: only confirms)",
        *_test_result(report),
        f"budget spent: command time {spent.wall_seconds or 0:.1f} s,"
        f" tokens {token_count(spent.tokens)}, cost ${spent.cost_usd or 0:.4f}",
    ]
    if report.ceilings_text():
        lines.append(f"ceilings (the campaign's): {report.ceilings_text()}")
    if report.budget.spent_by_role:
        lines.append(f"spent by role: {role_spend(report.budget.spent_by_role)}")
    if report.message:
        lines.append(escape(f"note: {_said(report.message)}"))
    lines += [escape(line) for line in _lost_proposals(report)]
    lines += [escape(f"slot {row.slot_id}: {_said(row.reason)}") for row in dropped(report)]
    if report.apply is not None:
        why = ""  # a publish that did not happen says why, not only in report.json
        if report.apply.status in _UNPUBLISHED and report.apply.message:
            said = report.apply.message.removesuffix(f"; proposal in {report.apply.proposal_dir}")
            why = f": {escape(_said(said))}"  # the proposal has a line of its own
        lines.append(f"apply ({report.apply.policy}): {report.apply.status}{why}")
        if report.apply.proposal_dir:
            lines.append(escape(f"proposal: {report.apply.proposal_dir}"))
    reports = [f"report: {run_dir / 'report.json'}", f"        {run_dir / 'report.md'}"]
    if (run_dir / "report.html").is_file():
        reports.append(f"        {run_dir / 'report.html'}")
    lines += [escape(line) for line in reports]  # a store path may hold "[...]"
    if report.status == "interrupted":
        lines.append(escape(f"resume: evolane optimize --resume {report.run_id} --store {store}"))
    elif report.status == "failed":
        lines += [escape(line) for line in failed_advice(report.config, report.campaign_id)]
    elif report.campaign_status in ("paused", "active"):
        larger = " --wall-clock-budget <larger>" if report.status == "budget_limited" else ""
        lines.append(
            "continue: evolane optimize <the same flags> "
            f"--resume-campaign {report.campaign_id}{larger}"
        )
    for line in lines:
        console.print(line)


def _lost_proposals(report: Any) -> list[str]:
    """A line when optimizer calls failed, and how many because evolane's lane broke (found
    by review: every call lost to a crashing lane read "best: the seed (nothing accepted)",
    as if the optimizer had found nothing)."""
    from evolane.campaign import LANE_BROKE

    lost = {
        record.where: record.failure
        for record in report.failures
        if record.failure.stage == "optimizer"
        and record.failure.code not in ("cancelled", "not_stored")  # stopped; none to run
    }
    if not lost:
        return []
    own = sum(failure.code in LANE_BROKE for failure in lost.values())
    first = next(iter(lost.values()))
    blame = f", {own} because evolane's lane broke (a bug: please report it)" if own else ""
    return [
        f"proposals lost: {len(lost)} of {len(report.funnel)} optimizer calls failed{blame}; "
        f"the first: {_said(f'{first.code}: {first.message}')[:300]}"
    ]
