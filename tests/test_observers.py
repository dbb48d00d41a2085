"""Observers everywhere in the embedding API: runtime-wide observers (`open_runtime(observers=
...)`) hear every run a runtime starts besides each run's own and are closed once, with the
runtime; `evolane.aio` takes observers written for asyncio (both forms) and runs them on the
asyncio loop. (Per-run observers and the ``--observer`` plugins: tests/test_plugins.py.)"""

from __future__ import annotations

import asyncio
import contextvars
import json
import time
from pathlib import Path
from typing import Any

import pytest
import sniffio
import trio

import evolane
import evolane.aio
from evolane.embed import BackendCall, Backends, OptimizeRequest
from evolane.messages import ProgressEvent
from tests.campaign_helpers import toy_config, write_toy

PLAN = {"0.0": "fix:2", "0.1": "noop"}
CALLER = contextvars.ContextVar("CALLER", default="unset")


class Recorder:
    """Keeps the (run id, kind) of every event it hears; counts its closes."""

    def __init__(self, fail_first: bool = False) -> None:
        self.heard: list[tuple[str, str]] = []
        self.closes = 0
        self._fail_first = fail_first

    async def on_event(self, event: ProgressEvent) -> None:
        if self._fail_first:
            self._fail_first = False
            raise RuntimeError("first event")
        self.heard.append((event.run_id, event.kind))

    async def close(self) -> None:
        self.closes += 1

    def kinds(self, run_id: str | None) -> list[str]:
        return [kind for run, kind in self.heard if run == run_id]


async def _replay(call: BackendCall) -> None:
    assert call.candidate is not None and call.output_dir is not None and call.case is not None
    (call.output_dir / "output.json").write_text((call.candidate / call.case["id"]).read_text())


def _request(tmp_path: Path) -> OptimizeRequest:
    paths = write_toy(tmp_path, PLAN)
    return OptimizeRequest(config=toy_config(paths, replay="backend:replay", iterations=1))


def _stored_kinds(outcome: object) -> list[str]:
    """The kinds in the run's own events.jsonl, in order."""
    path = outcome.run_dir / "events.jsonl"  # type: ignore[attr-defined]
    return [json.loads(line)["kind"] for line in path.read_text().splitlines()]


async def test_runtime_wide_observers_hear_every_run_besides_each_runs_own(
    tmp_path: Path,
) -> None:
    """Two runs of one runtime: the runtime-wide observers hear both (in order, closed once,
    when the runtime closes); the first run's own observer hears that run only and is closed
    with it; a runtime-wide observer that raises is disabled for that run only."""
    request = _request(tmp_path)
    shared, flaky, own = Recorder(), Recorder(fail_first=True), Recorder()
    with trio.fail_after(120):  # a guard against a hang, not a timing figure
        async with evolane.open_runtime(
            store=request.config.store,  # type: ignore[union-attr]
            observers=[shared, flaky],
        ) as runtime:
            first = await runtime.start_optimize(
                request, backends=Backends(replay=_replay), observers=[own]
            )
            one = await first.result()
            assert own.closes == 1 and shared.closes == 0 and flaky.closes == 0
            second = await runtime.start_optimize(request, backends=Backends(replay=_replay))
            two = await second.result()
        assert shared.closes == 1 and flaky.closes == 1 and own.closes == 1
    assert first.run_id != second.run_id
    for handle, outcome in ((first, one), (second, two)):
        kinds = shared.kinds(handle.run_id)
        assert kinds[0] == "event.run_started" and kinds[-1] == "event.run_finished"
        assert kinds == _stored_kinds(outcome)  # every event, in order
    assert {run for run, _ in own.heard} == {first.run_id}
    assert own.kinds(first.run_id) == shared.kinds(first.run_id)
    assert [r.name for r in first.observers] == ["Recorder", "Recorder", "Recorder"]
    assert first.observers[1].failed == "it raised RuntimeError: first event"
    assert sum("observer Recorder was disabled" in k for k in _warnings(one)) == 1
    assert flaky.kinds(first.run_id) == []  # disabled for the first run ...
    assert flaky.kinds(second.run_id) == shared.kinds(second.run_id)  # ... and back for the next
    assert all(r.failed is None for r in second.observers) and len(second.observers) == 2
    assert first.observers[0].delivered == len(shared.kinds(first.run_id))


class Exiting:
    """Calls ``sys.exit`` (or raises a bare `BaseException`) at its third event or its close."""

    def __init__(self, name: str, on_event: bool, error: BaseException) -> None:
        self.name, self.on_event_fails, self.error, self.heard = name, on_event, error, 0

    async def on_event(self, event: ProgressEvent) -> None:
        self.heard += 1
        if self.on_event_fails and self.heard == 3:
            raise self.error

    async def close(self) -> None:
        if not self.on_event_fails:
            raise self.error


async def test_an_observer_that_exits_is_disabled_and_the_run_goes_on(tmp_path: Path) -> None:
    """``sys.exit`` or a bare `BaseException` from an observer's ``on_event`` or ``close``
    (its own, or a runtime-wide one's) is its failure, as an exception is: one warning, the
    run finishes (found by review: it ended the embedding process)."""
    request = _request(tmp_path)
    exits, bare = Exiting("exits", True, SystemExit(4)), Exiting("bare", True, BaseException("b"))
    closing = Exiting("closing", False, SystemExit(5))
    shared = Exiting("shared", False, SystemExit(6))
    with trio.fail_after(120), pytest.warns(RuntimeWarning, match="observer shared: close"):
        async with evolane.open_runtime(
            store=request.config.store,  # type: ignore[union-attr]
            observers=[shared],
        ) as runtime:
            handle = await runtime.start_optimize(
                request, backends=Backends(replay=_replay), observers=[exits, bare, closing]
            )
            outcome = await handle.result()
    assert outcome.report.status == "finished"
    failed = {report.name: report.failed for report in handle.observers}
    assert failed == {
        "shared": None,
        "exits": "it raised SystemExit: 4",
        "bare": "it raised BaseException: b",
        "closing": "close() raised SystemExit: 5",
    }
    said = _warnings(outcome)
    assert sum("observer exits was disabled" in w for w in said) == 1
    assert sum("observer bare was disabled" in w for w in said) == 1
    assert closing.heard == len(_stored_kinds(outcome))


async def test_an_observer_given_twice_hears_each_event_once(tmp_path: Path) -> None:
    """Given to ``open_runtime`` and twice to ``start_optimize``, an observer is one
    runtime-wide observer: each event once, closed once, with the runtime (found by review:
    it heard every event three times and was closed three times)."""
    request = _request(tmp_path)
    twice = Recorder()
    with trio.fail_after(120):  # a guard against a hang, not a timing figure
        async with evolane.open_runtime(
            store=request.config.store,  # type: ignore[union-attr]
            observers=[twice],
        ) as runtime:
            handle = await runtime.start_optimize(
                request, backends=Backends(replay=_replay), observers=[twice, twice]
            )
            outcome = await handle.result()
            assert twice.closes == 0
    assert twice.closes == 1
    assert twice.kinds(handle.run_id) == _stored_kinds(outcome)
    assert [r.name for r in handle.observers] == ["Recorder"]


class Forwarding(Recorder):
    """A user observer that happens to have an ``inner`` attribute (what it forwards to)."""

    def __init__(self, inner: object = None) -> None:
        super().__init__()
        self.inner = inner


async def test_observers_sharing_an_inner_attribute_are_each_kept(tmp_path: Path) -> None:
    """Found by review: de-duplication took any observer's ``inner`` attribute for the one
    it wraps, so two distinct observers whose ``inner`` was the same (None, a shared client)
    counted as one, and the second heard nothing and was never closed."""
    request = _request(tmp_path)
    shared, first, second = Recorder(), Forwarding(), Forwarding()
    wraps = Forwarding(shared)
    with trio.fail_after(120):  # a guard against a hang, not a timing figure
        async with evolane.open_runtime(store=request.config.store) as runtime:  # type: ignore[union-attr]
            handle = await runtime.start_optimize(
                request,
                backends=Backends(replay=_replay),
                observers=[shared, first, second, wraps],
            )
            outcome = await handle.result()
    stored = _stored_kinds(outcome)
    for observer in (shared, first, second, wraps):
        assert observer.kinds(handle.run_id) == stored and observer.closes == 1
    assert len(handle.observers) == 4


def _aio_run(request: OptimizeRequest, *, shared: list, own: list) -> tuple[Any, Any]:
    """One run through `evolane.aio`: ``shared`` observers runtime-wide, ``own`` the run's;
    its handle and outcome (a hang is a failure)."""

    async def main() -> tuple[object, object]:
        async with evolane.aio.open_runtime(
            store=str(request.config.store),  # type: ignore[union-attr]
            observers=shared,
        ) as runtime:
            handle = await runtime.start_optimize(
                request, backends=Backends(replay=_replay), observers=own
            )
            return handle, await handle.result()

    return asyncio.run(asyncio.wait_for(main(), 120))


def test_an_asyncio_observer_given_twice_hears_each_event_once(tmp_path: Path) -> None:
    request = _request(tmp_path)
    twice = AsyncioRecorder()

    handle, outcome = _aio_run(request, shared=[twice], own=[twice])
    assert [kind for _, kind, _ in twice.heard] == _stored_kinds(outcome)
    assert twice.closes == 1 and len(handle.observers) == 1  # type: ignore[attr-defined]


def _warnings(outcome: object) -> list[str]:
    """The messages of the warning events in the run's own events.jsonl."""
    path = outcome.run_dir / "events.jsonl"  # type: ignore[attr-defined]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    return [line["message"] for line in lines if line["kind"] == "event.warning"]


class AsyncioRecorder:
    """An observer written for asyncio: it awaits asyncio primitives in every call and notes
    what it sees of its surroundings."""

    def __init__(self) -> None:
        self.heard: list[tuple[str, str, int]] = []
        self.lock = asyncio.Lock()
        self.libraries: set[str] = set()
        self.callers: set[str] = set()
        self.closes = 0

    async def on_event(self, event: ProgressEvent) -> None:
        async with self.lock:
            await asyncio.sleep(0)
            self.libraries.add(sniffio.current_async_library())
            self.callers.add(CALLER.get())
            assert asyncio.current_task() is not None
            self.heard.append((event.run_id, event.kind, event.seq))

    async def close(self) -> None:
        await asyncio.sleep(0)
        self.closes += 1


def test_asyncio_observers_hear_a_run_started_through_aio(tmp_path: Path) -> None:
    """A runtime-wide and a per-run asyncio observer (a class and a plain coroutine function)
    hear every event of a run started through `evolane.aio`, on the asyncio loop, in the
    context of the call that gave them; the run's own is closed with the run, the
    runtime-wide one with the runtime."""
    request = _request(tmp_path)
    shared, own, plain = AsyncioRecorder(), AsyncioRecorder(), []

    async def listen(event: ProgressEvent) -> None:
        await asyncio.sleep(0)
        plain.append(event.kind)

    async def main() -> tuple[object, object]:
        CALLER.set("runtime")
        async with evolane.aio.open_runtime(
            store=str(request.config.store),  # type: ignore[union-attr]
            observers=[shared],
        ) as runtime:
            CALLER.set("run")
            handle = await runtime.start_optimize(
                request, backends=Backends(replay=_replay), observers=[own, listen]
            )
            outcome = await handle.result()
            assert own.closes == 1 and shared.closes == 0
        assert shared.closes == 1
        return handle, outcome

    handle, outcome = asyncio.run(asyncio.wait_for(main(), 120))  # a guard against a hang
    stored = _stored_kinds(outcome)
    for recorder in (shared, own):
        assert [kind for _, kind, _ in recorder.heard] == stored
        assert [seq for _, _, seq in recorder.heard] == sorted(seq for _, _, seq in recorder.heard)
        assert recorder.libraries == {"asyncio"}
    assert plain == stored
    assert shared.callers == {"runtime"} and own.callers == {"run"}
    reports = handle.observers  # type: ignore[attr-defined]
    assert [r.name for r in reports] == ["AsyncioRecorder", "AsyncioRecorder", "listen"]
    assert all(r.failed is None and r.delivered == len(stored) for r in reports)


@pytest.mark.parametrize("error", [ValueError("observer bug"), SystemExit(3)])
def test_a_raising_asyncio_observer_is_disabled_with_one_warning(
    tmp_path: Path, error: BaseException
) -> None:
    """Also a ``sys.exit`` (found by review: asyncio raised it out of the host's loop)."""
    request = _request(tmp_path)
    heard: list[str] = []

    async def explode(event: ProgressEvent) -> None:
        await asyncio.sleep(0)
        raise error

    async def listen(event: ProgressEvent) -> None:
        await asyncio.sleep(0)
        heard.append(event.kind)

    handle, outcome = _aio_run(request, shared=[listen], own=[explode])
    assert outcome.report.status == "finished"  # type: ignore[attr-defined]
    reports = {r.name: r for r in handle.observers}  # type: ignore[attr-defined]
    assert reports["explode"].failed == f"it raised {type(error).__name__}: {error}"
    assert reports["explode"].announced and reports["listen"].failed is None
    assert sum("observer explode was disabled" in w for w in _warnings(outcome)) == 1
    assert "event.warning" in heard and heard == _stored_kinds(outcome)


class Mutator:
    """A buggy observer: it empties each budget event's ``by_role`` it is handed."""

    async def on_event(self, event: ProgressEvent) -> None:
        if event.kind == "event.budget":
            event.by_role.clear()  # type: ignore[attr-defined]


async def test_an_observer_that_changes_an_event_changes_it_for_itself_only(
    tmp_path: Path,
) -> None:
    """The other observers and the handle's own feed get the events as the run's
    events.jsonl has them (found by review: one shared event object was handed to all)."""
    request = _request(tmp_path)
    roles: list[dict[str, Any]] = []

    async def listen(event: ProgressEvent) -> None:
        if event.kind == "event.budget":
            roles.append(dict(event.by_role))  # type: ignore[attr-defined]

    with trio.fail_after(120):  # a guard against a hang, not a timing figure
        async with evolane.open_runtime(store=request.config.store) as runtime:  # type: ignore[union-attr]
            handle = await runtime.start_optimize(
                request, backends=Backends(replay=_replay), observers=[Mutator(), listen]
            )
            fed = [dict(e.by_role) async for e in handle.events() if e.kind == "event.budget"]  # type: ignore[attr-defined]
            outcome = await handle.result()
    stored = [
        json.loads(line)["by_role"]
        for line in (outcome.run_dir / "events.jsonl").read_text().splitlines()  # type: ignore[union-attr]
        if json.loads(line)["kind"] == "event.budget"
    ]
    assert stored and any(stored)  # the run spent: its ledger names roles
    for heard in (roles, fed):
        assert [{k: v.model_dump(mode="json") for k, v in r.items()} for r in heard] == stored


class Stubborn:
    """An observer whose last event and close cannot be cut short: a shielded wait, and a
    blocking call (a synchronous SDK flush)."""

    async def on_event(self, event: ProgressEvent) -> None:
        if event.kind == "event.run_finished":
            with trio.CancelScope(shield=True):
                await trio.sleep(3.0)

    async def close(self) -> None:
        time.sleep(1.0)


async def test_an_observer_that_outlasts_its_bounds_is_said_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drain and close bounds cannot cut code that does not yield to cancellation; the
    observer's report says what held the run's end (found by review: it said nothing)."""
    import evolane.embed._observers as observers

    monkeypatch.setattr(observers, "OBSERVER_DRAIN_TIMEOUT", 1.0)  # it has its last event
    monkeypatch.setattr(observers, "OBSERVER_CLOSE_TIMEOUT", 0.1)
    request = _request(tmp_path)
    with trio.fail_after(120):  # a guard against a hang, not a timing figure
        async with evolane.open_runtime(store=request.config.store) as runtime:  # type: ignore[union-attr]
            handle = await runtime.start_optimize(
                request, backends=Backends(replay=_replay), observers=[Stubborn()]
            )
            await handle.result()
    (report,) = handle.observers
    assert report.failed is not None and "did not stop when cancelled" in report.failed
    assert "Stubborn was disabled" in (report.note() or "")
    failed = await observers.close_observer(Stubborn())
    assert failed is not None and "without yielding to cancellation" in failed


def test_an_observers_note_is_one_bounded_line_of_text() -> None:
    """Its name and error are the observer's own words: no terminal control, no line break,
    not megabytes on the terminal."""
    from evolane.embed import ObserverReport

    failed = "it raised RuntimeError: " + "y" * 100_000 + "\nsecond line"
    note = ObserverReport(name="spy\x1b]0;pwned\x07", failed=failed).note()
    assert note is not None and note.startswith("observer spy")
    assert "\x1b" not in note and "\x07" not in note and "\n" not in note
    assert len(note) <= 1024
