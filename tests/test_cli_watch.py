"""``evolane watch`` and ``evolane report --follow`` through the real CLI: on a finished run
(the same final figures as the run's own view, the run's exit code), on a running one (it
follows to the end), on one killed mid-way (the resume line), and on bad input."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

from evolane.views import EventTail
from tests.campaign_helpers import toy_flags, usage_replay, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]
PLAN = {"0.0": "fix:2", "0.1": "harm:1", "1.0": "fix:1", "1.1": "noop"}
GATED_REPLAY = (
    "sh -c 'while [ ! -e {gate}/open ]; do sleep 0.05; done; "
    'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' replay {{candidate}} {{output_dir}}'
)
"""A replay that waits until the test creates ``open`` in the gate folder: the run stays
running for as long as the test needs it to."""


def _gated(tmp_path: Path, **values: str) -> tuple[list[str], Path]:
    """Flags whose replays wait for the gate (one iteration), and the gate folder."""
    gate = tmp_path / "gate"
    gate.mkdir()
    flags = _flags(tmp_path, replay=GATED_REPLAY.format(gate=gate), iterations="1", **values)
    return [*flags, "--expose", str(gate)], gate


def _flags(tmp_path: Path, progress: str = "none", **values: str) -> list[str]:
    """The toy workload's flags (two iterations), with ``values`` replacing flags by name."""
    paths = write_toy(tmp_path / "toy", PLAN)
    flags = toy_flags(paths, tmp_path / "store")
    values = {"iterations": "2", "progress": progress, **values}
    for name, value in values.items():
        flag = "--" + name.replace("_", "-")
        if flag in flags:
            flags[flags.index(flag) + 1] = value
        else:
            flags += [flag, value]
    return flags


def _evolane(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=timeout)


def _finished_line(out: str) -> str:
    (line,) = [line for line in out.splitlines() if "] finished: " in line]
    return line


def _run_dir(store: Path) -> Path:
    (run_dir,) = (store / "runs").iterdir()
    return run_dir


def _wait_for_events(store: Path, process: subprocess.Popen[str]) -> Path:
    """The run's events.jsonl, once it exists; fail if the run ends first."""
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing assertion
    while not list(store.glob("runs/*/events.jsonl")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, f"no events.jsonl in {store}"
        time.sleep(0.05)
    return _run_dir(store) / "events.jsonl"


@dataclass(frozen=True)
class Finished:
    """A finished toy run: its store, its id and what its own plain view printed."""

    store: Path
    run_id: str
    out: str


@pytest.fixture(scope="module")
def finished(tmp_path_factory: pytest.TempPathFactory) -> Finished:
    root = tmp_path_factory.mktemp("finished")
    run = _evolane("optimize", *_flags(root, progress="plain"))
    assert run.returncode == 0, run.stderr
    return Finished(root / "store", _run_dir(root / "store").name, run.stdout)


def test_watch_on_a_finished_run_shows_the_figures_of_its_own_view(finished: Finished) -> None:
    store, run_id = finished.store, finished.run_id
    watched = _evolane("watch", run_id[:12], "--store", str(store), "--progress", "plain")
    assert watched.returncode == 0, watched.stderr
    assert _finished_line(watched.stdout) == _finished_line(finished.out)
    decisions = [line for line in finished.out.splitlines() if "] decision " in line]
    assert decisions and [line for line in watched.stdout.splitlines() if line in decisions] == (
        decisions
    )
    assert watched.stdout.splitlines()[-1] == f"run {run_id} ended finished (exit 0)"
    rich = _evolane("watch", run_id, "--store", str(store), "--progress", "rich")
    assert rich.returncode == 0 and "finished: finished" in rich.stdout, rich.stderr


def test_report_follow_watches_then_prints_the_report(finished: Finished) -> None:
    store, run_id = finished.store, finished.run_id
    followed = _evolane("report", run_id, "--store", str(store), "--follow")
    assert followed.returncode == 0, followed.stderr
    assert _finished_line(followed.stdout) == _finished_line(finished.out)
    assert "decisions" in followed.stdout
    assert f"report.json: {store / 'runs' / run_id / 'report.json'}" in followed.stdout
    as_json = _evolane("report", run_id, "--store", str(store), "--follow", "--format", "json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["run_id"] == run_id  # the view went to stderr
    assert "finished: finished" in as_json.stderr


def test_watch_exits_with_a_budget_limited_runs_code(tmp_path: Path) -> None:
    store = tmp_path / "store"
    flags = _flags(tmp_path, replay=usage_replay(tmp_path), max_tokens="1500")
    run = _evolane("optimize", *flags)
    assert run.returncode == 3, run.stderr
    watched = _evolane("watch", _run_dir(store).name, "--store", str(store), "--progress", "plain")
    assert watched.returncode == 3, watched.stderr
    assert "finished: budget_limited" in watched.stdout


def test_watch_follows_a_running_run_to_its_end_and_ctrl_c_only_detaches(
    tmp_path: Path,
) -> None:
    store = tmp_path / "store"
    flags, gate = _gated(tmp_path)
    run = subprocess.Popen([*EVOLANE, "optimize", *flags], stdout=subprocess.DEVNULL)
    watchers: list[subprocess.Popen[str]] = []
    try:
        run_id = _wait_for_events(store, run).parent.name
        command = [*EVOLANE, "watch", run_id, "--store", str(store), "--progress", "plain"]
        for _ in range(2):
            watchers.append(subprocess.Popen(command, stdout=subprocess.PIPE, text=True))
        detached, watched = watchers
        assert detached.stdout is not None and watched.stdout is not None
        first = detached.stdout.readline()  # it is following: a Ctrl-C now detaches
        detached.send_signal(signal.SIGINT)
        rest, _ = detached.communicate(timeout=60)
        assert run.poll() is None  # the run goes on
        watched_first = watched.stdout.readline()
        (gate / "open").touch()
        watched_rest, _ = watched.communicate(timeout=120)
        assert run.wait(timeout=120) == 0
    finally:
        (gate / "open").touch()
        for process in [run, *watchers]:
            if process.poll() is None:
                process.kill()
                process.wait()
    assert detached.returncode == 0
    assert f"] run {run_id}" in first
    assert f"detached from run {run_id}; it goes on" in rest
    assert watched.returncode == 0
    assert f"] run {run_id}" in watched_first  # from its first event on
    assert "finished: finished" in watched_rest


def test_watch_of_a_killed_run_ends_with_the_resume_line(tmp_path: Path) -> None:
    store = tmp_path / "store"
    flags, _gate = _gated(tmp_path)  # never opened: the run is killed mid-way
    run = subprocess.Popen([*EVOLANE, "optimize", *flags], stdout=subprocess.DEVNULL, text=True)
    watch: subprocess.Popen[str] | None = None
    try:
        run_dir = _wait_for_events(store, run).parent
        command = [*EVOLANE, "watch", run_dir.name, "--store", str(store), "--progress", "plain"]
        watch = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert watch.stdout is not None
        first = watch.stdout.readline()  # the watcher is following the run
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=30)
        rest, err = watch.communicate(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        if watch is not None and watch.poll() is None:
            watch.kill()
            watch.wait()
    assert watch.returncode == 130, err
    assert f"] run {run_dir.name}" in first
    lines = rest.splitlines()
    assert "finished:" not in rest
    assert lines[-2] == f"run {run_dir.name} ended without finishing: its process is gone (killed?)"
    assert lines[-1] == f"resume: evolane optimize --resume {run_dir.name} --store {store}"


def test_watch_skips_a_garbage_line_with_a_warning(tmp_path: Path, finished: Finished) -> None:
    store = tmp_path / "store"
    shutil.copytree(finished.store, store)
    events = store / "runs" / finished.run_id / "events.jsonl"
    lines = events.read_bytes().splitlines(keepends=True)
    garbage = [b"not json at all\n", b'{"kind": "event.phase"}\n', b"[1, 2]\n"]
    events.write_bytes(b"".join(lines[:2] + garbage + lines[2:]))
    watched = _evolane("watch", finished.run_id, "--store", str(store), "--progress", "plain")
    assert watched.returncode == 0, watched.stderr
    assert _finished_line(watched.stdout) == _finished_line(finished.out)
    warnings = watched.stderr.strip().splitlines()
    assert [w.split(": skipped")[0] for w in warnings] == [
        f"evolane: warning: {events}:{n}" for n in (3, 4, 5)
    ]
    assert "Traceback" not in watched.stderr


UNREADABLE = ["setpriv", "--bounding-set=-dac_override,-dac_read_search"] * (os.geteuid() == 0)
"""What runs a command as root without its power to read any file (else as it is)."""


@pytest.mark.parametrize("kind", ["fifo", "device", "unreadable"])
def test_watch_of_events_that_are_no_file_is_one_error_line(
    tmp_path: Path, finished: Finished, kind: str
) -> None:
    # Found by review: a FIFO in place of events.jsonl hung `watch` in its open, deaf to
    # Ctrl-C, a link to /dev/zero was read for ever (one core busy), and an events file
    # its mode made unreadable was a traceback.
    if kind == "unreadable" and UNREADABLE and shutil.which("setpriv") is None:
        pytest.skip("root without setpriv reads every file")
    store = tmp_path / "store"
    shutil.copytree(finished.store, store)
    events = store / "runs" / finished.run_id / "events.jsonl"
    if kind == "unreadable":
        events.chmod(0)
    else:
        events.unlink()
        os.mkfifo(events) if kind == "fifo" else events.symlink_to("/dev/zero")
    said = {
        "fifo": f"{events} is a FIFO, not a regular file",
        "device": f"{events} is a character device, not a regular file",
        "unreadable": f"cannot read {events}: Permission denied",
    }[kind]
    for command in (("watch",), ("report", "--follow")):
        args = [*command, finished.run_id, "--store", str(store)]
        done = subprocess.run(
            [*UNREADABLE, *EVOLANE, *args], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 2, done.stderr
        (line,) = done.stderr.splitlines()
        assert line.startswith(f"evolane: error: {said}"), line


def test_watch_of_an_unknown_run_is_one_error_line(tmp_path: Path) -> None:
    (tmp_path / "store" / "runs").mkdir(parents=True)
    done = _evolane("watch", "nope", "--store", str(tmp_path / "store"))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error: unknown run"), done.stderr
    bad = _evolane("watch", "x", "--store", str(tmp_path / "store"), "--progress", "none")
    assert bad.returncode == 2 and "--progress" in bad.stderr


def test_the_tail_reads_bounded_chunks_and_waits_for_a_whole_line(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(path, chunk=8, max_line=12)
    assert tail.read() == ([], True)  # no file yet: nothing, and at its end
    path.write_bytes(b'{"a":1}\n{"b":')
    assert tail.read() == ([b'{"a":1}'], False)  # 8 bytes at most
    assert tail.read() == ([], True)  # a partial line waits
    with path.open("ab") as out:
        out.write(b"2}\n" + b"x" * 20 + b"\n{}\n")
    seen: list[bytes | None] = []
    while True:
        lines, at_end = tail.read()
        seen += lines
        if at_end:
            break
    assert seen == [b'{"b":2}', None, b"{}"]  # the overlong line is reported as None
    assert tail.line_number == 4


def _lines_until(stream: IO[str], wanted: str, guard: float = 150) -> list[str]:
    """Lines of ``stream`` up to the first holding ``wanted`` (fail past ``guard`` seconds:
    a guard against a hang, not a timing assertion). Read from its file descriptor, never
    through the stream's buffer: `select` sees only the pipe, so lines a buffered read took
    ahead were never looked at (a flake under load: the wanted line sat in that buffer)."""
    fd, data = stream.fileno(), b""
    deadline = time.monotonic() + guard
    while True:
        lines = data.decode(errors="replace").splitlines(keepends=True)
        for number, line in enumerate(lines):
            if wanted in line and line.endswith("\n"):
                return lines[: number + 1]
        left = deadline - time.monotonic()
        assert left > 0, f"no {wanted!r} in {lines}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            chunk = os.read(fd, 1 << 16)
            assert chunk, f"the stream ended before {wanted!r}: {lines}"
            data += chunk


def _settled_size(path: Path, still: float = 1.0) -> int:
    """``path``'s size once it has not grown for ``still`` seconds (under a guard)."""
    deadline = time.monotonic() + 120  # a guard against a hang, not a timing assertion
    size, since = path.stat().st_size, time.monotonic()
    while time.monotonic() - since < still:
        assert time.monotonic() < deadline, f"{path} kept growing"
        time.sleep(0.05)
        now = path.stat().st_size
        if now != size:
            size, since = now, time.monotonic()
    return size


def test_watch_says_a_silent_run_is_quiet_with_its_lanes_busy(tmp_path: Path) -> None:
    """Found by review: a run whose replays hang looked like a working one: ``watch`` showed
    the events it had and nothing more (the live view's clock restarted at the newest
    event's time when it attached), and said ``lanes 0/3 busy`` while three replays held
    every lane (no event told a unit's start). Now the views say how long the run has been
    silent, as written (the events file's time), with the lanes its units hold."""
    store = tmp_path / "store"
    flags, gate = _gated(tmp_path)  # never opened while watched: every replay hangs
    run = subprocess.Popen([*EVOLANE, "optimize", *flags], stdout=subprocess.DEVNULL)
    watch: subprocess.Popen[str] | None = None
    try:
        events = _wait_for_events(store, run)
        tail = EventTail(events)
        busy = 0
        deadline = time.monotonic() + 120  # a guard against a hang, not a timing assertion
        while busy < 3:
            assert time.monotonic() < deadline and run.poll() is None, "no unit started"
            for line in tail.read()[0]:
                event = json.loads(line) if line else {}
                busy = max(busy, event.get("lanes_busy", 0))
            time.sleep(0.05)
        command = [*EVOLANE, "watch", events.parent.name, "--store", str(store)]
        for _ in range(5):  # again if a late event (held back by its interval) moved the time
            size = _settled_size(events)
            past = time.time() - 300
            os.utime(events, (past, past))  # the run has said nothing for five minutes
            watch = subprocess.Popen(
                [*command, "--progress", "plain"], stdout=subprocess.PIPE, text=True
            )
            assert watch.stdout is not None
            quiet = _lines_until(watch.stdout, "no event for")[-1]
            watch.send_signal(signal.SIGINT)
            watch.communicate(timeout=60)
            if events.stat().st_size == size:
                break
    finally:
        (gate / "open").touch()
        for process in (run, watch):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGINT)
                try:
                    process.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
    assert "no event for 5m" in quiet and "(3/3 lanes busy)" in quiet, quiet
    assert float(quiet.split("s]", 1)[0].strip("[ ")) >= 300  # the run's clock, not ours


def test_a_watchers_silence_is_on_its_own_clock_once_attached(tmp_path: Path) -> None:
    """Found by review: the silence was the wall clock less the events file's time, so with
    that time ahead of the watcher's clock (a clock stepped back, a store on a host whose
    clock is ahead) ``no event for`` never came for a hung run. After the attach-time
    reading, the watcher's own monotonic clock counts it; a new event starts it again."""
    import fcntl

    import trio
    import trio.testing

    from evolane.campaign import StoreLayout
    from evolane.cli._watch import _Follower
    from evolane.views import EventDecoder

    layout = StoreLayout(tmp_path / "store")
    run_dir = layout.run_dir("r-1")
    run_dir.mkdir(parents=True)
    events = run_dir / "events.jsonl"
    events.write_bytes(b"")
    ahead = time.time() + 3600
    os.utime(events, (ahead, ahead))  # written "an hour from now", by the watcher's clock
    held = os.open(run_dir / "journal.jsonl", os.O_RDWR | os.O_CREAT)
    fcntl.flock(held, fcntl.LOCK_EX)  # a live run holds its journal
    follower = _Follower(layout, "r-1", EventTail(events), EventDecoder(events, print))
    seen: list[float] = []

    async def main() -> None:
        send, receive = trio.open_memory_channel[object](16)
        async with trio.open_nursery() as nursery, receive:
            nursery.start_soon(follower.follow, send)
            await trio.sleep(45)
            seen.append(follower.lag())
            with events.open("a") as out:
                out.write("{}\n")  # a new line (not an event: skipped) is news all the same
            await trio.sleep(5)
            seen.append(follower.lag())
            nursery.cancel_scope.cancel()

    try:
        trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    finally:
        os.close(held)
    assert seen[0] >= 40, seen
    assert seen[1] < 10, seen
