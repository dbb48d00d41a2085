"""The live view in words (issue 20, item 4): scores and their sparkline, decisions with the
optimizer's summary, the rule's numbers and the cases fixed and broken, budget rows only for
ceilings that are set, jargon said in words, and no line wider than the terminal, drawn at
80 and 120 columns from a scripted run and from a real toy run's events.jsonl."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from rich.text import Text

from evolane.cli._render import render_view
from evolane.cli._view import plain_line
from evolane.cli._viewtext import fit, middle, pack, rule_text, short_digest, sparkline
from evolane.measure._progress import ProgressBus
from evolane.messages import (
    BudgetUpdate,
    DecisionEvent,
    EstimateEvent,
    MeasureEvent,
    PhaseEvent,
    ProgressEvent,
    RunFinished,
    RunStarted,
    SlotEvent,
    Usage,
)
from evolane.views import ViewState, read_events
from tests.campaign_helpers import toy_flags, write_toy

PARENT = "sha256:" + "ab12" * 16
GOOD = "sha256:" + "cd34" * 16
BAD = "sha256:" + "ef56" * 16
LONG_SUMMARY = (
    "Retry the fetch step on timeouts and cache the parsed schema between cases so that "
    "the slow endpoint is called at most once per case instead of three times"
)
RUN_ID = "r-20261203-025600-d067de"
CAMPAIGN_ID = "c-20261203-025600-b2771b"
EVOLANE = [sys.executable, "-m", "evolane"]


def _decision(slot: int, digest: str, **fields: object) -> DecisionEvent:
    settings: dict[str, object] = {
        "run_id": "-",
        "iteration": 0,
        "slot": slot,
        "digest": digest,
        "gate": "paired",
        "k_se": 1.0,
        "min_effect": 0.0,
        "n": 16,
        "n_planned": 16,
        **fields,
    }
    return DecisionEvent(**settings)  # type: ignore[arg-type]


def _parent(iteration: int, done: int, mean: float | None = None) -> MeasureEvent:
    """The parent alone on val: in progress, or finished with its mean score."""
    return MeasureEvent(
        run_id="-",
        measurement_id=f"c0.i{iteration}.base",
        pairs_done=done,
        pairs_planned=16,
        parent_only=True,
        finished=mean is not None,
        purpose="baseline" if mean is not None else "",
        split="val" if mean is not None else "",
        iteration=iteration,
        baseline_mean=mean,
    )


def script(upto: str = "end") -> list[ProgressEvent]:
    """A realistic run: confined commands, the parent measured, an accept decided early, a
    reject with a long summary, the next parent measured, spend without ceilings, the end."""
    events: list[ProgressEvent] = [
        RunStarted(
            run_id="-",
            campaign_id=CAMPAIGN_ID,
            cycle=0,
            iterations=3,
            population=2,
            replay_lanes=4,
            judge_lanes=2,
            isolation="confined (no network)",
            safeguards=("lease_sweep", "subreaper", "lifeline"),
        ),
        EstimateEvent(run_id="-", replays_max=96, judge_calls_max=96, optimizer_calls_max=6),
        PhaseEvent(run_id="-", phase="baseline", iteration=0, parent=PARENT),
        _parent(0, 5),
    ]
    if upto == "baseline":
        return events
    events += [
        _parent(0, 16, 0.5),
        PhaseEvent(run_id="-", phase="optimize", iteration=0, parent=PARENT, convergence="ok"),
        _decision(
            0,
            GOOD,
            decision="accept",
            reason="early stop: early stop after 12 of 16 cases, settled: even if ...: accepted",
            mean_delta=0.15,
            se=0.0146,
            early="settled",
            fixed=3,
            broken=0,
            candidate_mean=0.65,
            summary="Add a retry on timeouts",
        ),
        _decision(
            1,
            BAD,
            decision="reject",
            reason="tie: mean_delta +0.0625 = k*SE (1.00 x 0.0625 = 0.0625): rejected",
            mean_delta=0.0625,
            se=0.0625,
            fixed=1,
            broken=0,
            candidate_mean=0.5625,
            summary=LONG_SUMMARY,
        ),
        SlotEvent(run_id="-", iteration=0, slot=0, stage="selected", digest=GOOD),
        SlotEvent(
            run_id="-",
            iteration=0,
            slot=1,
            stage="rejected",
            digest=BAD,
            reason="tie: mean_delta +0.0625 = k*SE (1.00 x 0.0625 = 0.0625): rejected",
        ),
        PhaseEvent(run_id="-", phase="baseline", iteration=1, parent=GOOD),
        _parent(1, 16, 0.65),
        BudgetUpdate(
            run_id="-",
            spent=Usage(tokens=12_300, cost_usd=0.41, wall_seconds=62.0),
            reserved=Usage(tokens=0, cost_usd=0.0),
            ceilings=Usage(),
            by_role={"optimizer": Usage(tokens=12_300, cost_usd=0.41)},
        ),
    ]
    if upto == "end":
        events.append(
            RunFinished(
                run_id="-",
                status="finished",
                campaign_status="complete",
                best=GOOD,
                baseline_val=0.5,
                best_val=0.65,
                report="/tmp/a/long/store/path/runs/" + RUN_ID + "/report.json",
            )
        )
    return events


def _folded(events: list[ProgressEvent]) -> ViewState:
    bus, state = ProgressBus(None, RUN_ID), ViewState()
    for event in events:
        state.fold(bus.publish(event))
    return state


def _drawn(state: ViewState, width: int) -> list[str]:
    """The view drawn by rich's recording console at ``width`` columns, line by line."""
    return _lines(render_view(state, state.t + 30.0), width)


def _lines(renderable: Any, width: int) -> list[str]:
    """``renderable`` laid out for ``width`` columns, its lines neither wrapped nor cropped by
    the console: a line the view made too long shows whole (so a width check can fail)."""
    console = Console(record=True, width=width, file=io.StringIO())
    console.print(renderable, soft_wrap=True, crop=False)
    return [line.rstrip() for line in console.export_text().splitlines()]


def test_the_drawer_shows_a_line_too_wide_whole() -> None:
    """The width checks below read what the view laid out, not what the console cut."""
    assert max(len(line) for line in _lines(Text("word " * 40), 80)) > 80


def _holds_whole(lines: list[str], text: str) -> bool:
    """Whether one line holds all of ``text`` (it was not wrapped onto the next)."""
    return any(text in line for line in lines)


@pytest.mark.parametrize("width", [80, 120])
def test_the_view_fits_and_says_scores_decisions_and_spend_in_words(width: int) -> None:
    lines = _drawn(_folded(script()), width)
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    for whole in (
        f"evolane {RUN_ID}  campaign {CAMPAIGN_ID}  cycle 0",
        "val score: baseline 0.500  best so far 0.650 (+0.150)  ▁█",
        "commands confined (bubblewrap, no network),",
        "processes reaped on exit",
        "i0.s0 accept  delta +0.1500 > 1.0 x SE 0.0146  fixed 3, broken 0",
        "decided early: the remaining cases cannot change it",
        "edit: Add a retry on timeouts",
        "i0.s1 reject  delta +0.0625 <= 1.0 x SE 0.0625  fixed 1, broken 0",
        "spent: 12.3k tokens · $0.4100 · 1m02s command time",
        "by role: optimizer 12.3k tokens $0.4100",
        f"best {short_digest(GOOD)}",
        "val 0.500 -> 0.650",
    ):
        assert _holds_whole(lines, whole), (whole, "\n".join(lines))
    text = "\n".join(lines)
    # the long summary loses whole trailing words, never part of one
    (edit,) = [line.strip() for line in lines if "edit: Retry" in line]
    assert edit.endswith(" …") and (edit[:-2].split(" ")[-1] in LONG_SUMMARY.split(" "))
    assert "report /tmp/" in text and f"{RUN_ID}/report.json" in text  # a path: its middle cut
    for jargon in ("lease_sweep", "subreaper", "settled", "no ceiling", "used (", "k*SE"):
        assert jargon not in text, jargon
    assert "rejected       sha256:ef56ef56…ef56  delta +0.0625 <= 1.0 x SE 0.0625" in text


@pytest.mark.parametrize("width", [80, 120])
def test_a_baseline_is_measured_not_decided(width: int) -> None:
    lines = _drawn(_folded(script("baseline")), width)
    assert _holds_whole(lines, "measuring the parent: 5/16 cases")
    text = "\n".join(lines)
    assert "Δ" not in text and "indecisive" not in text and "pairs" not in text
    assert max(len(line) for line in lines) <= width


def test_a_ceiling_that_is_set_gets_its_row_and_the_rest_one_line() -> None:
    budget = BudgetUpdate(
        run_id="-",
        spent=Usage(tokens=5000, cost_usd=2.0, wall_seconds=30.0),
        reserved=Usage(cost_usd=1.0),
        ceilings=Usage(cost_usd=10.0),
    )
    lines = _drawn(_folded([budget]), 80)
    rows = [line for line in lines if "%" in line]
    assert len(rows) == 1 and rows[0].startswith("cost") and "$10.00" in rows[0]
    assert "also spent: 5.0k tokens · 30.0s command time" in lines


def test_the_state_keeps_the_best_score_by_iteration() -> None:
    state = _folded(script())
    assert (state.baseline_score, state.best_score) == (0.5, 0.65)
    assert state.best_series() == [0.5, 0.65]  # the first parent, then the end of i0
    assert sparkline([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8]) == "▁▂▃▄▅▆▇█"
    assert sparkline([0.4, 0.4]) == "▁▁" and sparkline([0.7, 0.5]) == "█▁"


def test_events_written_before_these_fields_still_load() -> None:
    old = {"kind": "event.decision", "run_id": "r", "iteration": 0, "slot": 1, "digest": "d"}
    event = DecisionEvent.model_validate({**old, "decision": "reject", "reason": "worse"})
    assert (event.summary, event.fixed, event.early) == ("", None, "")
    lines = _drawn(_folded([event]), 80)
    assert _holds_whole(lines, "i0.s1 reject  worse")  # the gate's own reason, as it was


def test_the_rule_is_said_with_its_numbers_or_else_the_reason_that_decided() -> None:
    accept = _decision(0, GOOD, decision="accept", reason="r", mean_delta=0.15, se=0.0146)
    assert rule_text(accept) == "delta +0.1500 > 1.0 x SE 0.0146"
    floor = accept.model_copy(update={"decision": "reject", "min_effect": 0.2})
    assert rule_text(floor) == "delta +0.1500 <= min effect 0.2"
    # another rule overruled the gate's (the online error control): its reason, not a false rule
    online = accept.model_copy(update={"decision": "reject", "reason": "online: alpha spent"})
    assert rule_text(online) == "online: alpha spent"
    coverage = accept.model_copy(update={"decision": "indecisive", "n": 3, "early": "coverage"})
    assert rule_text(coverage) == "only 3 of 16 cases comparable: no decision"


def test_fitting_drops_whole_words_and_cuts_digests_in_the_middle() -> None:
    assert fit("one two three four", 12) == "one two …"
    assert fit("short", 12) == "short"
    assert middle("abcdefghijklmnop", 7) == "abcd…op" and len(middle("x" * 90, 40)) == 40
    assert short_digest(PARENT) == "sha256:ab12ab12…ab12"
    assert pack(["alpha beta", "gamma", "delta"], 17) == ["alpha beta  gamma", "    delta"]


def _entries(out: str) -> list[str]:
    """Plain output as one entry per event: continuation lines joined to their first."""
    entries: list[str] = []
    for line in out.splitlines():
        body = line.split("] ", 1)[1] if re.match(r"^\[ *\d+\.\ds\] ", line) else None
        if body is None:
            continue
        if body.startswith("    ") and entries:
            entries[-1] += "  " + body.strip()
        else:
            entries.append(body)
    return entries


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A real toy run with the paired gate and plain progress: its store and its output."""
    root = tmp_path_factory.mktemp("view")
    plan = {"0.0": "fix:2", "0.1": "harm:1", "1.0": "fix:1", "1.1": "noop"}
    flags = toy_flags(write_toy(root / "toy", plan), root / "store")
    for name, value in (("--gate", "paired"), ("--progress", "plain"), ("--iterations", "2")):
        flags[flags.index(name) + 1] = value
    run = subprocess.run(
        [*EVOLANE, "optimize", *flags], capture_output=True, text=True, timeout=300, cwd=root
    )
    assert run.returncode == 0, run.stderr
    return root / "store", run.stdout


def test_a_real_runs_plain_lines_fit_and_tell_the_decisions(toy_run: tuple[Path, str]) -> None:
    _, out = toy_run
    progress = [line for line in out.splitlines() if re.match(r"^\[ *\d+\.\ds\] ", line)]
    assert progress and max(len(line) for line in progress) <= 80, "\n".join(progress)
    entries = _entries(out)
    assert (
        "measured the parent: 12/12 cases, val score 0.333"
        in entries[next(i for i, e in enumerate(entries) if e.startswith("measured the parent"))]
    )
    (accept,) = [e for e in entries if e.startswith("decision i0.s0")]
    assert re.search(r"accept  delta \+0\.\d{4} > 1\.0 x SE 0\.\d{4}", accept), accept
    assert "fixed 2, broken 0" in accept and "edit: fix:2" in accept
    (reject,) = [e for e in entries if e.startswith("decision i0.s1")]
    assert re.search(r"reject  delta -0\.\d{4} <= 1\.0 x SE 0\.\d{4}", reject), reject
    assert "fixed 0, broken 1" in reject and "edit: harm:1" in reject
    assert any("best so far 0.500 (+0.167)  ▁█" in e for e in entries), entries
    assert "delta +0.0000" not in out and "lease_sweep" not in out


@pytest.mark.parametrize("width", [80, 120])
def test_a_real_runs_events_draw_the_view_whole(toy_run: tuple[Path, str], width: int) -> None:
    store, _ = toy_run
    (events,) = store.glob("runs/*/events.jsonl")
    state = ViewState()
    for event in read_events(events, lambda _: None):
        state.fold(event)
    lines = _drawn(state, width)
    assert max(len(line) for line in lines) <= width, "\n".join(lines)
    text = "\n".join(lines)
    assert _holds_whole(lines, "val score: baseline 0.333  best so far 0.500 (+0.167)  ▁█")
    assert re.search(r"i0\.s0 accept  delta \+0\.\d{4} > 1\.0 x SE 0\.\d{4}", text), text
    assert _holds_whole(lines, "edit: fix:2") and _holds_whole(lines, "fixed 2, broken 0")
    assert "edit: edit:" not in text  # the toy optimizer's summary says "edit: fix:2" itself
    assert _holds_whole(lines, "final test: seed 0.167 -> best 1.000  6 cases")
    assert "used (" not in text and "spent: 0 tokens · $0.00 ·" in text  # no ceiling set


def test_an_optimizer_summary_that_says_edit_itself_is_labelled_once() -> None:
    """The example optimizer's summaries read "edit: fix:2"; the view labels an edit once."""
    from evolane.cli._viewtext import decision_segments

    mine = _decision(
        0, GOOD, decision="accept", reason="r", mean_delta=0.1, se=0.01, summary="edit: fix:2"
    )
    theirs = _decision(
        0, GOOD, decision="accept", reason="r", mean_delta=0.1, se=0.01, summary="Add a retry"
    )
    assert decision_segments(mine, "i0.s0")[-1] == "edit: fix:2"
    assert decision_segments(theirs, "i0.s0")[-1] == "edit: Add a retry"


def test_the_live_view_says_how_long_a_running_run_has_been_quiet() -> None:
    """Found by review: the clock went on and nothing else told a hung run from a working
    one. Past `QUIET_AFTER` seconds without an event the header says so, with the lanes
    busy; a finished run is never quiet."""
    from evolane.cli._view import QUIET_AFTER

    state = _folded(script(upto="decision"))
    assert state.finished is None
    fresh = "\n".join(_lines(render_view(state, state.t + QUIET_AFTER / 2), 200))
    assert "no event for" not in fresh
    lines = _lines(render_view(state, state.t + 95.0), 80)
    assert max(len(line) for line in lines) <= 80
    busy = f"({state.lanes_busy}/{state.replay_lanes} lanes busy)"
    assert _holds_whole(lines, f"no event for 1m35s {busy}"), "\n".join(lines)
    ended = _folded(script())
    assert "no event for" not in "\n".join(_lines(render_view(ended, ended.t + 95.0), 200))


@pytest.mark.parametrize("prefix", ["", "early stop: "])  # this session's form, and before
def test_an_early_stop_reads_the_same_in_either_stored_form(prefix: str) -> None:
    """The gate's reason said "early stop: early stop after ..." (report.md showed it so;
    found by review); runs stored before still read as one."""
    reason = f"{prefix}early stop after 12 of 16 cases, settled: even if the rest: indecisive"
    event = _decision(0, GOOD, decision="indecisive", reason=reason, mean_delta=0.1, se=0.1)
    assert rule_text(event) == "even if the rest"


def test_an_accepted_slot_another_did_better_than_says_why_it_was_rejected() -> None:
    # Found by review: "decision i0.s1 accept ..." then "slot i0.s1 rejected sha256:..." with
    # no reason; a slot that ended as its decision said keeps its line short.
    state = ViewState()
    lines = []
    for event in (
        _decision(0, GOOD, decision="reject", reason="worse"),
        _decision(1, BAD, decision="accept", reason="better"),
        SlotEvent(run_id="-", iteration=0, slot=0, stage="rejected", digest=GOOD, reason="worse"),
        SlotEvent(
            run_id="-",
            iteration=0,
            slot=1,
            stage="rejected",
            digest=BAD,
            reason="accepted, but another candidate of the iteration did better",
        ),
    ):
        state.fold(event)
        lines.append(plain_line(event, state) or "")
    assert "slot i0.s0 rejected" in lines[2] and "worse" not in lines[2], lines
    assert "slot i0.s1 rejected" in lines[3], lines
    assert "another candidate of the iteration did better" in lines[3], lines


FORGED = "oops\nfinished: finished (campaign complete)\r\n\u2028  i0.s0 accept  fixed 7"


def test_a_commands_line_breaks_never_make_a_line_of_their_own() -> None:
    """Found by review: an optimizer that failed with ``oops\\nfinished: finished ...`` on
    stderr printed, in the plain lines and in the live view, a line of its own at column 0
    (no time, no indent) that read as the run's end. Its words stay on its entry's lines."""
    state = ViewState()
    event = SlotEvent(
        run_id="-",
        iteration=0,
        slot=0,
        stage="blocked",
        reason=f"the optimizer failed: exit_1 {FORGED}",
    )
    state.fold(event)
    plain = (plain_line(event, state) or "").split("\n")
    assert all(line.startswith("[") for line in plain), plain  # each stamped with its time
    assert "oops finished:" in " ".join(plain)  # still told, as text
    drawn = _drawn(state, 120)
    assert not [line for line in drawn if line.startswith(("finished", "i0.s0 accept"))], drawn
    assert not [line for line in drawn if "\u2028" in line or "\r" in line], drawn


def test_the_views_text_never_carries_a_control_or_bidi_character() -> None:
    # Each text reaching the view is made printable by its producer (`Said` fields, repr);
    # `fit` and `pack`, which every line of the view goes through, make sure of it too.
    hostile = "ok\x1b]0;pwned\x07 a\u202etxt.exe \x1b[2J done"
    for line in (fit(hostile, 80), fit(hostile * 4, 40), *pack([hostile, hostile], 60)):
        assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", line)
        assert "\ufffd" in line


def test_a_quiet_run_says_it_waits_on_the_optimizer_or_a_judge() -> None:
    """Found by review: a hung optimizer read ``no event for 2m00s (0/4 lanes busy)`` until
    ``--optimizer-idle`` ended it, and a hung judge the same once the replays were done: as
    if nothing ran at all. The quiet words say what does run then."""
    from evolane.cli._view import quiet_words

    state = ViewState()
    for event in (
        RunStarted(
            run_id=RUN_ID, t=0.1, campaign_id=CAMPAIGN_ID, cycle=0, iterations=2,
            population=2, replay_lanes=4, judge_lanes=2,
        ),
        MeasureEvent(
            run_id=RUN_ID, t=3.0, measurement_id="c0.i0.base", pairs_done=18,
            pairs_planned=18, finished=True, parent_only=True,
        ),
        PhaseEvent(run_id=RUN_ID, t=5.0, phase="optimize", cycle=0, iteration=0),
    ):  # fmt: skip
        state.fold(event)
    assert quiet_words(state, 120.0) == (
        "no event for 2m00s (0/4 lanes busy, waiting for the optimizer)"
    )
    judged = MeasureEvent(
        run_id=RUN_ID, t=9.0, measurement_id="c0.i0.s0", pairs_done=17, pairs_planned=18,
        lanes_busy=0, judges_busy=1,
    )  # fmt: skip
    state.fold(judged)
    assert quiet_words(state, 60.0) == "no event for 1m00s (0/4 lanes busy, 1 being judged)"
    for slot in (0, 1):
        state.fold(SlotEvent(run_id=RUN_ID, t=12.0, iteration=0, slot=slot, stage="rejected"))
    state.fold(judged.model_copy(update={"finished": True, "judges_busy": 0}))
    assert quiet_words(state, 60.0) == "no event for 1m00s (0/4 lanes busy)"
