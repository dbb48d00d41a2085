"""What a progress observer knows of a run: the `ViewState` and its fold over events.

Pure: folding takes one event and updates the state, with no IO, no clock and no trio, so
the renderers only draw it: the live view and ``evolane watch`` (`evolane.cli._render`) and
the HTML report (`evolane.views.render_html`), which reads the run's series (`History`).
Each event kind has one small fold, found in a table by the event's ``kind``.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from evolane import messages
from evolane.views._history import History

TERMINAL_STAGES = frozenset({"selected", "rejected", "blocked", "not_run"})
"""Funnel stages a candidate slot never leaves."""

_KEPT = 5  # decisions and warnings the view remembers
_SCORES_KEPT = 64  # iterations whose best-so-far score the view remembers (the newest)
_END_PHASES = frozenset({"finalize", "apply", "report"})


def kind_of(event_type: type[messages.ProgressEvent]) -> str:
    """The literal ``kind`` that every event of ``event_type`` carries."""
    kind: str = event_type.model_fields["kind"].default
    return kind


@dataclass
class ViewState:
    """What the run has told the observer so far; `fold` adds one event (pure, no IO)."""

    run_id: str = ""
    campaign_id: str = ""
    cycle: int = 0
    iterations: int = 0
    population: int = 0
    replay_lanes: int = 0
    judge_lanes: int = 0
    resumed: bool = False
    isolation: str = ""
    safeguards: tuple[str, ...] = ()  # host-wide: lease sweep, subreaper, lifeline
    wall_budget: float | None = None  # the campaign's --wall-clock-budget
    wall_left: float | None = None  # what was left of it when this session began
    wall_t: float = 0.0  # when (event time) that was measured
    estimate: messages.EstimateEvent | None = None
    phase: str = ""
    iteration: int | None = None
    parent: str = ""
    convergence: str = ""
    slot_iteration: int | None = None
    slots: dict[int, messages.SlotEvent] = field(default_factory=dict)  # of `slot_iteration`
    funnel: Counter[str] = field(default_factory=Counter)  # terminal stages over the run
    measures: dict[str, messages.MeasureEvent] = field(default_factory=dict)  # unfinished
    last_measure: messages.MeasureEvent | None = None
    lanes_busy: int = 0
    judges_busy: int = 0  # units being judged now, over the open measurements
    budget: messages.BudgetUpdate | None = None
    decisions: deque[messages.DecisionEvent] = field(default_factory=lambda: deque(maxlen=_KEPT))
    warnings: deque[messages.WarningEvent] = field(default_factory=lambda: deque(maxlen=_KEPT))
    warning_count: int = 0
    baseline_score: float | None = None  # the first parent's mean val score
    best_score: float | None = None  # the best val score so far (a parent or an accept)
    scores: dict[int, float] = field(default_factory=dict)  # best at each iteration's end
    finished: messages.RunFinished | None = None
    events: int = 0  # events folded
    missed: int = 0  # events never seen, from gaps in the sequence numbers
    last_seq: int = 0
    t: float = 0.0  # the newest event's seconds since the run began
    history: History = field(default_factory=History)  # the series the HTML report plots

    def fold(self, event: messages.ProgressEvent) -> None:
        """Take one event into the state (an event of an unknown kind only counts)."""
        self.events += 1
        if event.seq > self.last_seq:
            self.missed += event.seq - self.last_seq - 1
            self.last_seq = event.seq
        self.t = max(self.t, event.t)
        self.run_id = event.run_id or self.run_id
        self.history.fold(event)
        fold = _FOLDS.get(event.kind)
        if fold is not None:
            fold(self, event)

    def _started(self, event: messages.RunStarted) -> None:
        self.campaign_id, self.cycle = event.campaign_id, event.cycle
        self.iterations, self.population = event.iterations, event.population
        self.replay_lanes, self.judge_lanes = event.replay_lanes, event.judge_lanes
        self.resumed, self.isolation = event.resumed, event.isolation
        self.safeguards = tuple(event.safeguards)
        self.wall_budget, self.wall_left = event.wall_clock_budget, event.wall_clock_left
        self.wall_t = event.t

    def _estimated(self, event: messages.EstimateEvent) -> None:
        self.estimate = event

    def _phase(self, event: messages.PhaseEvent) -> None:
        self.phase, self.cycle = event.phase, event.cycle
        if event.iteration is not None:
            self.iteration = event.iteration
        if event.parent:
            self.parent = event.parent
        if event.phase == "optimize":
            self.convergence = event.convergence
            if event.iteration is not None and event.iteration != self.slot_iteration:
                self.slot_iteration, self.slots = event.iteration, {}

    def _slot(self, event: messages.SlotEvent) -> None:
        if event.iteration != self.slot_iteration:
            self.slot_iteration, self.slots = event.iteration, {}
        before = self.slots.get(event.slot)
        if event.stage in TERMINAL_STAGES and (before is None or before.stage != event.stage):
            self.funnel[event.stage] += 1
        self.slots[event.slot] = event

    def _measure(self, event: messages.MeasureEvent) -> None:
        self.last_measure = event
        if event.finished:
            self.measures.pop(event.measurement_id, None)
            self._scored(event)
        else:
            self.measures[event.measurement_id] = event
        self.lanes_busy = sum(m.lanes_busy for m in self.measures.values())
        self.judges_busy = sum(m.judges_busy for m in self.measures.values())

    def proposing(self) -> bool:
        """Whether the run waits on its optimizer (or a proposal's checks): an iteration's
        slots are not all ended and no measurement is open. A silent run then has no lane
        busy, and must not read as one where nothing runs (found by review: `0/4 lanes
        busy` for the two minutes a hung optimizer took to reach `--optimizer-idle`)."""
        if self.phase != "optimize" or self.measures or self.finished is not None:
            return False
        current = self.slot_iteration == self.iteration
        ended = sum(s.stage in TERMINAL_STAGES for s in self.slots.values()) if current else 0
        return ended < self.population

    def _scored(self, event: messages.MeasureEvent) -> None:
        """A finished measurement's scores: a parent's on val, or the final val figures."""
        if event.parent_only and event.split == "val" and event.baseline_mean is not None:
            if self.baseline_score is None:
                self.baseline_score = event.baseline_mean
            # the parent of iteration i is the best at the end of iteration i - 1
            before = None if event.iteration is None else event.iteration - 1
            self._improved(before, event.baseline_mean)
        elif event.purpose == "final_val":
            if self.baseline_score is None:
                self.baseline_score = event.baseline_mean
            if event.candidate_mean is not None:  # the best tree on the whole of val
                self.best_score = event.candidate_mean
                if self.scores:
                    self.scores[max(self.scores)] = event.candidate_mean

    def _improved(self, iteration: int | None, score: float) -> None:
        self.best_score = score if self.best_score is None else max(self.best_score, score)
        if iteration is None:
            iteration = max(self.scores, default=-1)
        self.scores[iteration] = max(self.best_score, self.scores.get(iteration, 0.0))
        for old in sorted(self.scores)[:-_SCORES_KEPT]:
            del self.scores[old]

    def _decided(self, event: messages.DecisionEvent) -> None:
        self.decisions.append(event)
        if event.decision == "accept" and event.candidate_mean is not None:
            self._improved(event.iteration, event.candidate_mean)

    def best_series(self) -> list[float]:
        """The best val score so far at the end of each iteration seen, oldest first (the
        first parent's score first, under key -1)."""
        return [self.scores[iteration] for iteration in sorted(self.scores)]

    def _budget(self, event: messages.BudgetUpdate) -> None:
        self.budget = event

    def _warned(self, event: messages.WarningEvent) -> None:
        self.warnings.append(event)
        self.warning_count += 1

    def _finished(self, event: messages.RunFinished) -> None:
        self.finished = event
        self.measures.clear()
        self.lanes_busy = self.judges_busy = 0

    def fraction_done(self) -> float | None:
        """How much of the search is done (iterations and the current one's slots), if known."""
        if self.finished is not None:
            return 1.0
        if not self.iterations or self.iteration is None or self.phase in _END_PHASES:
            return None
        within = 0.0
        if self.phase == "optimize" and self.population:
            current = self.slot_iteration == self.iteration
            ended = sum(s.stage in TERMINAL_STAGES for s in self.slots.values()) if current else 0
            active = sum(
                m.pairs_done / m.pairs_planned for m in self.measures.values() if m.pairs_planned
            )
            within = min(1.0, (ended + active) / self.population)
        fraction = (min(self.iteration, self.iterations) + within) / self.iterations
        return min(fraction, 1.0) if fraction > 0 else None

    def eta(self, elapsed: float | None = None) -> float | None:
        """Seconds left at the pace so far (``elapsed`` defaults to the newest event's time)."""
        fraction = self.fraction_done()
        if fraction is None:
            return None
        spent = self.t if elapsed is None else elapsed
        return max(0.0, spent / fraction - spent)


_FOLDS: dict[str, Callable[[ViewState, Any], None]] = {
    kind_of(messages.RunStarted): ViewState._started,
    kind_of(messages.EstimateEvent): ViewState._estimated,
    kind_of(messages.PhaseEvent): ViewState._phase,
    kind_of(messages.SlotEvent): ViewState._slot,
    kind_of(messages.MeasureEvent): ViewState._measure,
    kind_of(messages.DecisionEvent): ViewState._decided,
    kind_of(messages.BudgetUpdate): ViewState._budget,
    kind_of(messages.WarningEvent): ViewState._warned,
    kind_of(messages.RunFinished): ViewState._finished,
}
"""The fold of each event kind."""
