"""The OpenTelemetry exporter (extra ``evolane[otel]``), against the SDK's in-memory exporter
and metric reader: the span tree of a sleeper run matches its report.json (iterations,
candidates with their decisions, units) and every span ends, also when the run is cancelled;
spend metrics equal the ledger; ``evolane optimize --observer otel`` exports through the
global providers; and ``import evolane.embed`` works without OpenTelemetry installed."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import trio
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import evolane
from evolane.campaign import slot_id, slot_of
from evolane.embed import BackendCall, Backends, OpenTelemetryObserver, OptimizeRequest
from evolane.messages import RunFinished, RunStarted, UnitEvent, WarningEvent
from tests.campaign_helpers import toy_config, write_toy

PLAN = {"0.0": "fix:2", "0.1": "noop", "1.0": "fix:1", "1.1": "noop"}


class Ends(SpanProcessor):
    """Records every span started and every span ended (an unended span is never exported)."""

    def __init__(self) -> None:
        self.started: set[int] = set()
        self.ended: set[int] = set()

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        self.started.add(span.context.span_id)

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.add(span.context.span_id)


class Telemetry:
    """An SDK tracer and meter provider over in-memory exporters, and the observer on them."""

    def __init__(self) -> None:
        self.spans, self.ends = InMemorySpanExporter(), Ends()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.tracer_provider.add_span_processor(self.ends)
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])
        self.observer = OpenTelemetryObserver(self.tracer_provider, self.meter_provider)

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def sums(self, name: str, key: str) -> dict[str, float]:
        """The points of metric ``name`` summed by attribute ``key``."""
        totals: dict[str, float] = {}
        data = self.reader.get_metrics_data()
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name != name:
                        continue
                    for point in metric.data.data_points:
                        label = str(point.attributes[key])
                        totals[label] = totals.get(label, 0.0) + point.value
        return totals


def _sleeper_config(root: Path) -> evolane.CampaignConfig:
    from evolane.cli._examples import SLEEPER_DEFAULTS, example_settings

    settings = example_settings("sleeper", root / "ex")
    keys = ("target", "dataset", "replay", "judge", "optimizer")
    presets = {**SLEEPER_DEFAULTS, "iterations": 2, "population": 2, "replay_concurrency": 4}
    return evolane.CampaignConfig(
        **{k: settings[k] for k in keys},
        required_files=tuple(settings["required_files"]),
        store=str(root / "store"),
        **presets,
    )


def _flag(unit: ReadableSpan, name: str) -> bool:
    return bool(unit.attributes["evolane.unit." + name])


def _children(spans: list[ReadableSpan], parent: ReadableSpan, name: str) -> list[ReadableSpan]:
    return [
        s
        for s in spans
        if s.name == name and s.parent is not None and s.parent.span_id == parent.context.span_id
    ]


async def test_the_sleeper_run_exports_its_span_tree_and_spend(tmp_path: Path) -> None:
    config = _sleeper_config(tmp_path)
    telemetry = Telemetry()
    with trio.fail_after(180):  # a guard against a hang, not a timing figure
        async with evolane.open_runtime(store=config.store) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config), observers=[telemetry.observer]
            )
            outcome = await handle.result()
    assert outcome.run_dir is not None
    report = json.loads((outcome.run_dir / "report.json").read_text())
    assert report["status"] == "finished"
    spans = telemetry.finished()
    assert telemetry.ends.started == telemetry.ends.ended == {s.context.span_id for s in spans}
    assert {s.context.trace_id for s in spans} == {spans[0].context.trace_id}  # one trace

    (run,) = [s for s in spans if s.name == "evolane.run"]
    assert run.parent is None
    assert run.attributes["evolane.run.id"] == report["run_id"]
    assert run.attributes["evolane.campaign.id"] == report["campaign_id"]
    assert run.attributes["evolane.run.status"] == "finished"
    assert run.attributes["evolane.best_val"] == pytest.approx(report["scores"]["best_val"]["mean"])
    assert run.status.status_code is not StatusCode.ERROR

    _check_iterations_and_candidates(spans, run, report)
    units = _check_units(spans, run, report)
    _check_metrics(telemetry, units, report)


def _check_iterations_and_candidates(
    spans: list[ReadableSpan], run: ReadableSpan, report: dict[str, Any]
) -> None:
    """One iteration span per iteration of the report, under the run; one candidate span per
    funnel entry, under its iteration, with the decision and figures of the report."""
    iterations = _children(spans, run, "evolane.iteration")
    assert sorted(s.attributes["evolane.iteration"] for s in iterations) == [
        it["iteration"] for it in report["iterations"]
    ]
    assert len(iterations) == len([s for s in spans if s.name == "evolane.iteration"])
    by_iteration = {s.attributes["evolane.iteration"]: s for s in iterations}
    for record in report["iterations"]:
        span = by_iteration[record["iteration"]]
        assert span.attributes["evolane.iteration.parent"] == record["parent"]
        assert span.attributes["evolane.iteration.convergence"] == record["convergence"]

    candidates = [s for s in spans if s.name == "evolane.candidate"]
    assert len(candidates) == len(report["funnel"])
    for entry in report["funnel"]:
        (span,) = [
            s for s in candidates if s.attributes["evolane.candidate.id"] == entry["slot_id"]
        ]
        assert span.parent is not None
        assert span.parent.span_id == by_iteration[entry["iteration"]].context.span_id
        assert span.attributes["evolane.candidate.digest"] == entry["digest"]
        assert span.attributes["evolane.candidate.stage"] == entry["terminal"]
        assert span.attributes.get("evolane.candidate.decision") == entry["decision"]
        assert [e.name for e in span.events] == [f"funnel.{entry['terminal']}"]
    for decision in report["decisions"]:
        key = slot_id(decision["cycle"], decision["iteration"], decision["slot"])
        (span,) = [s for s in candidates if s.attributes["evolane.candidate.id"] == key]
        (measured,) = [m for m in report["measurements"] if m["measurement_id"] == key]
        assert span.attributes["evolane.candidate.decision"] == decision["decision"]
        assert span.attributes["evolane.candidate.mean_delta"] == pytest.approx(
            measured["mean_delta"]
        )
        assert span.attributes["evolane.candidate.ci_low"] == pytest.approx(measured["ci_low"])


def _check_units(
    spans: list[ReadableSpan], run: ReadableSpan, report: dict[str, Any]
) -> list[ReadableSpan]:
    """One unit span per unit that ran, was reused or was restored, under its candidate or
    its measurement's span; the ones that ran, as many as the report's ``units_run``."""
    units = [s for s in spans if s.name == "evolane.unit"]
    parents = {s.context.span_id: s for s in spans}
    measured_ids = {m["measurement_id"] for m in report["measurements"]}
    for unit in units:
        assert unit.parent is not None
        parent = parents[unit.parent.span_id]
        measurement = unit.attributes["evolane.measurement.id"]
        assert measurement in measured_ids
        if slot_of(measurement) is not None:  # a candidate's unit: under its candidate
            assert parent.name == "evolane.candidate"
            assert parent.attributes["evolane.candidate.id"] == slot_id(*slot_of(measurement))
        else:  # a parent's baseline or a final measurement: under its own span, under the run
            assert parent.name == "evolane.measurement" and parent.parent is not None
            assert parent.attributes["evolane.measurement.id"] == measurement
            assert parent.parent.span_id == run.context.span_id
    ran = [u for u in units if not (_flag(u, "reused") or _flag(u, "restored"))]
    measurements = report["measurements"]
    assert len(ran) == sum(m["units_run"] for m in measurements) > 0
    took_part = sum(m["units_run"] + m["units_reused"] + m["units_restored"] for m in measurements)
    assert len(units) == took_part
    per_measurement = Counter(u.attributes["evolane.measurement.id"] for u in ran)
    run_per_measurement = {m["measurement_id"]: m["units_run"] for m in measurements}
    assert per_measurement == Counter(run_per_measurement)
    assert all(u.status.status_code is not StatusCode.ERROR for u in units)  # none failed here
    return units


def _check_metrics(telemetry: Telemetry, units: list[ReadableSpan], report: dict[str, Any]) -> None:
    """Spend by role as the ledger has it; units by arm; lanes back to none at the end."""
    spent = report["budget"]["spent_by_role"]
    tokens = telemetry.sums("evolane.spend.tokens", "evolane.role")
    cost = telemetry.sums("evolane.spend.cost", "evolane.role")
    for role, usage in spent.items():
        assert tokens.get(role, 0.0) == pytest.approx(usage["tokens"] or 0.0)
        assert cost.get(role, 0.0) == pytest.approx(usage["cost_usd"] or 0.0)
    assert telemetry.sums("evolane.units", "evolane.unit.arm") == {
        "baseline": float(sum(u.attributes["evolane.unit.arm"] == "baseline" for u in units)),
        "candidate": float(sum(u.attributes["evolane.unit.arm"] == "candidate" for u in units)),
    }
    assert set(telemetry.sums("evolane.lanes.busy", "evolane.pool").values()) <= {0.0}
    assert telemetry.sums("evolane.lanes.capacity", "evolane.pool") == {"replay": 0, "judge": 0}


async def test_a_cancelled_run_still_ends_every_span(tmp_path: Path) -> None:
    """Candidate replays hang: the run is cancelled mid-measurement, with the run, its
    iteration, a candidate and a measurement open; each ends, the run's with status ERROR."""
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:replay", kill_grace=0.2)
    telemetry = Telemetry()
    units = trio.Event()

    async def replay(call: BackendCall) -> None:
        assert call.candidate is not None and call.output_dir is not None and call.case
        if call.env["EVOLANE_UNIT"].startswith("c0.i0.s0."):
            await trio.sleep_forever()  # the first candidate's replays hang
        answer = (call.candidate / call.case["id"]).read_text()
        (call.output_dir / "output.json").write_text(answer)

    async def watch(event: Any) -> None:
        if event.kind == "event.unit" and event.measurement_id.startswith("c0.i0.s0"):
            units.set()  # the candidate's span is open (its reused baselines ended)

    with trio.fail_after(120):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config),
                backends=Backends(replay=replay),
                observers=[telemetry.observer, watch],
            )
            await units.wait()
            assert len(telemetry.ends.started) > len(telemetry.ends.ended)  # spans are open
            handle.cancel()
            with pytest.raises(evolane.embed.RunCancelled):
                await handle.result()
    spans = telemetry.finished()
    assert telemetry.ends.started == telemetry.ends.ended == {s.context.span_id for s in spans}
    names = Counter(s.name for s in spans)
    assert names["evolane.run"] == names["evolane.iteration"] == 1
    assert names["evolane.candidate"] >= 1 and names["evolane.measurement"] >= 1
    (run,) = [s for s in spans if s.name == "evolane.run"]
    assert run.status.status_code is StatusCode.ERROR
    assert telemetry.sums("evolane.lanes.busy", "evolane.pool").get("replay", 0.0) == 0.0
    assert telemetry.sums("evolane.lanes.capacity", "evolane.pool") == {"replay": 0, "judge": 0}


def test_slot_ids_round_trip() -> None:
    assert slot_of(slot_id(1, 2, 3)) == (1, 2, 3)
    assert slot_of(slot_id(0, 4, 11) + ".screen") == (0, 4, 11)
    for other in ("c0.i1.base", "c0.i1.train", "c0.final.val", "c0.i1.s1x"):
        assert slot_of(other) is None


def _python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_embed_imports_without_opentelemetry() -> None:
    done = _python(
        """
        import sys
        sys.modules["opentelemetry"] = None  # as if the extra were not installed
        import evolane.embed
        from evolane.embed import OpenTelemetryObserver
        try:
            OpenTelemetryObserver()
        except ImportError as error:
            print("refused:", error)
        """
    )
    assert done.returncode == 0, done.stderr
    assert "refused: the OpenTelemetry observer needs the extra: pip install 'evolane[otel]'" in (
        done.stdout
    )


def test_the_cli_observer_exports_through_the_global_providers(tmp_path: Path) -> None:
    """``--observer otel`` (our own entry point) with an SDK set up as the global provider,
    as a user's own setup would."""
    out = tmp_path / "spans.json"
    done = _python(
        f"""
        import json, sys
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
        from evolane.cli import main
        sys.argv = ["evolane", "optimize", "--example", "sleeper",
                    "--example-dir", {str(tmp_path / "ex")!r}, "--store", {str(tmp_path / "s")!r},
                    "--iterations", "1", "--population", "1", "--progress", "none",
                    "--observer", "otel"]
        try:
            main()
        except SystemExit as end:
            code = end.code
        names = [s.name for s in exporter.get_finished_spans()]
        open({str(out)!r}, "w").write(json.dumps({{"code": code, "names": names}}))
        """
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert result["code"] in (0, None), done.stderr
    names = Counter(result["names"])
    assert names["evolane.run"] == names["evolane.iteration"] == names["evolane.candidate"] == 1
    assert names["evolane.unit"] > 0


async def test_spans_from_events_alone_failed_units_lost_events_and_a_resume() -> None:
    """Fed events directly: a failed unit's span has status ERROR and its replay and judge
    seconds as length; a run whose first events were lost still has its root; events after
    the end are ignored, and a resume (a new event.run_started) begins a new trace."""
    telemetry = Telemetry()
    observer = telemetry.observer
    unit = UnitEvent(
        run_id="r-1",
        t=5.0,
        measurement_id="c0.i0.s1",
        unit_id="c0.i0.s1.0.0.c",
        case_id="case-1",
        arm="candidate",
        repetition=0,
        status="timed_out",
        replay_seconds=1.5,
        judge_seconds=0.5,
        failure="candidate replay timeout: over 1.5 s",
    )
    await observer.on_event(unit)  # the run's earlier events were lost
    await observer.on_event(RunFinished(run_id="r-1", t=6.0, status="failed", campaign_status="x"))
    await observer.on_event(WarningEvent(run_id="r-1", t=7.0, message="late"))
    await observer.on_event(RunStarted(run_id="r-1", t=0.0, **SHAPE, resumed=True))
    await observer.close()  # the resumed run was killed: its root ends, ERROR
    spans = telemetry.finished()
    assert telemetry.ends.started == telemetry.ends.ended
    names = Counter(s.name for s in spans)
    assert names == {"evolane.run": 2, "evolane.candidate": 1, "evolane.unit": 1}
    (failed,) = [s for s in spans if s.name == "evolane.unit"]
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.status.description == "candidate replay timeout: over 1.5 s"
    assert failed.end_time - failed.start_time == 2_000_000_000  # the event's seconds
    runs = [s for s in spans if s.name == "evolane.run"]
    assert [s.status.status_code for s in runs] == [StatusCode.ERROR, StatusCode.ERROR]
    assert runs[1].attributes["evolane.run.resumed"] is True
    assert not any(e.name == "warning" for s in runs for e in s.events)  # after the end


SHAPE = {
    "campaign_id": "c-1",
    "cycle": 0,
    "iterations": 1,
    "population": 1,
    "replay_lanes": 2,
    "judge_lanes": 1,
}


async def test_a_runtime_wide_observer_ends_a_cancelled_runs_spans_with_the_run(
    tmp_path: Path,
) -> None:
    """Given to `open_runtime`, the observer outlives the run: a cancelled run (which
    publishes no event.run_finished) still has every span ended, ERROR, and its lanes taken
    out of the lane metrics, by the time ``handle.result()`` returns."""
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:replay", kill_grace=0.2)
    telemetry = Telemetry()
    units = trio.Event()

    async def replay(call: BackendCall) -> None:
        assert call.candidate is not None and call.output_dir is not None and call.case
        if call.env["EVOLANE_UNIT"].startswith("c0.i0.s0."):
            await trio.sleep_forever()
        answer = (call.candidate / call.case["id"]).read_text()
        (call.output_dir / "output.json").write_text(answer)

    async def watch(event: Any) -> None:
        if event.kind == "event.unit" and event.measurement_id.startswith("c0.i0.s0"):
            units.set()

    with trio.fail_after(120):
        async with evolane.open_runtime(
            store=paths["store"], observers=[telemetry.observer]
        ) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config), backends=Backends(replay=replay), observers=[watch]
            )
            await units.wait()
            handle.cancel()
            with pytest.raises(evolane.embed.RunCancelled):
                await handle.result()
            spans = telemetry.finished()
            assert telemetry.ends.started == telemetry.ends.ended  # while the runtime is open
            (run,) = [s for s in spans if s.name == "evolane.run"]
            assert run.status.status_code is StatusCode.ERROR
            capacity = telemetry.sums("evolane.lanes.capacity", "evolane.pool")
            assert capacity == {"replay": 0, "judge": 0}
            assert handle.observers[0].failed is None
