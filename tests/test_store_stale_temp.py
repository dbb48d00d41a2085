"""Found by review: a runtime killed while it wrote a blob left its temp file in
``objects/tmp`` for ever (a spooled capture's can be large): `BlobStore.remove_stale_temp`
existed but nothing called it. Opening a sandbox host on the store (every run does) now
removes temp files untouched for an hour; a live writer's fresh file stays."""

from __future__ import annotations

import os
import time
from pathlib import Path

import trio

from evolane.sandbox import open_sandbox
from evolane.store import BlobStore


async def test_opening_a_host_removes_a_killed_writers_temp_files(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    store.tmp.mkdir(parents=True)
    stale, fresh, folder = (store.tmp / name for name in ("blob-a.tmp", "blob-b.tmp", "x"))
    stale.write_bytes(b"half a blob")
    fresh.write_bytes(b"being written")
    folder.mkdir()  # not a writer's temp file: left alone, and no crash
    hours_ago = time.time() - 2 * 3600
    for old in (stale, folder):
        os.utime(old, (hours_ago, hours_ago))
    with trio.fail_after(60):
        async with open_sandbox(tmp_path / "sandbox", store=store):
            pass
    assert not stale.exists()
    assert fresh.exists() and folder.is_dir()
