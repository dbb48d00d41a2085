"""What an in-process backend's unit needs, laid out once: the candidate tree materialised
once per lease and shared read-only by every replay of it, the case read straight from the
store, and the replay's own output folder handed to its judge (no copy laid out again).

The output folder a judge is handed holds exactly what the replay stored (`output_ref`):
nothing writes it after the replay's backend returned, and a judge's later attempts get a
fresh copy from the store."""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import orjson
import trio

from evolane.lanes._recycle import SKELETON, note_fresh, take_spare
from evolane.messages import ArtifactRef
from evolane.sandbox import SandboxHost
from evolane.store import BlobStore, digest_hex, materialize_tree, remove_tree

MAX_HANDED = 4096
"""Output folders waiting for their judge at most; the oldest beyond it are removed (its
judge, if it comes, lays the output out from the store)."""

MAX_CASES_KEPT = 1024
"""Case blobs whose (verified, content-addressed) bytes `read_case` keeps at most."""

_cases: OrderedDict[str, bytes] = OrderedDict()
_cases_lock = threading.Lock()
_handed: OrderedDict[tuple[str, str, str], Path] = OrderedDict()
_handed_lock = threading.Lock()


def tree_dir(host: SandboxHost, ref: ArtifactRef) -> Path:
    """Where ``ref`` is materialised once for the whole lease (read-only, shared)."""
    return host.lease_dir / "trees" / digest_hex(ref)


def materialise_shared(store: BlobStore, ref: ArtifactRef, path: Path) -> Path:
    """``ref`` at ``path``, laid out unless it already is (blocking I/O): hard links to the
    store's read-only blobs; a racing thread's copy wins and this one is dropped."""
    if not path.is_dir():
        try:
            materialize_tree(store, ref, path, link=True, durable=False)
        except OSError:
            if not path.is_dir():  # not a lost race: a real failure
                raise
    return path


async def shared_tree(host: SandboxHost, store: BlobStore, ref: ArtifactRef) -> Path:
    """The read-only shared copy of ``ref`` (a thread hop only the first time)."""
    path = tree_dir(host, ref)
    if path.is_dir():
        return path
    return await trio.to_thread.run_sync(materialise_shared, store, ref, path)


def read_case(store: BlobStore, ref: ArtifactRef) -> dict[str, Any]:
    """A case row from the store (one small, verified blob: read on the event loop), a fresh
    dict per call; the bytes of the last `MAX_CASES_KEPT` cases read are kept (a case is
    read by both arms' replays, and again by both judges, a few units apart)."""
    with _cases_lock:
        data = _cases.get(ref.digest)
        if data is not None:
            _cases.move_to_end(ref.digest)
    if data is None:
        data = store.read_bytes(ref)
        with _cases_lock:
            _cases[ref.digest] = data
            while len(_cases) > MAX_CASES_KEPT:
                _cases.popitem(last=False)
    value = orjson.loads(data)
    if not isinstance(value, dict):
        raise ValueError(f"case blob {ref.digest} is not a JSON object")
    return value


def hand_over(host: SandboxHost, unit_id: str, output: ArtifactRef, unit_dir: Path) -> None:
    """Keep ``unit_dir`` (whose ``out`` folder holds ``output``) for the unit's judge."""
    evicted: list[Path] = []
    with _handed_lock:
        _handed[(str(host.lease_dir), unit_id, output.digest)] = unit_dir
        while len(_handed) > MAX_HANDED:
            evicted.append(_handed.popitem(last=False)[1])
    for folder in evicted:
        host.remove_soon(folder)


def take_over(host: SandboxHost, unit_id: str, output: ArtifactRef) -> Path | None:
    """The unit folder its replay handed over for ``output``, if any (the caller removes it)."""
    with _handed_lock:
        return _handed.pop((str(host.lease_dir), unit_id, output.digest), None)


def make_unit_dir(unit_dir: Path, *subfolders: str) -> None:
    """A fresh unit folder with ``subfolders`` (a leftover of an earlier attempt removed):
    a recycled one (`take_spare`) when they are ``work`` and ``out``."""
    if tuple(sorted(subfolders)) == SKELETON and take_spare(unit_dir):
        return
    try:
        unit_dir.mkdir(parents=True)
    except FileExistsError:
        with contextlib.suppress(FileNotFoundError):
            remove_tree(unit_dir)
        unit_dir.mkdir(parents=True)
    note_fresh(unit_dir)
    for name in subfolders:
        (unit_dir / name).mkdir()
