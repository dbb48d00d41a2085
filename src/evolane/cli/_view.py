"""What the progress renderers draw from a `ViewState`: the plain line of an event and the
live view, both fitted to a width (`evolane.cli._viewtext`), so neither ever wraps.

Plain lines are packed to `PLAIN_WIDTH` columns, each starting with the event's time; the
live view packs its lines to the console's width each time it is drawn.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import orjson
from rich.console import Console, ConsoleOptions, Group, RenderableType
from rich.table import Table
from rich.text import Text

from evolane import messages
from evolane.cli._amounts import amount, count, duration, role_spend
from evolane.cli._estimates import judge_calls
from evolane.cli._viewtext import (
    decision_segments,
    fit,
    middle,
    pack,
    reason_words,
    rule_text,
    score_segments,
    short_digest,
    spent_text,
)
from evolane.views import TERMINAL_STAGES, ViewState, isolation_words, kind_of

PLAIN_WIDTH = 80
"""Columns every plain line fits in, its time stamp included."""
_STAMP = 10  # "[  12.3s] "
QUIET_AFTER = 30.0
"""Seconds without an event after which the views say how long the run has been quiet: a
hung unit and a slow one look alike until its timeout, and a silent view must not look like
a working one (found by review)."""
_SLOT_ROWS = 12  # candidate slots shown in the live view before "… N more"
_BAR = 20  # cells of a text bar
_LINE_PHASES = frozenset({"optimize", "finalize", "apply"})
_DIMENSIONS: tuple[messages.Dimension, ...] = ("tokens", "cost_usd", "wall_seconds")
_DIMENSION_NAMES = {"tokens": "tokens", "cost_usd": "cost", "wall_seconds": "command time"}


def bar(fraction: float, reserved: float = 0.0, width: int = _BAR) -> str:
    """A text bar like ``█████░░░░░ 52%``; ``reserved`` adds ``▒`` cells after the filled ones."""
    fraction = min(max(fraction, 0.0), 1.0)
    full = round(fraction * width)
    extra = min(width - full, round(min(max(reserved, 0.0), 1.0) * width))
    return "█" * full + "▒" * extra + "░" * (width - full - extra) + f" {fraction:.0%}"


def _iteration_text(state: ViewState, iteration: int | None) -> str:
    if iteration is None:
        return "iteration ?"
    total = f"/{state.iterations}" if state.iterations else ""
    return f"iteration {iteration + 1}{total} (i{iteration})"  # i: as slot ids and reports


def _slot_label(iteration: int, slot: int) -> str:
    return f"i{iteration}.s{slot}"


def _measure_segments(event: messages.MeasureEvent) -> list[str]:
    planned = event.pairs_planned
    done = bar(event.pairs_done / planned) if planned else "?"
    if event.parent_only:
        verb = "measured" if event.finished else "measuring"
        score = "" if event.baseline_mean is None else f", val score {event.baseline_mean:.3f}"
        return [f"{verb} the parent: {event.pairs_done}/{planned} cases{score}"] + (
            [] if event.finished else [done]
        )
    if event.finished and event.purpose not in ("", "paired"):  # figures, not a decision
        low, high = (_score(v) for v in (event.baseline_mean, event.candidate_mean))
        if event.purpose.startswith("final_"):
            return [f"final {event.split}: seed {low} -> best {high}", f"{event.pairs_done} cases"]
        return [f"{event.measurement_id} {event.purpose}: parent {low} -> candidate {high}"]
    parts = [f"{event.measurement_id}  {done}  {event.pairs_done}/{planned} pairs"]
    if event.mean_delta is not None:
        se = "" if event.se is None else f" ± {event.se:.4f} (SE)"
        parts.append(f"Δ {event.mean_delta:+.4f}{se}")
    if event.finished and event.decision:
        parts.append(f"→ {event.decision}")
    return parts


def _score(value: float | None) -> str:
    return "?" if value is None else f"{value:.3f}"


def _estimate_segments(event: messages.EstimateEvent) -> list[str]:
    parts = [
        f"estimate: at most {event.replays_max} replays, "
        f"{judge_calls(event.judge_calls_max, event.judge_samples)}, "
        f"{event.optimizer_calls_max} optimizer calls"
    ]
    if event.judge_retries_max:  # possible, not certain: a segment of its own
        parts.append(f"+ up to {event.judge_retries_max} judge retries")
    if event.wall_low_seconds is not None and event.wall_high_seconds is not None:
        parts.append(
            f"wall {duration(event.wall_low_seconds)}..{duration(event.wall_high_seconds)}"
        )
    if event.wall_worst_seconds is not None:
        parts.append(f"worst case {duration(event.wall_worst_seconds)}")
    if event.tokens is not None:
        parts.append(f"~{count(event.tokens)} tokens")
    if event.cost_usd is not None:
        parts.append(f"~${event.cost_usd:.2f}")
    if event.by_role:
        parts.append("by role " + role_spend(event.by_role))
    return parts


def _preflight_lines(event: messages.EstimateEvent) -> list[str]:
    splits = [f"splits: {event.splits}"] if event.splits else []
    return splits + [f"preflight: {line}" for line in event.preflight]


def _finished_segments(event: messages.RunFinished) -> list[str]:
    parts = [f"finished: {event.status} (campaign {event.campaign_status})"]
    if event.best:
        parts.append(f"best {short_digest(event.best)}")
    if event.baseline_val is not None or event.best_val is not None:
        low, high = ("?" if v is None else f"{v:.3f}" for v in (event.baseline_val, event.best_val))
        parts.append(f"val {low} -> {high}")
    if event.verdict:
        parts.append(event.verdict)
    if event.report:
        parts.append(f"report {event.report}")
    return parts


def _started_segments(event: messages.RunStarted) -> list[str]:
    parts = [
        f"run {event.run_id}",
        f"campaign {event.campaign_id}, cycle {event.cycle}",
        f"{event.iterations} iterations x {event.population} candidates",
        f"{event.replay_lanes} replay lanes, {event.judge_lanes} judge lanes",
    ]
    if event.isolation:
        words = isolation_words(event.isolation, event.safeguards)
        parts += ["commands " + words[0], *words[1:]]
    return parts + (["resumed"] if event.resumed else [])


def _phase_segments(event: messages.PhaseEvent, state: ViewState) -> list[str]:
    if event.phase not in _LINE_PHASES:
        return []
    if event.phase != "optimize":
        return [f"{event.phase} (cycle {event.cycle})"]
    parts = [_iteration_text(state, event.iteration)]
    parts += [f"parent {short_digest(event.parent)}"] if event.parent else []
    return parts + ([f"convergence {event.convergence}"] if event.convergence else [])


def _slot_segments(event: messages.SlotEvent, state: ViewState) -> list[str]:
    if event.stage not in TERMINAL_STAGES:
        return []
    parts = [f"slot {_slot_label(event.iteration, event.slot)} {event.stage}"]
    parts += [short_digest(event.digest)] if event.digest else []
    said = [
        d.decision
        for d in state.decisions
        if (d.iteration, d.slot) == (event.iteration, event.slot)
    ]
    # a decided slot's line shows the decision's reason, unless the slot ended otherwise (an
    # accepted candidate rejected because another of its iteration did better)
    ended_as_said = bool(said) and (said[-1] == "accept") == (event.stage != "rejected")
    return parts + ([reason_words(event.reason)] if event.reason and not ended_as_said else [])


def _slot_reason(slot: messages.SlotEvent, state: ViewState) -> str:
    """The slot's reason; for a decided one, the rule with its numbers."""
    for decision in reversed(state.decisions):
        if (decision.iteration, decision.slot) == (slot.iteration, slot.slot):
            return rule_text(decision)
    return reason_words(slot.reason)


def _measure_line(event: messages.MeasureEvent, state: ViewState) -> list[str]:
    if not (event.finished and event.parent_only and event.split == "val"):
        return []
    scores = score_segments(state.baseline_score, state.best_score, state.best_series())
    return [*_measure_segments(event)[:1], *scores]


_SEGMENTS: dict[str, Callable[[Any, ViewState], list[str]]] = {
    kind_of(messages.RunStarted): lambda event, _state: _started_segments(event),
    kind_of(messages.EstimateEvent): lambda event, _state: _estimate_segments(event),
    kind_of(messages.PhaseEvent): _phase_segments,
    kind_of(messages.SlotEvent): _slot_segments,
    kind_of(messages.MeasureEvent): _measure_line,
    kind_of(messages.DecisionEvent): lambda event, _state: decision_segments(
        event, "decision " + _slot_label(event.iteration, event.slot)
    ),
    kind_of(messages.WarningEvent): lambda event, _state: [f"warning: {event.message}"],
    kind_of(messages.RunFinished): lambda event, _state: _finished_segments(event),
}
"""The plain segments of each event kind that has a line (none: a minor event)."""


def plain_line(event: messages.ProgressEvent, state: ViewState) -> str | None:
    """The plain-mode line(s) for ``event`` (already folded into ``state``), or None if
    minor: at most `PLAIN_WIDTH` columns each, each starting with the event's time."""
    segments = _SEGMENTS.get(event.kind)
    parts = [] if segments is None else segments(event, state)
    width = PLAIN_WIDTH - _STAMP
    lines = pack(parts, width)
    if isinstance(event, messages.EstimateEvent):  # sentences: every word kept, packed
        lines += [
            row for line in _preflight_lines(event) for row in pack(line.split(" "), width, gap=" ")
        ]
    elif isinstance(event, messages.WarningEvent):
        lines = pack(parts[0].split(" "), width, gap=" ")
    if not lines:
        return None
    stamp = f"[{event.t:6.1f}s] "
    return "\n".join(stamp + line for line in lines)


def jsonl_line(event: messages.ProgressEvent) -> str:
    """``event`` as one JSON line (what ``events.jsonl`` holds)."""
    return orjson.dumps(event.model_dump(mode="json")).decode() + "\n"


# ----- the live view ----------------------------------------------------------------------


class Packed:
    """Segments packed to the console's width when drawn (`pack`): never a wrapped line."""

    def __init__(
        self, segments: list[str], style: str = "", lead: str = "", gap: str = "  "
    ) -> None:
        """``lead`` starts the first line (and sets the indent of the others)."""
        self.segments, self.style, self.lead, self.gap = segments, style, lead, gap

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        """One `Text` per packed line."""
        segments = list(self.segments)
        if segments and self.lead:
            segments[0] = self.lead + segments[0]
        indent = len(self.lead) + 4
        for line in pack(segments, max(1, options.max_width), indent, self.gap):
            yield Text(line, style=self.style, no_wrap=True, overflow="ellipsis")


def quiet_words(state: ViewState, quiet: float) -> str | None:
    """``no event for 1m05s (2/4 lanes busy)`` once a run that has not finished has been
    quiet for `QUIET_AFTER` seconds or more (else None), adding the units being judged and
    a wait on the optimizer: what is running while nothing is said."""
    if state.finished is not None or not state.events or quiet < QUIET_AFTER:
        return None
    busy = [f"{state.lanes_busy}/{state.replay_lanes} lanes busy"]
    if state.judges_busy:
        busy.append(f"{state.judges_busy} being judged")
    if state.proposing():
        busy.append("waiting for the optimizer")
    return f"no event for {duration(quiet)} ({', '.join(busy)})"


def quiet_line(state: ViewState, quiet: float) -> str | None:
    """The plain line(s) saying the run has been quiet for ``quiet`` seconds (None: not yet)."""
    words = quiet_words(state, quiet)
    if words is None:
        return None
    stamp = f"[{state.t + quiet:6.1f}s] "
    return "\n".join(stamp + line for line in pack(words.split(" "), PLAIN_WIDTH - _STAMP, gap=" "))


def _header(state: ViewState, elapsed: float) -> Packed:
    eta = state.eta(elapsed)
    when = "done" if state.finished else ("?" if eta is None else duration(eta))
    parts = [f"evolane {state.run_id or '…'}"]
    if state.campaign_id:
        parts[0] += f"  campaign {state.campaign_id}  cycle {state.cycle}"
    parts += [
        f"phase {state.phase or 'starting'}",
        _iteration_text(state, state.iteration),
        f"elapsed {duration(elapsed)}  ETA {when}",
    ]
    quiet = quiet_words(state, elapsed - state.t)
    return Packed(parts + ([quiet] if quiet else []), style="bold", gap="  │  ")


def _context(state: ViewState) -> Packed:
    parts = [f"parent {short_digest(state.parent)}"] if state.parent else []
    parts += [f"convergence {state.convergence}"] if state.convergence else []
    parts.append(f"lanes {state.lanes_busy}/{state.replay_lanes} busy")
    parts.append(f"judge lanes {state.judge_lanes}")
    if state.isolation:
        words = isolation_words(state.isolation, state.safeguards)
        parts += ["commands " + words[0], *words[1:]]
    return Packed(parts)


class _Slots:
    """The current iteration's candidate slots, one row each, fitted to the width."""

    def __init__(self, state: ViewState) -> None:
        self.state = state

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Text]:
        """A title, a row per slot (at most `_SLOT_ROWS`) and the run's funnel so far."""
        state, width = self.state, options.max_width
        iteration = "?" if state.slot_iteration is None else state.slot_iteration + 1
        yield Text(fit(f"candidates of iteration {iteration}", width), style="bold")
        slots = sorted(state.slots.values(), key=lambda s: s.slot)
        for slot in slots[:_SLOT_ROWS]:
            style = {"selected": "green", "rejected": "red", "blocked": "yellow"}.get(slot.stage)
            head = f"  {_slot_label(slot.iteration, slot.slot):<8}"
            digest = f"{short_digest(slot.digest):<22}" if slot.digest else " " * 22
            row = Text(head)
            row.append(f"{slot.stage:<15}", style=style or "")
            reason = _slot_reason(slot, state) if slot.reason else ""
            row.append(fit(digest + reason, max(1, width - 25)).rstrip())
            row.no_wrap = True
            yield row
        if len(slots) > _SLOT_ROWS:
            yield Text(f"  …  {len(slots) - _SLOT_ROWS} more")
        funnel = "  ".join(f"{stage} {state.funnel[stage]}" for stage in sorted(TERMINAL_STAGES))
        yield Text(fit(f"run so far: {funnel}", width), style="dim")


def _budget_parts(state: ViewState, elapsed: float) -> list[RenderableType]:
    """A bar row per ceiling that is set (and the campaign's wall clock budget), and one
    compact line of what was spent without a ceiling, then the spend by role."""
    budget = state.budget
    assert budget is not None
    table = Table(title="budget", title_justify="left", pad_edge=False, box=None)
    for column in ("ceiling on", "used (█ spent ▒ reserved)", "spent", "reserved", "of"):
        table.add_column(column, no_wrap=True)
    if state.wall_budget and state.wall_left is not None:  # elapsed, for the whole campaign
        used = state.wall_budget - state.wall_left + max(0.0, elapsed - state.wall_t)
        table.add_row(
            "wall clock",
            bar(used / state.wall_budget, 0.0),
            duration(used),
            "",
            duration(state.wall_budget),
        )
    free: list[messages.Dimension] = []
    for dimension in _DIMENSIONS:
        spent, reserved = budget.spent.get(dimension), budget.reserved.get(dimension)
        ceiling = budget.ceilings.get(dimension)
        if not ceiling:
            free += [dimension] if spent is not None else []
            continue
        shown = bar((spent or 0) / ceiling, (reserved or 0) / ceiling)
        amounts = [
            "" if value is None else amount(dimension, value)
            for value in (spent, reserved, ceiling)
        ]
        table.add_row(_DIMENSION_NAMES[dimension], shown, *amounts)
    parts: list[RenderableType] = [table] if table.row_count else []
    spent = spent_text(budget.spent, tuple(free))
    if spent:
        parts.append(Packed([("also spent: " if table.row_count else "spent: ") + spent]))
    if budget.by_role:
        roles = role_spend(budget.by_role).split(" · ")
        parts.append(Packed(["by role: " + roles[0], *roles[1:]], style="dim", gap=" · "))
    return parts


def _endpoint_text(load: messages.EndpointLoad) -> str:
    limited = f", {load.rate_limited} answered 429" if load.rate_limited else ""
    endpoint = middle(load.endpoint, 40)
    return f"model {endpoint}: limit {load.limit}, in flight {load.in_flight}{limited}"


def render_view(state: ViewState, elapsed: float, dropped: int = 0) -> RenderableType:
    """The live view of ``state``: a few lines packed to the console's width, cheap to redraw."""
    parts: list[RenderableType] = [_header(state, elapsed), _context(state)]
    scores = score_segments(state.baseline_score, state.best_score, state.best_series())
    if scores:
        parts.append(Packed(scores, style="bold cyan"))
    if state.slots:
        parts.append(_Slots(state))
    measures = list(state.measures.values())[-3:]
    if not measures and state.last_measure is not None:
        measures = [state.last_measure]
    for m in measures:  # a measurement of the parent alone, or the final one: said in words
        words = m.parent_only or (m.finished and m.purpose not in ("", "paired"))
        parts.append(Packed(_measure_segments(m), lead="" if words else "measure "))
    if state.budget is not None:
        parts.extend(_budget_parts(state, elapsed))
        parts.extend(Packed([_endpoint_text(load)]) for load in state.budget.endpoints)
    if state.estimate is not None and not state.decisions:  # until the first decision
        parts.extend(Packed([line], style="dim") for line in _preflight_lines(state.estimate))
    if state.decisions:
        parts.append(Text("last decisions", style="bold"))
        for d in state.decisions:
            parts.append(Packed(decision_segments(d, _slot_label(d.iteration, d.slot)), lead="  "))
    if state.warnings:
        parts.append(Text(f"warnings ({state.warning_count})", style="bold yellow"))
        parts.extend(
            Packed([w.message], style="yellow", lead="  ") for w in list(state.warnings)[-3:]
        )
    if dropped > 0:
        lost = f"the view dropped {dropped} events (the run is unaffected)"
        parts.append(Packed([lost], style="yellow"))
    if state.finished is not None:
        ended = "bold green" if state.finished.status == "finished" else "bold yellow"
        parts.append(Packed(_finished_segments(state.finished), style=ended))
    return Group(*parts)
