"""Plugin code that holds or disturbs the process: an observer that leaves a thread running
(not a daemon) after the run, an observer factory that blocks, an observer that prints. Ctrl-C
and SIGTERM still end ``evolane optimize`` (the run's exit code is kept when it had ended);
under ``--progress jsonl`` stdout stays JSON lines."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.campaign_helpers import toy_flags, write_toy
from tests.plugin_helpers import write_distribution

PLUGIN = textwrap.dedent(
    """
    import os, threading, time

    class Leaker:
        async def on_event(self, event):
            if event.kind == "event.run_started":  # a thread that never ends, not a daemon
                threading.Thread(target=threading.Event().wait, name="leaked").start()

    class Boom:
        async def on_event(self, event):
            raise RuntimeError("boom")

    class Printer:
        async def on_event(self, event):
            print("plugin says", event.kind)

    class Stuck:  # sync code blocking the event loop, once: a resume runs free
        async def on_event(self, event):
            stuck = os.environ["HANGPLUG_GATE"] + ".stuck"
            if event.kind == "event.phase" and not os.path.exists(stuck):
                open(stuck, "w").close()
                time.sleep(3600)

    def blocking_factory(*args):
        open(os.environ["HANGPLUG_GATE"], "w").close()
        time.sleep(3600)  # a blocking connect with no timeout
    """
)
ENTRY_POINTS = """\
[evolane.observers]
leaker = evolane_hangplug:Leaker
blocking = evolane_hangplug:blocking_factory
printer = evolane_hangplug:Printer
boom = evolane_hangplug:Boom
stuck = evolane_hangplug:Stuck

[evolane.judges]
blocking = evolane_hangplug:blocking_factory
"""


def _start(
    tmp_path: Path, *flags: str, stderr_fd: int | None = None
) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """``evolane optimize`` on the toy with the test plugin installed, and its stdout and
    stderr files (``stderr_fd``: its stderr instead)."""
    site = write_distribution(tmp_path / "site", "evolane_hangplug", PLUGIN, ENTRY_POINTS)
    paths = write_toy(tmp_path, {"0.0": "fix:1"})
    paths_env = [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]
    gate = str(tmp_path / "gate")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths_env), "HANGPLUG_GATE": gate}
    out, err = tmp_path / "out", tmp_path / "err"
    args = [*toy_flags(paths, tmp_path / "store"), "--iterations", "1", *flags]
    if "--config" in flags:  # the file says how progress is shown
        at = args.index("--progress")
        del args[at : at + 2]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        process = subprocess.Popen(
            [sys.executable, "-m", "evolane", "optimize", *args],
            stdout=stdout,
            stderr=stderr if stderr_fd is None else stderr_fd,
            env=env,
        )
    return process, out, err


def _ended(process: subprocess.Popen[bytes], err: Path) -> None:
    """Wait for ``process`` to exit 0 (a 240 s guard against a hang), killed if it did not."""
    try:
        assert process.wait(timeout=240) == 0, err.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _wait_for(path: Path, text: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180  # a guard against a hang, not a timing figure
    while text not in path.read_text(errors="replace"):
        assert process.poll() is None, path.read_text(errors="replace")
        assert time.monotonic() < deadline, f"never said {text!r}: {path.read_text()}"
        time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_thread_left_running_does_not_make_the_process_unkillable(
    tmp_path: Path, signum: int
) -> None:
    """Once the command is over (exit code decided, a plugin's thread still running), a
    Ctrl-C or SIGTERM ends the process with the run's exit code, not a signal death."""
    process, out, err = _start(tmp_path, "--observer", "leaker")
    try:
        _wait_for(out, "report:", process)  # the run ended: its summary is printed
        # the command is over only once it says what holds the process (a signal before it,
        # while the command returns, is a Ctrl-C of the command: exit 130)
        _wait_for(err, "waiting for threads a plugin or observer left running", process)
        deadline = time.monotonic() + 60  # a guard against a hang, not a timing figure
        while process.poll() is None and time.monotonic() < deadline:
            process.send_signal(signum)  # as a person would, again and again
            time.sleep(0.5)
        assert process.poll() == 0, err.read_text()  # the run's exit code, not a signal death
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize(
    ("flag", "value", "signum"),
    [("--observer", "blocking", signal.SIGTERM), ("--observer", "blocking", signal.SIGINT),
     ("--judge", "blocking:x", signal.SIGINT)],
)  # fmt: skip
def test_a_plugin_factory_that_blocks_is_ended_by_ctrl_c(
    tmp_path: Path, flag: str, value: str, signum: int
) -> None:
    """Ctrl-C (or SIGTERM) during a blocking factory (an observer's, a judge's) ends the
    command as an interrupted start: one line, exit 130, no run written."""
    process, _, err = _start(tmp_path, flag, value)
    try:
        deadline = time.monotonic() + 180  # a guard against a hang, not a timing figure
        while not (tmp_path / "gate").exists():
            assert process.poll() is None and time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        process.send_signal(signum)
        assert process.wait(timeout=60) == 130, err.read_text()
        assert err.read_text().strip().splitlines()[-1].startswith("evolane: interrupted")
        assert not (tmp_path / "store" / "runs").exists()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_an_event_loop_blocked_by_sync_code_still_ends_on_the_third_signal(
    tmp_path: Path, signum: int
) -> None:
    # Found by review: an observer running sync code on the loop left the command deaf to
    # every Ctrl-C and SIGTERM (the loop's receiver never ran). Signals the loop has not
    # taken now end the process on the third: one line, exit 130, resumable.
    process, _, err = _start(tmp_path, "--observer", "stuck")
    try:
        _wait_for_file(tmp_path / "gate.stuck", process, err)
        for _ in range(120):  # as a person would, again and again (a guard, not a timing)
            process.send_signal(signum)
            if process.poll() is not None:
                break
            time.sleep(0.5)
        assert process.wait(timeout=60) == 130, err.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    (line,) = [x for x in err.read_text().splitlines() if "signals unheard" in x]
    assert re.match(r"evolane: interrupted: \d+ signals unheard for [\d.]+ s \(code blocking", line)
    run_id = line.rsplit("--resume ", 1)[1].split()[0]
    again = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", "--resume", run_id,
         "--store", str(tmp_path / "store"), "--progress", "none"],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "site"),
             "HANGPLUG_GATE": str(tmp_path / "gate")},
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr
    (run,) = (tmp_path / "store").glob(f"runs/{run_id}/run.json")
    assert json.loads(run.read_text())["status"] == "finished"


def test_a_blocked_loop_still_ends_130_when_its_stderr_reader_died_with_the_ctrl_c(
    tmp_path: Path,
) -> None:
    # Found by review: under `evolane optimize ... 2>&1 | tee log` Ctrl-C ends tee too, and
    # the line said at the third unheard signal raised EPIPE in the handler, into the
    # blocked code: the process went on and ended 1, not 130 as the README says.
    reader, writer = os.pipe()
    try:
        process, _, err = _start(tmp_path, "--observer", "stuck", stderr_fd=writer)
    finally:
        os.close(writer)
    try:
        _wait_for_file(tmp_path / "gate.stuck", process, err)
        os.close(reader)  # tee is gone
        for _ in range(120):  # as a person would, again and again (a guard, not a timing)
            process.send_signal(signal.SIGINT)
            if process.poll() is not None:
                break
            time.sleep(0.5)
        assert process.wait(timeout=60) == 130
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def _wait_for_file(path: Path, process: subprocess.Popen[bytes], err: Path) -> None:
    deadline = time.monotonic() + 180  # a guard against a hang, not a timing figure
    while not path.exists():
        assert process.poll() is None and time.monotonic() < deadline, err.read_text()
        time.sleep(0.1)


def test_a_plugins_print_leaves_jsonl_progress_json(tmp_path: Path) -> None:
    """What an observer prints goes to stderr: every stdout line is a progress event."""
    process, out, err = _start(tmp_path, "--observer", "printer", "--progress", "jsonl")
    _ended(process, err)
    lines = out.read_text().splitlines()
    assert lines and all(json.loads(line)["kind"].startswith("event.") for line in lines)
    assert "plugin says event.run_finished" in err.read_text()


def test_a_plugins_print_leaves_jsonl_progress_from_the_config_file_json(tmp_path: Path) -> None:
    # Found by review: stdout was kept for JSON lines only when --progress jsonl was a flag,
    # not when it came from the config file (or a resumed run's stored settings).
    config = tmp_path / "evolane.toml"
    config.write_text('progress = "jsonl"\n')
    process, out, err = _start(tmp_path, "--observer", "printer", "--config", str(config))
    _ended(process, err)
    lines = out.read_text().splitlines()
    assert lines and all(json.loads(line)["kind"].startswith("event.") for line in lines)
    assert "plugin says event.run_finished" in err.read_text()


def test_a_disabled_observer_is_said_without_a_live_view(tmp_path: Path) -> None:
    """Under ``--progress none`` nobody saw the run's warning: the disabled observer is one
    line on stderr after the run (found by review: exit 0 and not a word)."""
    process, _, err = _start(tmp_path, "--observer", "boom", "--progress", "none")
    _ended(process, err)
    said = [line for line in err.read_text().splitlines() if "observer boom" in line]
    assert said == ["evolane: observer boom was disabled: it raised RuntimeError: boom"]
