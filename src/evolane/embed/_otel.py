"""An OpenTelemetry exporter as an observer (extra ``evolane[otel]``): the progress events of
a run become spans and metrics, through the OpenTelemetry API.

Spans (each with the figures as ``evolane.*`` attributes)::

    evolane.run                      RunStarted .. RunFinished
    ├── evolane.measurement          a parent's baseline, feedback or final measurement
    │   └── evolane.unit
    └── evolane.iteration            from its ``optimize`` phase to the next phase
        └── evolane.candidate        one slot through the funnel (stages as span events)
            └── evolane.unit         one replay and judgement: case, arm, repetition

Times come from the events (the run's start, read as wall time when its first event
arrives, plus each event's ``t``), so a span is placed right even when its event arrived
late. A unit's span ends at its event and starts its replay and judge seconds earlier (a
reused unit ran nothing: its span has no length). Failed and timed-out units, failed runs,
and runs that ended without their ``event.run_finished`` (killed) have status ERROR. Every
span still open ends at ``event.run_finished``, when the runtime says its run ended
(`OpenTelemetryObserver.run_ended`: a runtime-wide observer outlives its runs) and at
`OpenTelemetryObserver.close`.

Metrics: counters ``evolane.spend.tokens`` and ``evolane.spend.cost`` (USD) by ``evolane.role``
(what the run's ledger shows spent: optimizer, replay, judge), ``evolane.units`` by status and
arm, and up-down counters ``evolane.lanes.busy`` (replay lanes running a unit) and
``evolane.lanes.capacity`` (lanes of runs going, by pool). Every metric carries the run id.

The observer only calls the API: with no SDK configured the global providers are no-ops.
Give each run its own observer (the CLI's factory makes one per run): its state is kept per
run id, but `OpenTelemetryObserver.close` ends every span it holds open.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

from evolane.campaign import slot_id, slot_of
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
    UnitEvent,
    WarningEvent,
)

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import Span, TracerProvider

SCOPE = "evolane"
"""The instrumentation scope of every span and metric."""
TERMINAL_STAGES = frozenset({"selected", "rejected", "blocked", "not_run"})
FAILED_UNITS = frozenset({"failed", "timed_out"})
FAILED_RUNS = frozenset({"failed"})
SPEND_DIMENSIONS = ("tokens", "cost_usd")
NO_FINISH = "the run ended without its event.run_finished (killed, or the event was lost)"


def _version() -> str:
    try:
        return metadata.version("evolane")
    except metadata.PackageNotFoundError:  # pragma: no cover - a source tree, not installed
        return "0"


def _attrs(prefix: str, **values: Any) -> dict[str, Any]:
    """``values`` as span attributes named ``prefix.key`` (None and "" are left out)."""
    return {f"{prefix}.{key}": v for key, v in values.items() if v is not None and v != ""}


@dataclass
class _RunTrace:
    """One run's open spans and the figures metrics are computed from."""

    run_id: str
    base_ns: int  # wall time of the run's t = 0
    root: Span
    cycle: int = 0
    phase: str = ""
    phase_iteration: int | None = None
    iteration: tuple[int, Span, int] | None = None  # number, span, start
    candidates: dict[str, Span] = field(default_factory=dict)  # by slot id, open
    measurements: dict[str, Span] = field(default_factory=dict)  # not a candidate's, open
    spent: dict[tuple[str, str], float] = field(default_factory=dict)  # (role, dim) -> so far
    busy: int = 0
    lanes: dict[str, int] = field(default_factory=dict)  # pool -> lanes counted
    finished: bool = False

    def at(self, event: ProgressEvent) -> int:
        """The wall time of ``event``, in ns since the epoch."""
        return self.base_ns + int(event.t * 1e9)


class OpenTelemetryObserver:
    """An `Observer` that exports a run's progress as OpenTelemetry spans and metrics.

    ``tracer_provider`` and ``meter_provider`` default to the global ones (no-ops until an SDK
    is configured). Raises `ImportError` naming the extra when ``opentelemetry-api`` is not
    installed. `close` (the run's end) ends every span still open.
    """

    name = "otel"

    def __init__(
        self,
        tracer_provider: TracerProvider | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        try:
            from opentelemetry import metrics, trace
        except ImportError as error:
            raise ImportError(
                "the OpenTelemetry observer needs the extra: pip install 'evolane[otel]'"
            ) from error
        self._trace = trace
        tracers = tracer_provider if tracer_provider is not None else trace.get_tracer_provider()
        meters = meter_provider if meter_provider is not None else metrics.get_meter_provider()
        self._tracer = tracers.get_tracer(SCOPE, _version())
        meter = meters.get_meter(SCOPE, _version())
        self._spend = {
            "tokens": meter.create_counter(
                "evolane.spend.tokens", unit="{token}", description="Tokens spent, by role"
            ),
            "cost_usd": meter.create_counter(
                "evolane.spend.cost", unit="USD", description="Dollars spent, by role"
            ),
        }
        self._units = meter.create_counter(
            "evolane.units", unit="{unit}", description="Units ended, by status and arm"
        )
        self._busy = meter.create_up_down_counter(
            "evolane.lanes.busy", unit="{lane}", description="Replay lanes running a unit"
        )
        self._capacity = meter.create_up_down_counter(
            "evolane.lanes.capacity", unit="{lane}", description="Lanes of runs going, by pool"
        )
        self._runs: dict[str, _RunTrace] = {}
        self._ended: set[str] = set()  # runs whose trace ended: later events are ignored

    # ----- the Observer protocol --------------------------------------------------------

    async def on_event(self, event: ProgressEvent) -> None:
        """Turn ``event`` into spans, span attributes and metric points (never blocks)."""
        if event.run_id in self._ended:  # after its end, only a resume starts a new trace
            if not isinstance(event, RunStarted):
                return
            self._ended.discard(event.run_id)
        handler = _HANDLERS.get(event.kind)
        run = self._run(event)
        if handler is not None:
            handler(self, run, event)

    def run_ended(self, run_id: str) -> None:
        """Run ``run_id`` has ended (the runtime says so, `evolane.embed.Observer`): its spans
        still open end now, with status ERROR (it ended without its ``event.run_finished``)."""
        run = self._runs.get(run_id)
        if run is not None:
            self._end_run(run, time.time_ns(), NO_FINISH)

    async def close(self) -> None:
        """End every span still open (a killed run's spans end now, with status ERROR)."""
        for run_id in list(self._runs):
            self._end_run(self._runs[run_id], time.time_ns(), NO_FINISH)

    # ----- spans ------------------------------------------------------------------------

    def _run(self, event: ProgressEvent) -> _RunTrace:
        """The trace of ``event``'s run, begun at its first event."""
        run = self._runs.get(event.run_id)
        if run is None:
            base = time.time_ns() - int(event.t * 1e9)
            attributes = _attrs("evolane.run", id=event.run_id)
            root = self._tracer.start_span(
                "evolane.run", attributes=attributes, start_time=base + int(event.t * 1e9)
            )
            run = self._runs[event.run_id] = _RunTrace(event.run_id, base, root)
        return run

    def _child(self, parent: Span, name: str, start: int, attributes: dict[str, Any]) -> Span:
        context = self._trace.set_span_in_context(parent)
        return self._tracer.start_span(
            name, context=context, attributes=attributes, start_time=start
        )

    def _candidate(self, run: _RunTrace, iteration: int, slot: int, now: int) -> Span:
        """The open span of a candidate slot; one begun when none is open starts with its
        iteration (where the optimizer was asked for every slot), else ``now``."""
        key = slot_id(run.cycle, iteration, slot)
        span = run.candidates.get(key)
        if span is None:
            parent, start = run.root, now
            if run.iteration is not None and run.iteration[0] == iteration:
                _, parent, start = run.iteration
            attributes = {
                **_attrs("evolane", iteration=iteration, cycle=run.cycle),
                **_attrs("evolane.candidate", slot=slot, id=key),
            }
            span = run.candidates[key] = self._child(parent, "evolane.candidate", start, attributes)
        return span

    def _measurement(self, run: _RunTrace, measurement_id: str, start: int) -> Span:
        """Where the units of ``measurement_id`` go: their candidate's span (a slot's
        measurements are named after its id), else the measurement's own span."""
        slot = slot_of(measurement_id)
        if slot is not None and slot[0] == run.cycle:
            return self._candidate(run, slot[1], slot[2], start)
        span = run.measurements.get(measurement_id)
        if span is None:
            attributes = {
                **_attrs("evolane.measurement", id=measurement_id),
                **_attrs("evolane", phase=run.phase, iteration=run.phase_iteration),
            }
            span = self._child(run.root, "evolane.measurement", start, attributes)
            run.measurements[measurement_id] = span
        return span

    def _end_iteration(self, run: _RunTrace, end: int) -> None:
        """End the iteration span and its candidates and measurements still open."""
        for span in [*run.candidates.values(), *run.measurements.values()]:
            span.end(end_time=end)
        run.candidates.clear()
        run.measurements.clear()
        if run.iteration is not None:
            run.iteration[1].end(end_time=end)
            run.iteration = None

    def _end_run(self, run: _RunTrace, end: int, error: str | None) -> None:
        """End every span of ``run`` (``error``: the root's status is ERROR, with it) and
        take its lanes out of the lane metrics; later events of the run are ignored."""
        self._runs.pop(run.run_id, None)
        self._ended.add(run.run_id)
        self._end_iteration(run, end)
        if error is not None:
            run.root.set_status(self._trace.Status(self._trace.StatusCode.ERROR, error))
        run.root.end(end_time=end)
        labels = {"evolane.run.id": run.run_id}
        if run.busy:
            self._busy.add(-run.busy, {**labels, "evolane.pool": "replay"})
            run.busy = 0
        for pool, lanes in run.lanes.items():
            self._capacity.add(-lanes, {**labels, "evolane.pool": pool})
        run.lanes.clear()

    # ----- one handler per event kind ---------------------------------------------------

    def _started(self, run: _RunTrace, event: RunStarted) -> None:
        run.cycle = event.cycle
        run.root.set_attributes(
            {
                **_attrs("evolane.campaign", id=event.campaign_id),
                **_attrs("evolane", cycle=event.cycle),
                **_attrs(
                    "evolane.run",
                    iterations=event.iterations,
                    population=event.population,
                    resumed=event.resumed,
                    isolation=event.isolation,
                    wall_clock_budget=event.wall_clock_budget,
                ),
                **_attrs("evolane.lanes", replay=event.replay_lanes, judge=event.judge_lanes),
            }
        )
        for pool, lanes in (("replay", event.replay_lanes), ("judge", event.judge_lanes)):
            added = lanes - run.lanes.get(pool, 0)
            if added:
                self._capacity.add(added, {"evolane.run.id": run.run_id, "evolane.pool": pool})
                run.lanes[pool] = lanes

    def _estimated(self, run: _RunTrace, event: EstimateEvent) -> None:
        run.root.set_attributes(
            _attrs(
                "evolane.estimate",
                tokens=event.tokens,
                cost_usd=event.cost_usd,
                replays_max=event.replays_max,
                wall_high_seconds=event.wall_high_seconds,
            )
        )

    def _phase(self, run: _RunTrace, event: PhaseEvent) -> None:
        at = run.at(event)
        self._end_iteration(run, at)
        run.cycle, run.phase, run.phase_iteration = event.cycle, event.phase, event.iteration
        if event.phase == "optimize" and event.iteration is not None:
            attributes = {
                **_attrs("evolane", iteration=event.iteration, cycle=event.cycle),
                **_attrs("evolane.iteration", parent=event.parent, convergence=event.convergence),
            }
            span = self._child(run.root, "evolane.iteration", at, attributes)
            run.iteration = (event.iteration, span, at)

    def _slot(self, run: _RunTrace, event: SlotEvent) -> None:
        at = run.at(event)
        span = self._candidate(run, event.iteration, event.slot, at)
        values = _attrs("evolane.candidate", digest=event.digest, stage=event.stage)
        span.set_attributes({**values, **_attrs("evolane.candidate", reason=event.reason)})
        span.add_event(f"funnel.{event.stage}", timestamp=at)
        if event.stage in TERMINAL_STAGES:
            span.end(end_time=at)
            run.candidates.pop(slot_id(run.cycle, event.iteration, event.slot), None)

    def _decided(self, run: _RunTrace, event: DecisionEvent) -> None:
        span = self._candidate(run, event.iteration, event.slot, run.at(event))
        span.set_attributes(
            _attrs(
                "evolane.candidate",
                digest=event.digest,
                decision=event.decision,
                decision_reason=event.reason,
                mean_delta=event.mean_delta,
                ci_low=event.ci_low,
                ci_high=event.ci_high,
            )
        )

    def _measured(self, run: _RunTrace, event: MeasureEvent) -> None:
        labels = {"evolane.run.id": run.run_id, "evolane.pool": "replay"}
        if event.lanes_busy != run.busy:
            self._busy.add(event.lanes_busy - run.busy, labels)
            run.busy = event.lanes_busy
        if not event.finished:
            return
        span = self._measurement(run, event.measurement_id, run.at(event))
        figures = _attrs(
            "evolane.measurement",
            pairs_done=event.pairs_done,
            pairs_planned=event.pairs_planned,
            mean_delta=event.mean_delta,
            se=event.se,
            decision=event.decision,
        )
        if event.measurement_id in run.measurements:  # its own span: done
            span.set_attributes(figures)
            run.measurements.pop(event.measurement_id).end(end_time=run.at(event))
        elif event.measurement_id in run.candidates:  # a candidate's paired measurement
            span.set_attributes(figures)  # (a screening's figures are left out)

    def _unit(self, run: _RunTrace, event: UnitEvent) -> None:
        end = run.at(event)
        parent = self._measurement(run, event.measurement_id, end)
        took = 0.0 if event.reused else event.replay_seconds + event.judge_seconds
        attributes = {
            **_attrs("evolane.measurement", id=event.measurement_id),
            **_attrs(
                "evolane.unit",
                id=event.unit_id,
                case=event.case_id,
                arm=event.arm,
                repetition=event.repetition,
                status=event.status,
                note=event.note,
                reused=event.reused,
                restored=event.restored,
                score=event.score,
                replay_seconds=event.replay_seconds,
                judge_seconds=event.judge_seconds,
                tokens=event.tokens,
                cost_usd=event.cost_usd,
                failure=event.failure,
            ),
        }
        span = self._child(parent, "evolane.unit", end - int(took * 1e9), attributes)
        if event.status in FAILED_UNITS:
            why = event.failure or event.status
            span.set_status(self._trace.Status(self._trace.StatusCode.ERROR, why))
        span.end(end_time=end)
        labels = {"evolane.unit.status": event.status, "evolane.unit.arm": event.arm}
        self._units.add(1, {"evolane.run.id": run.run_id, **labels})

    def _budget(self, run: _RunTrace, event: BudgetUpdate) -> None:
        for role, usage in event.by_role.items():
            for dimension in SPEND_DIMENSIONS:
                amount = usage.get(dimension)  # type: ignore[arg-type]
                before = run.spent.get((role, dimension), 0.0)
                if amount is not None and amount > before:  # a ledger only grows
                    labels = {"evolane.run.id": run.run_id, "evolane.role": role}
                    self._spend[dimension].add(amount - before, labels)
                    run.spent[(role, dimension)] = amount
        spent = event.spent
        run.root.set_attributes(
            _attrs("evolane.spend", tokens=spent.tokens, cost_usd=spent.cost_usd)
        )

    def _warned(self, run: _RunTrace, event: WarningEvent) -> None:
        run.root.add_event("warning", {"message": event.message}, timestamp=run.at(event))

    def _finished(self, run: _RunTrace, event: RunFinished) -> None:
        run.root.set_attributes(
            {
                **_attrs("evolane.run", status=event.status, report=event.report),
                **_attrs("evolane.campaign", status=event.campaign_status),
                **_attrs(
                    "evolane",
                    best=event.best,
                    baseline_val=event.baseline_val,
                    best_val=event.best_val,
                ),
            }
        )
        error = f"the run {event.status}" if event.status in FAILED_RUNS else None
        self._end_run(run, run.at(event), error)


_HANDLERS: dict[str, Any] = {
    "event.run_started": OpenTelemetryObserver._started,
    "event.estimate": OpenTelemetryObserver._estimated,
    "event.phase": OpenTelemetryObserver._phase,
    "event.slot": OpenTelemetryObserver._slot,
    "event.decision": OpenTelemetryObserver._decided,
    "event.measure": OpenTelemetryObserver._measured,
    "event.unit": OpenTelemetryObserver._unit,
    "event.budget": OpenTelemetryObserver._budget,
    "event.warning": OpenTelemetryObserver._warned,
    "event.run_finished": OpenTelemetryObserver._finished,
}
"""The handler of each event kind (other kinds only begin the run's trace)."""
