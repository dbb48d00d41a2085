"""Crash-safe whole-file writes: temp file in the same directory, fsync, rename, fsync dir."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from evolane.store._blobs import (
    BlobTooLargeError,
    NotRegularFileError,
    StoreError,
    deferred_blobs,
    fsync_dir,
    read_regular_file,
    sync_deferred,
    with_path,
)


class UnreadableRecordError(StoreError, ValueError):
    """A file evolane wrote (a JSON record, a journal) cannot be what it wrote: it is not a
    regular file or it is larger than any such file can be. The message is one line naming
    the file; a ``ValueError`` too, so readers that refuse a malformed record refuse it."""


MAX_JSON_BYTES = 256 * 1024 * 1024
"""Largest JSON record `read_json` reads. The biggest evolane writes is a ``report.json``,
whose lists are capped (100,000 entries of well under 1 KiB each); ``run.json``,
``campaign.json`` and ``job.json`` are kilobytes to a few megabytes."""

JSON_OPTIONS = orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS | orjson.OPT_APPEND_NEWLINE
"""How state files are rendered: stable key order and diff-friendly indentation."""


def json_default(value: Any) -> Any:
    """orjson fallback that renders nested pydantic models in JSON mode."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def dump_json(value: Any) -> bytes:
    """Render a pydantic model or any orjson-serialisable value as indented, key-sorted JSON."""
    if isinstance(value, BaseModel):
        value = value.model_dump(mode="json")
    return orjson.dumps(value, default=json_default, option=JSON_OPTIONS)


def make_folders_durable(folder: Path | str) -> None:
    """Make ``folder`` and any missing folder above it, fsyncing the parent of each one
    made, so a file made durable inside is reachable after a power loss (found by crash
    review: a new run's folder, and a new store's ``runs/``, were never fsynced into their
    parents; only the files inside them were)."""
    folder = Path(folder)
    missing: list[Path] = []
    while not folder.is_dir():
        missing.append(folder)
        if folder.parent == folder:
            break
        folder = folder.parent
    for made in reversed(missing):
        try:
            with contextlib.suppress(FileExistsError):  # made meanwhile by another writer
                made.mkdir()
        except OSError as error:
            raise with_path(error, made) from None
        fsync_dir(made.parent)


def write_bytes_atomic(path: Path | str, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that readers and crashes see the old or new file whole."""
    path = Path(path)
    if deferred_blobs():  # nothing durable may name a blob that is not
        sync_deferred()
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
            out.flush()
            os.fchmod(out.fileno(), 0o644)
            os.fsync(out.fileno())
        os.replace(tmp_name, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp_name)
        if isinstance(error, OSError):
            raise with_path(error, path) from None
        raise
    fsync_dir(path.parent)


_TEMP_NAME = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")
"""The name `write_bytes_atomic` gives its temp file: ``.<name>.<8 random>.tmp``."""


def atomic_temps(folder: Path | str) -> list[Path]:
    """The temp files `write_bytes_atomic` left in ``folder`` (``.<name>.<8 random>.tmp``):
    a kill came between their creation and their rename (a crash leaves them for good)."""
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return []
    return [
        Path(entry.path)
        for entry in entries
        if _TEMP_NAME.fullmatch(entry.name) and entry.is_file(follow_symlinks=False)
    ]


def remove_atomic_temps(*folders: Path | str) -> int:
    """Remove the `atomic_temps` of ``folders``; only for folders the caller alone writes
    (a resumed run's own, under its target's lock). Returns how many went."""
    removed = 0
    for folder in folders:
        for path in atomic_temps(folder):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed


def write_json_atomic(path: Path | str, value: Any) -> None:
    """Atomically write ``value`` as JSON; it is serialised first, so a failure touches nothing."""
    write_bytes_atomic(path, dump_json(value))


def read_json(path: Path | str, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Parse a JSON file written by `write_json_atomic` (or any JSON file) of at most
    ``max_bytes``. A symlink is followed; a FIFO, device or folder is never waited on nor
    read, and it or a larger file is `UnreadableRecordError` (a ``ValueError``: one line
    naming the file). ``FileNotFoundError`` and other ``OSError`` as usual; bad JSON is
    ``orjson.JSONDecodeError`` (a ``ValueError``)."""
    try:
        data = read_regular_file(path, max_bytes, follow_symlinks=True)
    except NotRegularFileError as error:
        raise UnreadableRecordError(str(error)) from None
    except BlobTooLargeError:
        raise UnreadableRecordError(
            f"{path} holds more than {max_bytes // (1024 * 1024)} MiB: not a record evolane wrote"
        ) from None
    return orjson.loads(data)


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``'s ``.lock`` sibling (made, with its folder,
    when missing) for a read-modify-write of ``path`` shared by processes. Blocking."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
