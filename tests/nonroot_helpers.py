"""Running evolane as an unprivileged user from a root test: a uid no one else uses, a
folder it owns, a cgroup v2 of its own (delegated to it), ``ulimit -u`` (``prlimit``).

RLIMIT_NPROC is not enforced for root and counts every process of the uid host-wide, so
each test takes a uid of its own, far from the ranges distributions and evolane's unit uids
(`evolane.sandbox._secrets.UNIT_UID_BASE`) use.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import secrets
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

_UIDS = (1_500_000_000, 100_000_000)  # the first, and how many to pick from
_V2 = Path("/sys/fs/cgroup/unified")  # a hybrid host's cgroup v2 (this host kind's)
_DELEGATED = ("cgroup.procs", "cgroup.threads", "cgroup.subtree_control")


def free_uid() -> int:
    """A uid that owns no process on this host (picked at random, checked in /proc)."""
    for _ in range(100):
        uid = _UIDS[0] + secrets.randbelow(_UIDS[1])
        if not any(_owner(pid) == uid for pid in os.listdir("/proc") if pid.isdigit()):
            return uid
    raise AssertionError("no free uid found")


def _owner(pid: str) -> int | None:
    with contextlib.suppress(OSError):
        return os.stat(f"/proc/{pid}").st_uid
    return None


def needs_root_and_setpriv() -> None:
    """Skip unless this test can switch to another uid."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None or shutil.which("prlimit") is None:
        pytest.skip("needs root, setpriv and prlimit to run evolane as another user")


@contextlib.contextmanager
def owned_folder(uid: int) -> Iterator[Path]:
    """A fresh folder under the system's temp folder owned by ``uid`` (pytest's tmp_path is
    root's alone), removed after."""
    folder = Path(tempfile.mkdtemp(prefix="evolane-nonroot-"))
    os.chown(folder, uid, uid)
    try:
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@contextlib.contextmanager
def delegated_v2(uid: int, name: str) -> Iterator[Path]:
    """A cgroup v2 of this test's own, below this process's, delegated to ``uid`` (as systemd
    delegates ``user@UID.service``); removed after, once its processes are gone."""
    own = Path("/proc/self/cgroup").read_text().splitlines()
    path = next((line[3:] for line in own if line.startswith("0::")), None)
    base = _V2 / (path or "/").lstrip("/")
    if path is None or not (base / "cgroup.procs").exists():
        pytest.skip("needs a writable cgroup v2 (this host kind has one)")
    cgroup = base / f"evolane-test-{os.getpid()}-{name}"
    cgroup.mkdir()
    try:
        for item in (cgroup, *(cgroup / file for file in _DELEGATED)):
            os.chown(item, uid, uid)
        yield cgroup
    finally:
        for _ in range(100):
            try:
                _remove(cgroup)
                break
            except OSError:
                time.sleep(0.1)


def _remove(cgroup: Path) -> None:
    """Remove ``cgroup`` and the (empty) cgroups its user made below it."""
    for child in sorted(cgroup.rglob("*"), key=lambda p: -len(p.parts)):
        if child.is_dir():
            child.rmdir()
    cgroup.rmdir()


def _others_may_run(path: str) -> bool:
    """Whether a uid of no group of the file's may execute ``path`` (every folder above it
    searchable, the file executable, by others)."""
    real = Path(os.path.realpath(path))
    folders_ok = all(os.stat(folder).st_mode & stat.S_IXOTH for folder in real.parents)
    return folders_ok and bool(os.stat(real).st_mode & stat.S_IXOTH)


def python_for_others() -> tuple[str, list[str]]:
    """A Python another uid may run with this one's packages: this one, else the system's
    of the same version (this host's venv sits in a folder of root's), and the folders to
    add to its path (`readable_by_others`: CI's venv sits in a ``mktemp -d`` folder, 0700)."""
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    paths = sysconfig.get_paths()
    packages = [readable_by_others(p) for p in dict.fromkeys((paths["purelib"], paths["platlib"]))]
    if _others_may_run(sys.executable):
        return sys.executable, packages
    system = shutil.which(version, path="/usr/bin:/bin")
    if system is None or not _others_may_run(system):
        pytest.skip("no Python another uid may run")
    return system, packages


_SHARED: list[Path] = []
"""The folder of `readable_by_others`' copies, made once a test process, removed at its exit."""


@functools.cache
def readable_by_others(folder: str) -> str:
    """``folder`` if any uid may read it, else a copy any may (hard links where the file
    system allows: a venv's 400 MB in a second), once a test process."""
    real = Path(os.path.realpath(folder))
    if all(os.stat(p).st_mode & stat.S_IXOTH for p in (real, *real.parents)):
        return folder
    if not _SHARED:
        _SHARED.append(Path(tempfile.mkdtemp(prefix="evolane-nonroot-shared-")))
        _SHARED[0].chmod(0o755)
        atexit.register(shutil.rmtree, _SHARED[0], True)
    copy = _SHARED[0] / f"{len(list(_SHARED[0].iterdir()))}-{real.name}"
    shutil.copytree(real, copy, symlinks=True, copy_function=_link_or_copy)
    return str(copy)


def _link_or_copy(source: str, target: str) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def as_user(
    uid: int,
    argv: list[str],
    cwd: Path,
    *,
    cgroup: Path | None = None,
    nproc: int | None = None,
    timeout: float = 300,
) -> subprocess.CompletedProcess[str]:
    """``argv`` run as ``uid`` (its group the same, no others), in ``cgroup`` when given,
    under ``ulimit -u nproc`` when given; evolane's source importable, and this Python in
    ``argv`` one the uid may run (`python_for_others`) (a 300 s guard against a hang, not a
    timing figure)."""
    switch = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--"]
    limit = ["prlimit", f"--nproc={nproc}:{nproc}", "--"] if nproc is not None else []
    join = (
        ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(cgroup / "cgroup.procs")] if cgroup else []
    )
    python, packages = python_for_others()
    argv = [python if word == sys.executable else word for word in argv]
    source = readable_by_others(str(Path(__file__).resolve().parents[1] / "src"))
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "PYTHONPATH": os.pathsep.join([source, *packages]),
        "LANG": "C.UTF-8",
    }
    return subprocess.run(
        [*join, *limit, *switch, *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
