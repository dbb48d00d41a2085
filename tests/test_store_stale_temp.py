"""Found by review: a runtime killed while it wrote a blob left its temp file in
``objects/tmp`` for ever (a spooled capture's can be large): `BlobStore.remove_stale_temp`
existed but nothing called it. Opening a sandbox host on the store (every run does) now
removes temp files untouched for an hour; a live writer's fresh file stays. The
optimizer's context folder is made there too (it was made under the system's /tmp, where a
killed runtime left one for ever: found by review), and a stale one goes the same way."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.sandbox import open_sandbox
from evolane.store import BlobStore


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
