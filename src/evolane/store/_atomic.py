"""Crash-safe whole-file writes: temp file in the same directory, fsync, rename, fsync dir."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel

from evolane.store._blobs import deferred_blobs, fsync_dir, sync_deferred, with_path

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


def write_json_atomic(path: Path | str, value: Any) -> None:
    """Atomically write ``value`` as JSON; it is serialised first, so a failure touches nothing."""
    write_bytes_atomic(path, dump_json(value))


def read_json(path: Path | str) -> Any:
    """Parse a JSON file written by `write_json_atomic` (or any JSON file)."""
    return orjson.loads(Path(path).read_bytes())
