"""Found by review: nothing bounded what a command wrote in all, so one candidate's replay
filled the store's file system (files each under --max-file-size), and the run ended
"finished" or died with a torn journal, the host's disk full. A running command's watch now
checks the free space under the sandbox; below the floor the command is killed and the run
ends failed in one line, its folders removed so the space comes back."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from evolane.sandbox import SandboxSpec, _disk, lease_holders, open_sandbox
from evolane.sandbox._disk import (
    DiskFloor,
    DiskLow,
    default_floor,
    default_inode_floor,
    free_inodes,
)
from evolane.store import BlobStore, storage_failure
from tests.campaign_helpers import toy_flags, write_toy


class _Flagged(DiskFloor):
    """A floor crossed once a marker file exists (the command makes it)."""

    def __init__(self, path: Path, marker: Path) -> None:
        super().__init__(path, floor=0)
        self.marker = marker

    def low(self) -> bool:
        return self.marker.exists()


async def test_a_command_that_crosses_the_floor_is_killed_and_the_run_stops(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "full"
    async with open_sandbox(tmp_path / "sandbox", store=BlobStore(tmp_path / "store")) as host:
        host.disk = _Flagged(host.root, marker)
        spec = SandboxSpec(argv=("sh", "-c", f"sleep 0.3; : > {marker}; sleep 60"))
        with trio.fail_after(30), pytest.raises(DiskLow) as raised:
            await host.run(spec, timeout=50)
        assert storage_failure(raised.value) is raised.value  # the run's failure, not a unit's
        assert "fell below" in str(raised.value)
        await trio.to_thread.run_sync(host.settle)
        assert lease_holders(host.lease) == set()  # the sleeper was killed
        assert [p for p in host.lease_dir.iterdir() if p.name.startswith("unit")] == []
        marker.unlink()
        assert (await host.run(SandboxSpec(argv=("true",)))).ok  # a quick one never waits


def test_the_floor_is_never_above_half_of_what_was_free() -> None:
    # Another test process (a pytest-xdist worker) may write or delete meanwhile, and on a
    # nearly full disk the floor follows what is free: taken where free space held still.
    for _ in range(100):
        free = shutil.disk_usage("/").free
        floor = default_floor(Path("/"))
        if shutil.disk_usage("/").free == free:
            break
    assert 0 < floor <= min(1 << 30, free // 2 + 4096)


FILLER = textwrap.dedent(
    """
    import os, sys, time
    for n in range(400):  # 1 MiB every 40 ms, errors ignored: a candidate filling the disk
        try:
            with open(f"fill-{n}", "wb") as handle:
                handle.write(os.urandom(1 << 20))
        except OSError:
            pass
        time.sleep(0.04)
    open(os.path.join(sys.argv[1], "output.json"), "w").write("1")
    """
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root")
@pytest.mark.parametrize(
    ("role", "folder"), [("replay", "{output_dir}"), ("optimizer", "{workdir}")]
)
def test_a_command_filling_the_disk_ends_the_run_failed_through_the_cli(
    tmp_path: Path, role: str, folder: str
) -> None:
    # The store on a 256 MiB tmpfs mounted in a mount namespace of this test's own (nothing
    # is mounted on the host): its floor is 12.8 MiB; the command writes 25 MB/s into its
    # workspace until the disk is full. (An optimizer's lane crash was a lost slot, the
    # framework's: the run went on.)
    told = _optimize_on_tmpfs(tmp_path, "size=256m", FILLER, role, folder, timeout=60)
    assert "fell below" in told, told


def _optimize_on_tmpfs(
    tmp_path: Path, options: str, filler: str, role: str, folder: str, timeout: int
) -> str:
    """``evolane optimize`` of the toy with the store on a tmpfs (``options``) mounted in a
    mount namespace of the test's own (nothing is mounted on the host), the ``role``'s
    command a Python ``filler`` given ``folder``; asserts the run failed (exit 1, no
    traceback) and gives what it told."""
    paths = write_toy(tmp_path, {"0.0": "fix:2"})
    (tmp_path / "filler.py").write_text(filler)
    store = tmp_path / "store"
    store.mkdir()
    flags = toy_flags(paths, store)
    flags[flags.index(f"--{role}") + 1] = f"{sys.executable} -I {tmp_path / 'filler.py'} {folder}"
    flags += ["--isolation", "process", f"--{role}-timeout", str(timeout)]
    command = " ".join(
        [f"mount -t tmpfs -o {options} evolane-test", str(store), "&&", "exec",
         sys.executable, "-m", "evolane", "optimize", *map(shlex.quote, flags)]
    )  # fmt: skip
    done = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", command],
        capture_output=True,
        text=True,
        timeout=4 * timeout + 120,
    )
    told = done.stdout + done.stderr
    assert done.returncode == 1, told
    assert "Traceback" not in told, told
    return told


async def test_a_short_command_that_crosses_the_floor_stops_the_run_too(tmp_path: Path) -> None:
    # Found by review: commands shorter than the watch's first wait each wrote 80 MB and
    # ended; none was ever seen crossing the floor, and the disk filled.
    marker = tmp_path / "full"
    async with open_sandbox(tmp_path / "sandbox", store=BlobStore(tmp_path / "store")) as host:
        host.disk = _Flagged(host.root, marker)
        with trio.fail_after(30), pytest.raises(DiskLow):
            await host.run(SandboxSpec(argv=("sh", "-c", f": > {marker}")), timeout=50)


INODE_FILLER = textwrap.dedent(
    """
    import os, sys, time
    for n in range(100000):  # empty files, 100 every 40 ms, errors ignored: no space taken
        try:
            open(f"f{n}", "wb").close()
        except OSError:
            pass
        if n % 100 == 0:
            time.sleep(0.04)
    open(os.path.join(sys.argv[1], "output.json"), "w").write("1")
    """
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("unshare") is None, reason="needs root")
def test_a_replay_making_empty_files_by_the_many_is_stopped_at_the_inode_floor(
    tmp_path: Path,
) -> None:
    # Found by review: a replay making empty files took every inode of the store's file
    # system, bytes still free, until its deadline (60 s here): the byte floor never saw it.
    # The store on a tmpfs of 8,000 inodes in a mount namespace of this test's own.
    told = _optimize_on_tmpfs(
        tmp_path, "size=256m,nr_inodes=8000", INODE_FILLER, "replay", "{output_dir}", timeout=120
    )
    assert "free inodes" in told and "fell below" in told, told


def test_the_inode_floor_is_never_above_half_of_what_was_free() -> None:
    floor, free = default_inode_floor(Path("/")), free_inodes(Path("/"))
    assert free is None or 0 <= floor <= free // 2


def test_the_failure_names_the_floor_that_was_crossed_not_what_is_left_after_the_kill(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the suite: the kill removed the command's empty files, so the inodes were
    # back when the failure read them again, and it told of the byte floor with 255 MiB left.
    readings = iter([(255 << 20, 5), (255 << 20, 1_000_000)])  # (bytes, inodes) free
    monkeypatch.setattr(_disk, "free_space", lambda _path: next(readings))
    floor = DiskFloor(tmp_path, floor=12 << 20, inode_floor=100)
    assert floor.low()  # 5 inodes left: crossed
    told = str(floor.failure())  # read now, 1,000,000 would be free
    assert "below 100 free inodes (5 left)" in told and "MiB" not in told, told


def test_a_small_disks_floor_is_told_in_kib(tmp_path: Path) -> None:
    """Found by review: on a small disk the line read "fell below 0 MiB free (0 MiB left)"."""
    floor = DiskFloor(tmp_path, floor=512 << 10, inode_floor=0)
    floor.crossed = ("bytes", 3 << 10)  # what `low` saw
    told = str(floor.failure())
    assert "fell below 512 KiB free (3 KiB left)" in told, told
    floor = DiskFloor(tmp_path, floor=12 << 20, inode_floor=0)
    floor.crossed = ("bytes", 5 << 20)
    assert "fell below 12 MiB free (5 MiB left)" in str(floor.failure())
