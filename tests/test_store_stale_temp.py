"""Found by review: a runtime killed while it wrote a blob left its temp file in
``objects/tmp`` for ever (a spooled capture's can be large): `BlobStore.remove_stale_temp`
existed but nothing called it. Opening a sandbox host on the store (every run does) now
removes temp files untouched for an hour; a live writer's fresh file stays. The
optimizer's context folder is made there too (it was made under the system's /tmp, where a
killed runtime left one for ever: found by review), and a stale one goes the same way."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.sandbox import open_sandbox
from evolane.store import BlobStore
from tests.campaign_helpers import run_optimize, toy_flags, write_toy


async def test_opening_a_host_removes_a_killed_writers_temp_files(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    store.tmp.mkdir(parents=True)
    stale, fresh, folder = (store.tmp / name for name in ("blob-a.tmp", "blob-b.tmp", "ctx"))
    stale.write_bytes(b"half a blob")
    fresh.write_bytes(b"being written")
    (folder / "cases" / "c1").mkdir(parents=True)  # a killed runtime's context folder
    (folder / "cases" / "c1" / "case.json").write_bytes(b"{}")
    young = store.tmp / "ctx-live"
    young.mkdir()
    hours_ago = time.time() - 2 * 3600
    for old in (stale, folder):
        os.utime(old, (hours_ago, hours_ago))
    with trio.fail_after(60):
        async with open_sandbox(tmp_path / "sandbox", store=store):
            pass
    assert not stale.exists() and not folder.exists()
    assert fresh.exists() and young.is_dir()


def test_the_optimizers_context_is_made_in_the_stores_temp_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from evolane.campaign import _prompt

    store = BlobStore(tmp_path / "store")
    made: list[str] = []
    real = tempfile.TemporaryDirectory

    def recorded(*args: Any, **kwargs: Any) -> Any:
        folder = real(*args, **kwargs)
        made.append(folder.name)
        return folder

    monkeypatch.setattr(_prompt.tempfile, "TemporaryDirectory", recorded)
    _prompt.write_context(store, [], [], {})
    (folder,) = made
    assert Path(folder).parent == store.tmp and not Path(folder).exists()


DIE_AS_A_RECORD_IS_RENAMED = """
import os, sys
from evolane.cli import main

real, name = os.replace, sys.argv[1]

def replace(source, target, *args, **kwargs):
    if str(target).endswith(name):
        os._exit(9)  # as a SIGKILL between the temp file's write and its rename
    return real(source, target, *args, **kwargs)

os.replace = replace
sys.argv = ["evolane", "optimize", *sys.argv[2:]]
main()
"""


def _killed_as_it_renames(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """The toy, one iteration, killed as it renames the record ``name`` into its run's
    folder: the store and that folder."""
    paths = write_toy(tmp_path, {"0.0": "fix:2"})
    store = tmp_path / "store"
    flags = [*toy_flags(paths, store), "--iterations", "1", "--population", "1"]
    died = subprocess.run(
        [sys.executable, "-c", DIE_AS_A_RECORD_IS_RENAMED, name, *flags],
        capture_output=True,
        timeout=300,
    )
    assert died.returncode == 9, died.stderr.decode()
    (run_dir,) = (store / "runs").iterdir()
    assert [p.name for p in run_dir.glob(f".{name}.*.tmp")]  # what the kill left
    return store, run_dir


def test_a_resume_removes_the_temp_file_a_kill_left_in_its_run_folder(tmp_path: Path) -> None:
    """Found by crash fuzzing: a SIGKILL while a run wrote a record (``report.json``,
    ``apply.json``) left its ``.<name>.<random>.tmp`` in the run's folder for good, through
    the resume that finished the run."""
    store, run_dir = _killed_as_it_renames(tmp_path, "report.json")
    done = run_optimize(["--resume", run_dir.name, "--store", str(store), "--progress", "none"])
    assert done.returncode == 0, done.stderr
    assert (run_dir / "report.json").is_file()
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]


def test_fsck_repair_removes_the_temp_file_a_kill_left_in_an_ended_run(tmp_path: Path) -> None:
    """Found by crash fuzzing: report.html is written after ``run.json`` says the run
    ended, so a SIGKILL as it was renamed left ``.report.html.<random>.tmp`` that no resume
    takes up (the run ended), and ``evolane fsck --repair`` called the store clean."""
    store, run_dir = _killed_as_it_renames(tmp_path, "report.html")
    fsck = [sys.executable, "-m", "evolane", "fsck", "--store", str(store)]
    found = subprocess.run(fsck, capture_output=True, text=True, timeout=300)
    assert found.returncode == 1 and "leftover temp file" in found.stdout, found.stdout
    assert [p.name for p in run_dir.glob(".report.html.*.tmp")]  # only reported
    repaired = subprocess.run([*fsck, "--repair"], capture_output=True, text=True, timeout=300)
    assert repaired.returncode == 1 and "(removed)" in repaired.stdout, repaired.stdout
    assert not [p.name for p in run_dir.iterdir() if p.name.endswith(".tmp")]
    assert subprocess.run(fsck, capture_output=True, timeout=300).returncode == 0
