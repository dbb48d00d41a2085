"""Many small blobs stored in one pass: written, then fsynced back to back, then linked into
place, then each folder fsynced once (one blob at a time fsyncs its file and its folder in
turn: a dataset's cases paid that per case)."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import tempfile
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path

from evolane.messages import ArtifactRef
from evolane.store._blobs import BlobStore, fsync_dir, publish, with_path

_DIGEST = "sha256:"
BATCH_FILES = 512
"""Blobs written before their fsync pass: bounds the temp files a batch holds at once."""


class RefTable(Mapping[str, ArtifactRef]):
    """Refs of many blobs of one media type by name, kept compact: a 32-byte digest and a
    size per name, not a model per name (the refs of a 100,000-case dataset took ~120 MB as
    models); a name's `ArtifactRef` is built when it is looked up."""

    __slots__ = ("_at", "_digests", "_media_type", "_sizes")

    def __init__(
        self, at: Mapping[str, int], digests: bytes, sizes: array[int], media_type: str
    ) -> None:
        self._at, self._digests, self._sizes = at, digests, sizes
        self._media_type = media_type

    def __getitem__(self, name: str) -> ArtifactRef:
        index = self._at[name]
        digest = self._digests[32 * index : 32 * index + 32]
        return ArtifactRef(
            digest=_DIGEST + digest.hex(), size=self._sizes[index], media_type=self._media_type
        )

    def __contains__(self, name: object) -> bool:
        return name in self._at  # no ref built to answer

    def __iter__(self) -> Iterator[str]:
        return iter(self._at)

    def __repr__(self) -> str:
        return f"RefTable({len(self._at)} refs of {self._media_type})"

    def __len__(self) -> int:
        return len(self._at)


def put_table(
    store: BlobStore,
    named: Iterable[tuple[str, bytes]],
    media_type: str,
    *,
    places: Mapping[str, int] | None = None,
    between: Callable[[], None] | None = None,
) -> RefTable:
    """Store every ``(name, data)`` of ``named`` with the guarantees of `BlobStore.put_bytes`
    (a blob is durable before it is visible, the first writer of a digest wins) and one fsync
    pass per `BATCH_FILES` blobs; their refs by name as a compact `RefTable` (a name given
    twice keeps its last blob). ``places``: each name's place in ``named`` as the caller
    already holds it (a dataset's ids); the table shares it when it matches (checked) rather
    than holding a mapping of its own. ``between`` is called before each batch is written:
    it may raise to stop a long table early (the batches written before stay stored)."""
    names: list[str] = []

    def datas() -> Iterator[bytes]:
        for name, data in named:
            names.append(name)
            yield data

    digests, sizes = bytearray(), array("q")
    for digest, size in _put_each(store, datas(), between):
        digests += digest
        sizes.append(size)
    at: Mapping[str, int]
    if places is not None and _places_match(places, names):
        at = places
    else:
        at = {name: index for index, name in enumerate(names)}
    return RefTable(at, bytes(digests), sizes, media_type)


def _places_match(places: Mapping[str, int], names: list[str]) -> bool:
    """Whether ``places`` gives each of ``names`` its place (so no name comes twice)."""
    return len(places) == len(names) and all(
        places.get(name) == index for index, name in enumerate(names)
    )


def _put_each(
    store: BlobStore, datas: Iterable[bytes], between: Callable[[], None] | None
) -> Iterator[tuple[bytes, int]]:
    """Each blob's raw sha256 digest and size, in order, storing the new ones a batch at a
    time (``between`` called before each, and every `BATCH_FILES` blobs read). The last
    batch is written only when this is exhausted: exhaust it before using anything it gave."""
    pending: dict[str, bytes] = {}  # digest -> data, new in this batch
    for read, data in enumerate(datas, 1):
        if between is not None and read % BATCH_FILES == 0:
            between()  # also while every blob is stored already: hashing 100,000 takes time
        raw = hashlib.sha256(data).digest()
        digest = _DIGEST + raw.hex()
        if digest not in pending and not store.has(digest):
            pending[digest] = data
        if len(pending) >= BATCH_FILES:
            if between is not None:
                between()
            _write_batch(store, pending)
            pending = {}
        yield raw, len(data)
    if pending:
        if between is not None:
            between()
        _write_batch(store, pending)


def _write_batch(store: BlobStore, blobs: dict[str, bytes]) -> None:
    """Write ``blobs`` to temp files, fsync them, link each into place, fsync the folders."""
    store.tmp.mkdir(parents=True, exist_ok=True)
    temps: list[tuple[Path, Path]] = []  # (temp file, final path)
    try:
        for digest, data in blobs.items():
            fd, name = tempfile.mkstemp(dir=store.tmp, prefix="blob-", suffix=".tmp")
            temps.append((Path(name), store.path_of(digest)))
            try:
                write_all(fd, data)
                os.fchmod(fd, 0o444)
            finally:
                os.close(fd)
        _sync_files([temp for temp, _ in temps], store.tmp)
        folders: set[Path] = set()
        new_parents: set[Path] = set()
        for temp, final in temps:
            if not final.parent.is_dir():
                final.parent.mkdir(parents=True, exist_ok=True)
                new_parents.add(final.parent.parent)
            if publish(temp, final):
                folders.add(final.parent)
        if not _syncfs(store.objects):
            for folder in sorted(folders) + sorted(new_parents):
                fsync_dir(folder)
    except OSError as error:
        raise with_path(error, store.tmp) from None
    finally:
        for temp, _ in temps:
            with contextlib.suppress(FileNotFoundError):
                temp.unlink()


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may write less than it was given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _syncfs(anywhere: Path) -> bool:
    """Flush the whole filesystem holding ``anywhere`` in one call (Linux ``syncfs``: every
    file's data and every folder's entries written so far); False where there is none."""
    if _LIBC is None:
        return False
    fd = os.open(anywhere, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _LIBC.syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(anywhere))
    finally:
        os.close(fd)
    return True


def _sync_files(paths: list[Path], folder: Path) -> None:
    """Make the data of ``paths`` (all in ``folder``) durable: one ``syncfs``, else an fsync
    each."""
    if not _syncfs(folder):
        for path in paths:
            _fsync_file(path)


def _load_syncfs() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.syncfs.argtypes = [ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _load_syncfs()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
