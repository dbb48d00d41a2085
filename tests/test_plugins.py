"""Plugins and observers: a test distribution "installed" in a folder (a module plus a
``*.dist-info`` with METADATA and entry_points.txt, found by importlib.metadata on the path)
adds a judge, a replay backend and observers; ``evolane plugins`` lists it, ``--judge
NAME:ARGS`` uses it, ``--observer NAME`` hears the run, and the embedding API's observers
get every event in order. Values that merely contain a colon stay command templates."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import trio

import evolane
from evolane.campaign import CampaignConfig
from evolane.embed import BackendCall, Backends, ObserverReport, OptimizeRequest
from evolane.inputs import plugin_words
from evolane.lanes import PluginError, installed_plugins, plugin_backend, plugin_spec
from evolane.measure import CommandSettings, MeasureContext, MeasureSettings, lane_settings
from evolane.messages import ProgressEvent
from tests.campaign_helpers import toy_config, toy_flags, write_toy
from tests.plugin_helpers import install, write_distribution

EVOLANE = [sys.executable, "-m", "evolane"]
PLAN = {"0.0": "fix:2", "0.1": "noop", "1.0": "fix:1", "1.1": "noop", "2.0": "noop", "2.1": "noop"}
JUDGE_TOKENS = 7

PLUGIN = textwrap.dedent(
    """
    import json, os

    import trio

    def judge_factory(args):
        if args not in ("strict", "lenient"):
            raise ValueError(f"unknown mode {args!r}")

        async def judge(call):
            gate = os.environ.get("TESTPLUG_JUDGE_GATE")  # wait at the first judge call
            if gate:
                open(gate, "a").close()
                await trio.sleep_forever()
            answer = json.loads((call.output_dir / "output.json").read_text())
            right = answer == call.case["expected_output"]
            log = os.environ.get("TESTPLUG_JUDGE_LOG")
            if log:
                with open(log, "a") as out:
                    out.write(f"{args} {call.case['id']}\\n")
            score = 1.0 if right else (0.25 if args == "strict" else 1.0)
            return {"score": score, "usage": {"tokens": JUDGE_TOKENS, "cost_usd": 0.0}}

        return judge

    def raising_factory(args):
        raise RuntimeError("no licence for " + args)

    def replay_factory(args):
        async def replay(call):
            answer = (call.candidate / call.case["id"]).read_text()
            (call.output_dir / "output.json").write_text(answer)
        return replay

    def optimizer_factory(args):
        count = int(args or 1)

        async def optimizer(call):
            failing = [f["id"] for f in call.prompt["failing"]][:count]
            for case_id in failing:
                (call.workdir / case_id).write_text('"yes"')
            return f"fixed {len(failing)}"

        return optimizer

    class FileObserver:
        def __init__(self):
            self.out = open(os.environ["TESTPLUG_EVENTS"], "a")

        async def on_event(self, event):
            line = {"kind": event.kind, "message": getattr(event, "message", "")}
            self.out.write(json.dumps(line) + "\\n")

        async def close(self):
            self.out.write(json.dumps({"kind": "closed"}) + "\\n")
            self.out.close()

    class Boom:
        async def on_event(self, event):
            raise RuntimeError("boom")
    """
).replace("JUDGE_TOKENS", str(JUDGE_TOKENS))

ENTRY_POINTS = """\
[evolane.judges]
myjudge = evolane_testplug:judge_factory
broken = evolane_testplug:raising_factory
llm = evolane_testplug:judge_factory

[evolane.backends]
myreplay = evolane_testplug:replay_factory

[evolane.optimizers]
myopt = evolane_testplug:optimizer_factory
agent = evolane_testplug:optimizer_factory

[evolane.observers]
filelog = evolane_testplug:FileObserver
boom = evolane_testplug:Boom
"""


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    """A folder holding the test distribution ``evolane-testplug`` 1.0."""
    return write_distribution(tmp_path / "site", "evolane_testplug", PLUGIN, ENTRY_POINTS)


@pytest.fixture
def installed(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test distribution on this process's path (importlib caches cleared)."""
    return install(plugin_dir, "evolane_testplug", monkeypatch)


def _run(
    args: list[str], plugin_dir: Path, timeout: float = 240, **env: str
) -> subprocess.CompletedProcess[str]:
    paths = [str(plugin_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **env}
    return subprocess.run(
        [*EVOLANE, *args], capture_output=True, text=True, timeout=timeout, env=environment
    )


def _one_error_line(done: subprocess.CompletedProcess[str], needle: str) -> None:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error:"), done.stderr
    assert needle in lines[0], lines[0]


# -- resolution ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "sh -c 'echo a:b'",
        "python3 x.py",
        "C:\\tools\\judge.exe {output_dir}",
        "https://example.org/judge",
        "Myjudge:strict",
        "9judge:x",
        "",
    ],
)
def test_values_that_are_not_an_installed_plugin_stay_command_templates(
    installed: Path, text: str
) -> None:
    for role in ("replay", "judge", "optimizer"):
        assert plugin_spec(text, role) is None


def test_an_installed_name_is_a_plugin_and_builtins_win(installed: Path) -> None:
    assert plugin_words("myjudge: strict ") == ("myjudge", "strict")
    spec = plugin_spec("myjudge:strict", "judge")
    assert spec is not None and (spec.name, spec.args) == ("myjudge", "strict")
    assert spec.point.value == "evolane_testplug:judge_factory"
    assert plugin_spec("myjudge:strict", "replay") is None  # each role has its own group
    assert plugin_spec("unknown:strict", "judge") is None
    assert plugin_spec("llm:gpt-x", "judge") is None  # the built-in llm: wins
    assert plugin_spec("agent:codex", "optimizer") is None  # and so does agent:
    assert plugin_spec("myopt:2", "optimizer") is not None
    replay = plugin_spec("myreplay:", "replay")
    assert replay is not None and replay.args == ""
    with pytest.raises(PluginError, match=r"--judge broken:x .*RuntimeError: no licence for x"):
        plugin_backend(plugin_spec("broken:x", "judge"))  # type: ignore[arg-type]


def test_template_parsing_skips_plugin_specs_and_parses_the_rest(installed: Path) -> None:
    measure = MeasureSettings(replay="myreplay:", judge="myjudge:strict")
    replay, judge = lane_settings(measure, CommandSettings(), MeasureContext())
    assert replay.template is None and judge.template is None
    measure = MeasureSettings(replay="sh -c 'echo a:b'", judge="unknown:x {output_dir}")
    replay, judge = lane_settings(measure, CommandSettings(), MeasureContext())
    assert replay.template is not None and judge.template is not None


def test_installed_plugins_name_their_distribution(installed: Path) -> None:
    found = {(p.group, p.name, p.builtin): p for p in installed_plugins()}
    mine = found[("evolane.judges", "myjudge", False)]
    assert (mine.distribution, mine.version, mine.shadowed) == ("evolane-testplug", "1.0", False)
    assert found[("evolane.judges", "llm", False)].shadowed  # named like the built-in: unused
    assert found[("evolane.judges", "llm", True)].distribution == "evolane"
    assert ("evolane.optimizers", "agent:claude-code", True) in found


def test_a_distribution_with_unreadable_metadata_is_listed_as_unknown(
    plugin_dir: Path, tmp_path: Path
) -> None:
    """A METADATA that is not UTF-8 (a broken install): ``evolane plugins`` still lists the
    rest, and that distribution's entry with ``?`` for its name and version."""
    broken = write_distribution(
        tmp_path / "broken", "badmeta", "", "[evolane.observers]\nbm = x:y\n"
    )
    (broken / "badmeta-1.0.dist-info" / "METADATA").write_bytes(b"\xff\xfe not text")
    done = _run(["plugins", "--json"], plugin_dir, PYTHONPATH=os.pathsep.join(
        [str(broken), str(plugin_dir), *filter(None, [os.environ.get("PYTHONPATH")])]
    ))  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["plugins"]
    (bad,) = [r for r in rows if r["name"] == "bm"]
    assert (bad["distribution"], bad["version"], bad["target"]) == ("?", "?", "x:y")
    assert any(r["name"] == "myjudge" for r in rows)


# -- the command line ------------------------------------------------------------------------


def test_evolane_plugins_lists_the_installed_plugin(plugin_dir: Path) -> None:
    done = _run(["plugins", "--json"], plugin_dir)
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["plugins"]
    mine = [r for r in rows if r["distribution"] == "evolane-testplug"]
    assert {(r["group"], r["name"]) for r in mine} >= {
        ("evolane.judges", "myjudge"),
        ("evolane.backends", "myreplay"),
        ("evolane.observers", "filelog"),
    }
    assert {"group": "evolane.judges", "name": "llm"}.items() <= rows[0].items()
    text = _run(["plugins"], plugin_dir, COLUMNS="200")
    assert text.returncode == 0 and "myjudge" in text.stdout and "evolane-testplug" in text.stdout


def test_a_plugin_judge_decides_and_is_metered_and_observers_hear_the_run(
    plugin_dir: Path, tmp_path: Path
) -> None:
    """``--judge myjudge:strict`` gives a wrong answer 0.25 (the built-in would give 0);
    the replay command holds a colon and still runs as a command; ``filelog`` records every
    event, and ``boom`` raises and is disabled without breaking the run."""
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    flags = toy_flags(paths, store)
    replay = flags.index("--replay") + 1
    flags[replay] = flags[replay].replace("sh -c '", "sh -c 'echo a:b > /dev/null; ")
    events, judged = tmp_path / "events.jsonl", tmp_path / "judged.log"
    flags += ["--judge", "myjudge:strict", "--observer", "filelog", "--observer", "boom"]
    done = _run(
        ["optimize", *flags],
        plugin_dir,
        TESTPLUG_EVENTS=str(events),
        TESTPLUG_JUDGE_LOG=str(judged),
    )
    assert done.returncode == 0, done.stderr
    (run_dir,) = (store / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "finished"
    calls = judged.read_text().splitlines()
    assert calls and all(line.startswith("strict ") for line in calls)
    scores = [
        json.loads(line)["judge"]["score"]
        for line in (run_dir / "journal.jsonl").read_text().splitlines()
        if '"judge"' in line and json.loads(line).get("judge")
    ]
    assert 0.25 in scores  # the plugin's partial credit: its scores decide
    judge = report["budget"]["spent_by_role"]["judge"]
    assert judge["tokens"] > 0 and judge["tokens"] % JUDGE_TOKENS == 0
    kinds = [json.loads(line)["kind"] for line in events.read_text().splitlines()]
    assert kinds[0] == "event.run_started"
    assert kinds[-2:] == ["event.run_finished", "closed"]
    warnings = [
        json.loads(line)["message"]
        for line in events.read_text().splitlines()
        if json.loads(line)["kind"] == "event.warning"
    ]
    assert sum("observer boom was disabled" in w for w in warnings) == 1
    stored = (run_dir / "events.jsonl").read_text()
    assert stored.count("observer boom was disabled") == 1


def test_replay_judge_and_optimizer_can_all_be_plugins(plugin_dir: Path, tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    flags = toy_flags(paths, store)
    for flag, value in (("--replay", "myreplay:"), ("--optimizer", "myopt:2")):
        flags[flags.index(flag) + 1] = value
    done = _run(["optimize", *flags, "--judge", "myjudge:strict", "--iterations", "1"], plugin_dir)
    assert done.returncode == 0, done.stderr
    (run_dir,) = (store / "runs").iterdir()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["status"] == "finished"
    (iteration,) = report["iterations"]  # the plugin optimizer's fix, measured by the plugins
    assert iteration["accepted_slot"] is not None and report["best"] != report["seed"]


def test_a_plugin_factory_that_raises_is_one_line_naming_it(
    plugin_dir: Path, tmp_path: Path
) -> None:
    paths = write_toy(tmp_path, PLAN)
    store = tmp_path / "store"
    flags = [*toy_flags(paths, store), "--judge", "broken:x"]
    done = _run(["optimize", *flags], plugin_dir)
    _one_error_line(done, "broken:x (plugin evolane_testplug:raising_factory)")
    assert "no licence for x" in done.stderr
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())
    unknown = _run(["optimize", *toy_flags(paths, store), "--observer", "nosuch"], plugin_dir)
    _one_error_line(unknown, "--observer nosuch: unknown observer (installed: boom, filelog, otel)")


def _killed_mid_judge(plugin_dir: Path, tmp_path: Path, paths: dict[str, Path]) -> Path:
    """Start a run judged by ``myjudge:strict`` and SIGKILL it at its first judge call: the
    run folder of a resumable run."""
    store, gate = tmp_path / "store", tmp_path / "judging"
    pythonpath = os.pathsep.join([str(plugin_dir), *filter(None, [os.environ.get("PYTHONPATH")])])
    env = {**os.environ, "PYTHONPATH": pythonpath, "TESTPLUG_JUDGE_GATE": str(gate)}
    flags = [*toy_flags(paths, store), "--judge", "myjudge:strict", "--iterations", "1"]
    process = subprocess.Popen([*EVOLANE, "optimize", *flags], env=env,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing figure
    while not gate.exists():
        assert process.poll() is None, "the run ended before its first judge call"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    os.kill(process.pid, signal.SIGKILL)
    process.wait(timeout=30)
    (run_dir,) = (store / "runs").iterdir()
    return run_dir


def test_a_stored_plugin_stays_a_plugin_on_resume(plugin_dir: Path, tmp_path: Path) -> None:
    """run.json records that ``--judge myjudge:strict`` named a plugin; resumed where it is
    not installed, the run is refused (exit 2, one line naming the plugin and the role)
    before anything is spent, instead of running the value as a command; resumed where it
    is installed, it finishes with the plugin's scores."""
    paths = write_toy(tmp_path, PLAN)
    run_dir = _killed_mid_judge(plugin_dir, tmp_path, paths)
    stored = json.loads((run_dir / "run.json").read_text())
    assert stored["config"]["plugins"] == {"judge": "myjudge"}
    assert stored["config"]["judge"] == "myjudge:strict"
    journal = (run_dir / "journal.jsonl").read_text()
    resume = ["optimize", "--resume", run_dir.name, "--store", str(run_dir.parent.parent)]
    empty = tmp_path / "no-plugins"
    empty.mkdir()
    refused = _run(resume, empty)
    _one_error_line(refused, f"--resume {run_dir.name}: the run's --judge myjudge:strict")
    assert "plugin 'myjudge', which is not installed (entry-point group evolane.judges)" in (
        refused.stderr
    )
    assert json.loads((run_dir / "run.json").read_text()) == stored  # nothing was started
    assert (run_dir / "journal.jsonl").read_text() == journal
    judged = tmp_path / "judged.log"
    done = _run([*resume, "--progress", "none"], plugin_dir, TESTPLUG_JUDGE_LOG=str(judged))
    assert done.returncode == 0, done.stderr
    report = json.loads((run_dir / "report.json").read_text())
    assert (report["status"], report["resumed"]) == ("finished", 1)
    assert report["config"]["plugins"] == {"judge": "myjudge"}
    calls = judged.read_text().splitlines()
    assert calls and all(line.startswith("strict ") for line in calls)  # the plugin judged


def test_the_recorded_plugins_are_checked_role_by_role() -> None:
    """Without the plugin installed: a recorded role that still names it is refused; a role
    whose value changed (a re-judge's new ``--judge``), or one not checked, is not."""
    from evolane.campaign._models import check_recorded_plugins, with_recorded_plugins
    from evolane.inputs import InputError

    config = CampaignConfig(
        target="t", dataset="d", replay="r", optimizer="o", judge="myjudge:strict",
        plugins={"judge": "myjudge"},
    )  # fmt: skip
    assert with_recorded_plugins(config).plugins == {}  # not installed: a command template
    with pytest.raises(InputError, match=r"^--from-run r-1: the run's --judge myjudge:strict "):
        check_recorded_plugins(config, "--from-run r-1", roles=("judge",))
    check_recorded_plugins(config, "--from-run r-1", roles=("replay", "optimizer"))
    check_recorded_plugins(config.model_copy(update={"judge": "python3 judge.py"}), "--resume r")
    check_recorded_plugins(config, "--resume r", recorded={})


def test_recording_names_the_installed_plugins(installed: Path) -> None:
    from evolane.campaign._models import check_recorded_plugins, with_recorded_plugins

    config = CampaignConfig(
        target="t", dataset="d", replay="myreplay:", optimizer="python3 o.py:x",
        judge="myjudge:strict",
    )  # fmt: skip
    recorded = with_recorded_plugins(config)
    assert recorded.plugins == {"replay": "myreplay", "judge": "myjudge"}
    check_recorded_plugins(recorded, "--resume r")  # installed: nothing to refuse


# -- the embedding API -----------------------------------------------------------------------


class Recorder:
    """An in-process observer: keeps every event, then notes it was closed."""

    def __init__(self) -> None:
        self.kinds: list[str] = []
        self.seqs: list[int] = []
        self.closed = False

    async def on_event(self, event: ProgressEvent) -> None:
        self.kinds.append(event.kind)
        self.seqs.append(event.seq)

    async def close(self) -> None:
        self.closed = True


async def _replay(call: BackendCall) -> None:
    assert call.candidate is not None and call.output_dir is not None and call.case is not None
    (call.output_dir / "output.json").write_text((call.candidate / call.case["id"]).read_text())


async def test_embedded_observers_hear_every_event_in_order(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:replay")
    recorder, plain = Recorder(), []

    async def listen(event: ProgressEvent) -> None:  # a plain async callable
        plain.append(event.kind)

    async def explode(event: ProgressEvent) -> None:
        raise ValueError("observer bug")

    with trio.fail_after(120):  # a guard against a hang, not a timing figure
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config),
                backends=Backends(replay=_replay),
                observers=[recorder, listen, explode],
            )
            outcome = await handle.result()
    assert outcome.report is not None and outcome.report.status == "finished"
    assert recorder.kinds[0] == "event.run_started"
    assert recorder.kinds[-1] == "event.run_finished"
    assert recorder.seqs == sorted(recorder.seqs) and recorder.closed
    assert plain == recorder.kinds
    assert "event.warning" in recorder.kinds  # explode's one warning, heard by the others
    reports = {r.name: r for r in handle.observers}
    assert reports["explode"].failed == "it raised ValueError: observer bug"
    assert reports["Recorder"] == ObserverReport("Recorder", delivered=len(recorder.kinds))
    lines = (outcome.run_dir / "events.jsonl").read_text().splitlines()  # type: ignore[operator]
    assert len(lines) == len(recorder.kinds)


async def test_a_slow_observer_loses_events_and_they_are_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("evolane.embed._observers.OBSERVER_DRAIN_TIMEOUT", 0.1)
    paths = write_toy(tmp_path, PLAN)
    config = toy_config(paths, replay="backend:replay")
    seen: list[str] = []

    async def slow(event: ProgressEvent) -> None:
        seen.append(event.kind)
        await trio.sleep_forever()  # takes the first event and never another

    with trio.fail_after(120):
        async with evolane.open_runtime(store=paths["store"]) as runtime:
            handle = await runtime.start_optimize(
                OptimizeRequest(config=config), backends=Backends(replay=_replay), observers=[slow]
            )
            outcome = await handle.result()
    assert outcome.report is not None and outcome.report.status == "finished"
    (report,) = handle.observers
    total = len((outcome.run_dir / "events.jsonl").read_text().splitlines())  # type: ignore[operator]
    assert seen == ["event.run_started"] and report.delivered == 0
    assert report.dropped == total - 1  # all but the one it held when the run ended
    assert "missed" in (report.note() or "")


def test_evolanes_own_otel_observer_wins_over_a_plugin_of_its_name(tmp_path: Path) -> None:
    """Another package's ``otel`` observer (its module sorting before ``evolane``) never
    takes ``--observer otel``: it is listed as shadowed, evolane's as the built-in."""
    source = "class Obs:\n    async def on_event(self, event):\n        pass\n"
    site = write_distribution(
        tmp_path / "site", "aaa_otel", source, "[evolane.observers]\notel = aaa_otel:Obs\n"
    )
    code = (
        "from evolane.embed import observer_plugin, OpenTelemetryObserver\n"
        "from evolane.lanes import installed_plugins\n"
        "assert isinstance(observer_plugin('otel').inner, OpenTelemetryObserver)\n"
        "rows = [p for p in installed_plugins() if p.name == 'otel']\n"
        "print(sorted((p.target, p.builtin, p.shadowed) for p in rows))\n"
    )
    paths = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(paths)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(
        [("aaa_otel:Obs", False, True), ("evolane.embed:OpenTelemetryObserver", True, False)]
    )
