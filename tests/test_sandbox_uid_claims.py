"""Unit uids are claimed host-wide: two runtimes on one host never run live units as one uid
(found by review: each host counted from its own random place, so two could meet; one
unit's end then removed the other live unit's /dev/shm files, and the two could signal)."""

from __future__ import annotations

import itertools
import os
import secrets
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.sandbox import SandboxSpec, open_sandbox
from evolane.sandbox._litter import end_uid, end_uids, kill_processes_of, processes_of
from evolane.sandbox._secrets import UNIT_UID_BASE, UNIT_UID_SPAN, commands_run_unprivileged
from evolane.sandbox._uids import (
    CLAIMS,
    UidClaim,
    claim_uid,
    claims_folder,
    release_uid,
    sweep_stale_claims,
)


def test_a_claimed_uid_is_not_handed_out_again_until_released(tmp_path: Path) -> None:
    folder = claims_folder(tmp_path / "claims")
    assert folder is not None
    draws: list[bool] = []

    def draw(jump: bool) -> int:  # always the same uid unless told to jump
        draws.append(jump)
        return 7 if not jump else 8

    first = claim_uid(folder, draw)
    second = claim_uid(folder, draw)
    assert (first.uid, second.uid) == (7, 8) and draws == [False, False, True]
    release_uid(first)
    assert not (folder / "7").exists()
    again = claim_uid(folder, draw)
    assert again.uid == 7
    for claim in (second, again):
        release_uid(claim)
    held = claim_uid(folder, lambda jump: 9)
    with pytest.raises(OSError, match="no free unit uid"):  # every try taken: a spawn error
        claim_uid(folder, lambda jump: 9)
    release_uid(held)
    left = claim_uid(folder, lambda jump: 11)
    release_uid(left, ended=False)  # some of its processes outlived their unit: the file
    assert (folder / "11").exists()  # stays, so the next claim ends them first
    ended: list[int] = []
    again = claim_uid(folder, lambda jump: 11, lambda uid: not ended.append(uid))
    assert again.uid == 11 and ended == [11]
    release_uid(again)


def test_a_claims_folder_others_may_write_is_not_used(tmp_path: Path) -> None:
    folder = tmp_path / "open"
    folder.mkdir(mode=0o700)
    folder.chmod(0o777)
    assert claims_folder(folder) is None
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    assert claims_folder(link) is None
    no_uid = claim_uid(None, lambda jump: 5)  # no folder: the host's own count, as before
    assert (no_uid.uid, no_uid.fd) == (5, None)


LONG = """
import os, sys, time
path = sys.argv[1]
open(path, "w").write("x")
print(os.getuid(), flush=True)
time.sleep(float(sys.argv[2]))
print(os.path.exists(path), flush=True)
"""


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
async def test_two_hosts_drawing_the_same_uids_never_share_one(tmp_path: Path) -> None:
    """Both hosts count from the same place: the second's unit gets another uid, and its
    end leaves the first's live /dev/shm file alone (it removed it)."""
    shm = f"/dev/shm/evolane-test-uid-{uuid.uuid4().hex}"
    start = int.from_bytes(os.urandom(2), "big")
    outcomes: dict[str, str] = {}
    try:
        async with (
            open_sandbox(tmp_path / "a") as first,
            open_sandbox(tmp_path / "b") as second,
        ):
            first._uids = itertools.count(start)
            second._uids = itertools.count(start)

            async def run(name: str, host: object, argv: tuple[str, ...]) -> None:
                spec = SandboxSpec(argv=argv, isolation="process", drop_root=True)
                outcome = await host.run(spec, timeout=60)  # type: ignore[attr-defined]
                assert outcome.ok, outcome
                outcomes[name] = outcome.stdout.text()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "long", first, (sys.executable, "-I", "-c", LONG, shm, "3"))
                with trio.fail_after(60):
                    while not os.path.exists(shm):
                        await trio.sleep(0.02)
                await run("short", second, ("sh", "-c", "id -u"))
                await trio.to_thread.run_sync(second.settle)  # its litter removed
    finally:
        if os.path.exists(shm):
            os.unlink(shm)
    long_uid, survived = outcomes["long"].split()
    assert int(outcomes["short"]) != int(long_uid)
    assert survived == "True"


def _held_uid() -> tuple[UidClaim, int]:
    """A unit uid claimed host-wide for this test (in the real claims folder), so no other
    runtime on the host runs a unit as it while the test plays its dead holder."""
    held = claim_uid(claims_folder(), lambda jump: UNIT_UID_BASE + secrets.randbelow(UNIT_UID_SPAN))
    return held, held.uid


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
def test_a_uid_whose_holder_died_holding_it_is_ended_before_it_is_handed_out(
    tmp_path: Path,
) -> None:
    """A holder SIGKILLed with its claim (its file left, its lock gone) left a live process
    of the uid and a /dev/shm file: the next claim kills the one and removes the other
    before it takes the uid; one that cannot end them (``end`` says no) draws another."""
    folder = claims_folder(tmp_path / "claims")
    assert folder is not None
    held, uid = _held_uid()
    shm = Path(f"/dev/shm/evolane-test-stale-{uuid.uuid4().hex}")
    left = subprocess.Popen(["sleep", "300"], user=uid, group=uid, start_new_session=True)
    try:
        shm.write_text("the dead unit's")
        os.chown(shm, uid, uid)
        (folder / str(uid)).touch()  # what a holder that died holding the uid leaves
        other = claim_uid(folder, lambda jump: uid if not jump else uid + 1, lambda _: False)
        assert other.uid == uid + 1 and left.poll() is None and shm.exists()
        release_uid(other)
        claim = claim_uid(folder, lambda jump: uid, end_uid)
        assert claim.uid == uid
        assert left.wait(timeout=30) == -signal.SIGKILL
        assert not shm.exists()
        release_uid(claim)
        assert not (folder / str(uid)).exists()
    finally:
        left.kill()
        left.wait()
        shm.unlink(missing_ok=True)
        release_uid(held)


def test_a_sweep_ends_only_dead_holders_claims_of_the_unit_range(tmp_path: Path) -> None:
    """`sweep_stale_claims` frees a file no one holds, leaves a live claim alone, and never
    acts on a name outside the unit uids it is given (it would kill that uid's processes)."""
    folder = claims_folder(tmp_path / "claims")
    assert folder is not None
    ended: list[int] = []

    def end(uids: set[int]) -> set[int]:
        ended.extend(uids)
        return uids - {12}

    live = claim_uid(folder, lambda jump: 10)
    for name in ("11", "12", "99", "0", "x11", "1\u00b2"):
        (folder / name).touch()
    assert sweep_stale_claims(folder, end, range(10, 20)) == 1
    assert sorted(ended) == [11, 12]
    assert sorted(p.name for p in folder.iterdir()) == ["0", "10", "12", "1\u00b2", "99", "x11"]
    release_uid(live)
    assert sweep_stale_claims(folder, end, range(10, 20)) == 0  # 12 still will not end
    assert sweep_stale_claims(None, end, range(10, 20)) == 0


RUNTIME = """
import sys, trio
from evolane.sandbox import SandboxSpec, open_sandbox

async def main():
    async with open_sandbox(sys.argv[1], use_cgroups=sys.argv[2] == "cgroups") as host:
        print(host._lifeline.pid, flush=True)
        argv = ("sh", "-c", sys.argv[3])
        await host.run(SandboxSpec(argv=argv, isolation="process", drop_root=True), timeout=600)

trio.run(main)
"""
"""A runtime (root ``argv[1]``, with cgroups or not: ``argv[2]``) running the shell command
``argv[3]`` as a unit uid of its own, that prints its lifeline's pid."""


def _runtime(root: Path, command: str, cgroups: bool = True) -> subprocess.Popen[bytes]:
    """`RUNTIME` started: read its lifeline's pid from its stdout."""
    way = "cgroups" if cgroups else "none"
    argv = [sys.executable, "-c", RUNTIME, str(root), way, command]
    return subprocess.Popen(argv, stdout=subprocess.PIPE)


@asynccontextmanager
async def _runtime_with_unit(
    root: Path, shm: str, command: str, cgroups: bool = True
) -> AsyncIterator[tuple[subprocess.Popen[bytes], int, int]]:
    """`RUNTIME` running ``command`` (which makes ``shm`` as its unit uid): the runtime, its
    lifeline's pid and that uid once ``shm`` is made; after, the runtime killed, the uid's
    processes too, and ``shm`` removed, whatever the test left."""
    runtime = _runtime(root, command, cgroups)
    uid = None
    try:
        assert runtime.stdout is not None
        lifeline = int(runtime.stdout.readline())
        with trio.fail_after(60):
            while not os.path.exists(shm):
                await trio.sleep(0.02)
        uid = os.stat(shm).st_uid
        yield runtime, lifeline, uid
    finally:
        runtime.kill()
        runtime.wait()
        while uid is not None and processes_of(uid):
            kill_processes_of(uid)
        if os.path.exists(shm):
            os.unlink(shm)


async def _lifeline_done(runtime: subprocess.Popen[bytes], lifeline: int) -> None:
    """Kill ``runtime`` alone and wait until its lifeline has done its work and left."""
    fd = os.pidfd_open(lifeline)
    try:
        runtime.kill()
        runtime.wait()
        with trio.fail_after(60):
            await trio.lowlevel.wait_readable(fd)
    finally:
        os.close(fd)


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
async def test_the_next_runtime_removes_what_a_killed_runtimes_unit_uid_left(
    tmp_path: Path,
) -> None:
    """A runtime SIGKILLed with its lifeline (as a container's whole process tree can be)
    while a unit of its uid had made a /dev/shm file: its claim file stays, so the next
    runtime on the host, on another root, ends the uid's leftovers as it starts (before,
    the file and the uid's IPC objects stayed until the host rebooted)."""
    shm = f"/dev/shm/evolane-test-killed-{uuid.uuid4().hex}"
    command = f"touch {shm}; exec sleep 300"
    async with _runtime_with_unit(tmp_path / "a", shm, command) as (runtime, lifeline, uid):
        assert uid >= UNIT_UID_BASE and (CLAIMS / str(uid)).exists()
        os.kill(lifeline, signal.SIGKILL)
        runtime.kill()
        runtime.wait()
        async with open_sandbox(tmp_path / "b") as next_host:
            assert next_host.stale_swept >= 1
        assert not os.path.exists(shm)
        assert not (CLAIMS / str(uid)).exists()


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
async def test_a_unit_drawing_a_dead_holders_uid_takes_another_and_the_uid_is_ended(
    tmp_path: Path,
) -> None:
    """A live host draws a uid a dead holder left with a live process: the unit (its
    layout may run on the event loop, so no waiting there) runs as another uid, and the
    host's cleanup thread ends the left process and frees the uid."""
    held, uid = _held_uid()  # and a claims folder of the test's own: no other host sweeps it
    async with open_sandbox(tmp_path / "sb") as host:
        host._uid_claims = folder = claims_folder(tmp_path / "claims")
        assert folder is not None
        left = subprocess.Popen(["sleep", "300"], user=uid, group=uid, start_new_session=True)
        try:
            (folder / str(uid)).touch()  # its holder died holding it
            host._uids = itertools.count(uid - UNIT_UID_BASE)
            spec = SandboxSpec(argv=("id", "-u"), isolation="process", drop_root=True)
            outcome = await host.run(spec, timeout=60)
            assert outcome.ok and int(outcome.stdout.text()) != uid, outcome  # drawn again
            await trio.to_thread.run_sync(host.settle)
            assert left.wait(timeout=30) == -signal.SIGKILL
            assert not (folder / str(uid)).exists()
        finally:
            left.kill()
            left.wait()
            release_uid(held)


ESCAPE = (  # the leader ends once its escapee has left its session (found by CI: ended
    # before the escapee's setsid, it was killed as one of the group, never found as escaped)
    '(setsid env -i sh -c \'touch "$0"; exec sleep 300\' "$HOME/gone" </dev/null >/dev/null'
    ' 2>&1 &); while [ ! -e "$HOME/gone" ]; do sleep 0.02; done; id -u'
)
STORM = (  # an escapee that starts more children than a tree holds pidfds on
    "(setsid env -i sh -c 'i=0; while [ $i -lt 400 ]; do sleep 300 & i=$((i+1)); done;"
    ' touch "$0"; exec sleep 300\' "$HOME/done" </dev/null >/dev/null 2>&1 &);'
    ' while [ ! -e "$HOME/done" ]; do sleep 0.02; done; id -u'
)


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
@pytest.mark.parametrize("command", [ESCAPE, STORM], ids=["escapee", "storm"])
async def test_an_escapee_of_a_unit_uid_without_cgroups_is_killed_before_the_uid_is_freed(
    tmp_path: Path, command: str
) -> None:
    """A root evolane with no cgroup to use (a container whose cgroup tree is read-only):
    a command's double fork + setsid escapee that clears its environment has neither the
    tree's group nor the lease marker, but runs as the unit's uid, and is killed by it,
    with all it started (more than `MAX_TRACKED_ESCAPEES`). Found by review: it outlived
    the run and the host, and its uid went back to the pool, so the next unit given the
    uid (this runtime's or another's) met a live process that could signal it and write
    its files; past the pidfds held, a storm's children outlived the run by thousands."""
    async with open_sandbox(tmp_path / "a", use_cgroups=False) as host:
        spec = SandboxSpec(argv=("sh", "-c", command), isolation="process", drop_root=True)
        outcome = await host.run(spec, timeout=120)
        uid = int(outcome.stdout.text())
        try:
            assert outcome.ok and uid >= UNIT_UID_BASE, outcome
            assert processes_of(uid) == [], "an escapee outlived its run"
            assert outcome.escaped_found >= 1 and outcome.survivors == 0
            await trio.to_thread.run_sync(host.settle)
            assert not (CLAIMS / str(uid)).exists()
        finally:
            while processes_of(uid):
                kill_processes_of(uid)


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
def test_a_sweep_never_ends_a_live_uid_for_a_file_named_otherwise(tmp_path: Path) -> None:
    """Files whose names read as a live claim's uid but are not its name (a leading zero,
    other scripts' digits) are left alone: the sweep neither kills that uid's live process
    nor fails on a name ``int`` refuses (found by review: ``"0" + uid`` ended the live
    unit, and a ``"²"`` stopped every root host's start)."""
    folder = claims_folder(tmp_path / "claims")
    assert folder is not None
    held, uid = _held_uid()
    live = claim_uid(folder, lambda jump: uid)
    unit = subprocess.Popen(["sleep", "300"], user=uid, group=uid, start_new_session=True)
    arabic = str(uid).translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    try:
        for name in (f"0{uid}", arabic, "²", f" {uid}"):
            (folder / name).touch()
        assert sweep_stale_claims(folder, end_uids, range(uid, uid + 1)) == 0
        assert unit.poll() is None
    finally:
        unit.kill()
        unit.wait()
        release_uid(live)
        release_uid(held)


TAMPER = 'find "$0" -uid "$(id -u)" -name out -exec sh -c \'echo tampered > "$1"\' _ {} \\; ; id -u'


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
@pytest.mark.parametrize("keep", [False, True], ids=["workspace", "kept"])
async def test_a_uid_served_again_reaches_nothing_its_last_unit_was_handed(
    tmp_path: Path, keep: bool
) -> None:
    """A unit's workspace (the caller's, read once the run returns) and a kept unit's
    folder are handed back before its uid serves another unit, here another host's whose
    count walked onto it: that unit, running as the same uid, finds and writes nothing of
    the last one's. Found by review: they stayed the uid's, so a replay of one candidate
    could rewrite another's output before its lane read it, or a kept unit's files."""
    outcomes = []
    async with (
        open_sandbox(tmp_path / "a") as first,
        open_sandbox(tmp_path / "b") as second,
    ):
        scratch = first.root / "scratch"
        scratch.mkdir()
        spec = SandboxSpec(
            argv=("sh", "-c", "echo mine > out; id -u; exit $0", "1" if keep else "0"),
            isolation="process",
            drop_root=True,
            keep_failed=keep,
            workspace=None if keep else str(scratch),
        )
        outcomes.append(await first.run(spec, timeout=60))
        await trio.to_thread.run_sync(first.settle)
        uid = int(outcomes[0].stdout.text())
        second._uids = itertools.count(uid - UNIT_UID_BASE)  # its next draw is that uid
        argv = ("sh", "-c", TAMPER, str(first.root))
        spec = SandboxSpec(argv=argv, isolation="process", drop_root=True)
        outcomes.append(await second.run(spec, timeout=60))
        assert int(outcomes[1].stdout.text()) == uid, outcomes
        out = Path(outcomes[0].workspace) / "work" / "out" if keep else scratch / "out"
        assert out.read_text() == "mine\n"


def test_a_sweep_of_many_stale_claims_scans_the_host_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime killed with many live units leaves a claim file each: the next host's
    sweep ends them all with one scan of /proc and of each IPC folder, not one per uid.
    Found by review: 64 stale claims cost 64 scans of /proc at the next start (39 ms each
    on a host of 800 processes; a claim that met one did it on the event loop)."""
    folder = claims_folder(tmp_path / "claims")
    assert folder is not None
    scans: list[str] = []
    listdir, scandir = os.listdir, os.scandir

    def counted_listdir(path: Any = ".") -> list[str]:
        scans.append(str(path))
        return listdir(path)

    def counted_scandir(path: Any = ".") -> Any:
        scans.append(str(path))
        return scandir(path)

    start = secrets.randbelow(UNIT_UID_SPAN - 1024)
    count = itertools.count(start)
    held = [  # claimed host-wide, so no other runtime runs a unit as them meanwhile
        claim_uid(claims_folder(), lambda jump: UNIT_UID_BASE + next(count)) for _ in range(16)
    ]
    try:
        for claim in held:
            (folder / str(claim.uid)).touch()
        monkeypatch.setattr(os, "listdir", counted_listdir)
        monkeypatch.setattr(os, "scandir", counted_scandir)
        uids = range(held[0].uid, held[-1].uid + 1)
        assert sweep_stale_claims(folder, end_uids, uids) == 16
        assert scans.count("/proc") == 1 and scans.count("/dev/shm") == 1, scans
        assert list(folder.iterdir()) == []
    finally:
        for claim in held:
            release_uid(claim)


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
async def test_the_lifeline_of_a_killed_runtime_removes_what_its_unit_uids_left(
    tmp_path: Path,
) -> None:
    """A runtime SIGKILLed alone (the OOM killer's usual pick): its lifeline kills its
    trees, then ends its unit uids' leftovers and claims, with no other runtime to start.
    Found by review: its units' IPC objects (memory outside any cgroup) and claim files
    stayed until some root evolane started on the host, or until it rebooted."""
    shm = f"/dev/shm/evolane-test-lifeline-{uuid.uuid4().hex}"
    command = f"touch {shm}; exec sleep 300"
    async with _runtime_with_unit(tmp_path / "a", shm, command) as (runtime, lifeline, uid):
        assert uid >= UNIT_UID_BASE and (CLAIMS / str(uid)).exists()
        await _lifeline_done(runtime, lifeline)
        assert not os.path.exists(shm)
        assert not (CLAIMS / str(uid)).exists()


GRAB = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1] + "/" + str(os.getuid()), os.O_RDONLY)  # CAP_DAC_READ_SEARCH
open(sys.argv[2], "w").write("x")
while True:  # the lock of the runtime goes with it: then this one holds the claim
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        break
    except BlockingIOError:
        time.sleep(0.005)
time.sleep(600)
"""


@pytest.mark.skipif(not commands_run_unprivileged(), reason="needs root and a unit uid")
async def test_an_escapee_holding_its_claim_file_is_ended_with_its_dead_runtime(
    tmp_path: Path,
) -> None:
    """A runtime with no cgroup SIGKILLed: its command's escapee (environment cleared)
    outlives the lifeline's kills, and, able to open its uid's claim file (units keep
    CAP_DAC_READ_SEARCH), locks it once the runtime's lock is gone, so the uid looks held
    by a live runtime. The lifeline kills every unit process holding a claim file open,
    then ends the uid. Found by review: the escapee lived on, and no sweep ever ended it."""
    shm = f"/dev/shm/evolane-test-grab-{uuid.uuid4().hex}"
    grab = f"{sys.executable} -I -c '{GRAB}' {CLAIMS} {shm}"
    command = f"(setsid env -i {grab} </dev/null >/dev/null 2>&1 &); exec sleep 300"
    started = _runtime_with_unit(tmp_path / "a", shm, command, cgroups=False)
    async with started as (runtime, lifeline, uid):
        assert uid >= UNIT_UID_BASE and processes_of(uid)
        await _lifeline_done(runtime, lifeline)
        assert processes_of(uid) == []
        assert not os.path.exists(shm)
        assert not (CLAIMS / str(uid)).exists()
