"""Blob store: round trips, corruption detection and concurrent writers (threads, processes)."""

from __future__ import annotations

import errno
import hashlib
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from evolane.messages import ArtifactRef
from evolane.store import (
    BlobStore,
    CorruptBlobError,
    InvalidDigestError,
    MissingBlobError,
    NotRegularFileError,
    StoreError,
    open_below,
    read_regular_file,
)

MB = 1024 * 1024


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def blob_files(store: BlobStore) -> list[Path]:
    return sorted(p for p in store.objects.rglob("*") if p.is_file())


def tmp_files(store: BlobStore) -> list[Path]:
    return sorted(store.tmp.iterdir()) if store.tmp.exists() else []


def test_put_bytes_round_trip(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = b"hello evolane\n" * 100
    ref = store.put_bytes(data, media_type="text/plain")

    assert ref == ArtifactRef(digest=sha(data), size=len(data), media_type="text/plain")
    hex_digest = ref.digest.removeprefix("sha256:")
    assert store.path_of(ref) == tmp_path / "objects" / "sha256" / hex_digest[:2] / hex_digest
    assert store.has(ref) and store.has(ref.digest)
    assert store.read_bytes(ref) == data
    with store.open(ref) as blob:
        assert blob.read() == data
    store.verify(ref)
    assert store.path_of(ref).stat().st_mode & 0o777 == 0o444
    assert tmp_files(store) == []


def test_same_content_same_ref_and_one_file(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    first = store.put_bytes(b"same")
    second = store.put_bytes(b"same")
    streamed = store.put_stream([b"sa", b"", b"me"])
    other = store.put_bytes(b"other")

    assert first == second == streamed
    assert other.digest != first.digest
    assert len(blob_files(store)) == 2


def test_put_stream_and_put_file_equal_put_bytes(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    data = random.Random(7).randbytes(3 * MB + 17)
    source = tmp_path / "payload.bin"
    source.write_bytes(data)

    chunks = (data[i : i + 100_000] for i in range(0, len(data), 100_000))
    streamed = store.put_stream(chunks)
    from_file = store.put_file(source)
    from_bytes = store.put_bytes(data)

    assert streamed == from_file == from_bytes
    assert streamed.digest == sha(data) and streamed.size == len(data)
    assert store.read_bytes(streamed) == data


def test_empty_blob(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    ref = store.put_stream([])
    assert ref.size == 0 and ref.digest == sha(b"")
    assert store.read_bytes(ref) == b""


def test_missing_blob(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    ref = ArtifactRef(digest=sha(b"never stored"), size=12)
    assert not store.has(ref)
    with pytest.raises(MissingBlobError, match=ref.digest):
        store.open(ref)
    with pytest.raises(MissingBlobError):
        store.read_bytes(ref)
    with pytest.raises(MissingBlobError):
        store.verify(ref)
    assert issubclass(MissingBlobError, StoreError)


@pytest.mark.parametrize("digest", ["sha256:../../etc/passwd", "sha256:" + "A" * 64, "md5:00"])
def test_bad_digest_never_maps_to_a_path(tmp_path: Path, digest: str) -> None:
    store = BlobStore(tmp_path)
    with pytest.raises(InvalidDigestError):
        store.path_of(digest)
    with pytest.raises(InvalidDigestError):
        store.has(digest)


def corrupt(store: BlobStore, ref: ArtifactRef, new_content: bytes) -> Path:
    """Rewrite a stored blob in place (as a disk fault or a stray writer would)."""
    path = store.path_of(ref)
    path.chmod(0o644)
    path.write_bytes(new_content)
    return path


@pytest.mark.parametrize("damage", ["flip", "truncate", "extend"])
def test_altered_blob_is_detected(tmp_path: Path, damage: str) -> None:
    store = BlobStore(tmp_path)
    data = bytes(range(256)) * 40
    ref = store.put_bytes(data)
    altered = {
        "flip": data[:100] + bytes([data[100] ^ 1]) + data[101:],
        "truncate": data[:-1],
        "extend": data + b"!",
    }[damage]
    path = corrupt(store, ref, altered)

    with pytest.raises(CorruptBlobError) as caught:
        store.verify(ref)
    assert ref.digest in str(caught.value) and str(path) in str(caught.value)
    with pytest.raises(CorruptBlobError):
        store.read_bytes(ref)
    with pytest.raises(CorruptBlobError):
        store.verify(ref.digest)
    assert store.read_bytes(ref, verify=False) == altered


def test_ref_with_wrong_size_is_corrupt(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    ref = store.put_bytes(b"12345")
    lying = ArtifactRef(digest=ref.digest, size=6)
    with pytest.raises(CorruptBlobError, match="size"):
        store.verify(lying)
    with pytest.raises(CorruptBlobError):
        store.read_bytes(lying)


def test_existing_blob_is_never_replaced(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    ref = store.put_bytes(b"immutable")
    inode = store.path_of(ref).stat().st_ino
    store.put_stream([b"immutable"])
    assert store.path_of(ref).stat().st_ino == inode
    assert tmp_files(store) == []


def test_remove_stale_temp(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    store.tmp.mkdir(parents=True)
    stale, fresh = store.tmp / "blob-stale.tmp", store.tmp / "blob-fresh.tmp"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"y")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    assert store.remove_stale_temp(3600) == 1
    assert tmp_files(store) == [fresh]


# -- concurrency ---------------------------------------------------------------------------

WRITER = """
import os, random, sys, time
from pathlib import Path
from evolane.store import BlobStore

root, ready, go, seed = sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])
common = random.Random(0).randbytes(5 * 1024 * 1024)
other = random.Random(seed).randbytes(1024 * 1024)
store = BlobStore(root)
ready.touch()
deadline = time.monotonic() + 30
while not os.path.exists(go):
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.001)
step = 256 * 1024
first = store.put_stream(common[i : i + step] for i in range(0, len(common), step))
second = store.put_stream([other])
print(first.digest, second.digest)
"""

READER = """
import os, sys, time
from pathlib import Path

path, size, ready, go = Path(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
ready.touch()
deadline = time.monotonic() + 30
while time.monotonic() < deadline:
    try:
        seen = path.stat().st_size
    except FileNotFoundError:
        time.sleep(0.0005)
        continue
    if seen != size:
        print("partial blob visible:", seen)
        sys.exit(1)
    sys.exit(0)
sys.exit(4)
"""


def _wait_all(procs: list[subprocess.Popen[str]], timeout: float) -> list[tuple[int, str, str]]:
    deadline = time.monotonic() + timeout
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=max(0.1, deadline - time.monotonic()))
        results.append((proc.returncode, out, err))
    return results


def test_concurrent_writers_across_processes(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "store")
    common = random.Random(0).randbytes(5 * MB)
    common_digest = sha(common)
    seeds = [1 + i % 3 for i in range(8)]
    others = {seed: sha(random.Random(seed).randbytes(MB)) for seed in set(seeds)}
    go = tmp_path / "go"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    procs: list[subprocess.Popen[str]] = []
    try:
        reader_args = [str(store.path_of(common_digest)), str(len(common))]
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", READER, *reader_args, str(tmp_path / "ready-r"), str(go)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
            )
        )
        for i, seed in enumerate(seeds):
            args = [str(store.root), str(tmp_path / f"ready-{i}"), str(go), str(seed)]
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-c", WRITER, *args],
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    env=env,
                )
            )
        deadline = time.monotonic() + 30
        while len(list(tmp_path.glob("ready-*"))) < len(procs):
            assert time.monotonic() < deadline, "child processes never became ready"
            assert all(p.poll() is None for p in procs), "a child exited before the start"
            time.sleep(0.005)
        go.touch()
        results = _wait_all(procs, timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()

    for code, out, err in results:
        assert code == 0, (out, err)
    for seed, (_, out, _) in zip(seeds, results[1:], strict=True):
        assert out.split() == [common_digest, others[seed]]
    assert blob_files(store) == sorted(store.path_of(d) for d in {common_digest, *others.values()})
    assert store.read_bytes(common_digest) == common
    assert tmp_files(store) == []


async def test_concurrent_writers_across_threads(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = random.Random(3).randbytes(2 * MB)
    chunks = [data[i : i + 65536] for i in range(0, len(data), 65536)]
    refs: list[ArtifactRef] = []

    async def write() -> None:
        refs.append(await trio.to_thread.run_sync(store.put_stream, chunks))

    async with trio.open_nursery() as nursery:
        for _ in range(8):
            nursery.start_soon(write)

    assert len(refs) == 8 and len(set(refs)) == 1
    assert refs[0].digest == sha(data)
    assert blob_files(store) == [store.path_of(refs[0])]
    assert tmp_files(store) == []
    store.verify(refs[0])


JSON_TYPE = "application/json"


def test_put_table_stores_a_batch_like_put_bytes(tmp_path: Path) -> None:
    from evolane.store import put_table
    from evolane.store._batch import BATCH_FILES

    store = BlobStore(tmp_path / "s")
    first = store.put_bytes(b"already there", media_type="application/json")
    items = [(f"case {i % (BATCH_FILES + 40)}".encode(), "application/json") for i in range(1200)]
    items.append((b"already there", "application/json"))
    table = put_table(store, ((str(i), data) for i, (data, _) in enumerate(items)), JSON_TYPE)
    refs = [table[str(i)] for i in range(len(items))]
    assert len(refs) == len(items) and refs[-1] == first
    for (data, media_type), ref in zip(items, refs, strict=True):
        assert ref == ArtifactRef(digest=sha(data), size=len(data), media_type=media_type)
        assert store.read_bytes(ref) == data
        assert not os.stat(store.path_of(ref)).st_mode & 0o222  # read-only like every blob
    assert not list(store.tmp.iterdir())  # no temp file left behind


@pytest.mark.parametrize("code", [errno.EPERM, errno.ENOTSUP, errno.EMLINK])
def test_a_filesystem_without_hard_links_still_places_each_blob_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """Where ``link`` is refused, one by one and in a batch, a blob is placed by a rename;
    an existing blob is still never replaced, and no temp file is left."""
    from evolane.store import put_table

    def no_links(source: object, target: object) -> None:
        raise OSError(code, os.strerror(code))

    store = BlobStore(tmp_path / "s")
    kept = store.put_bytes(b"before")  # placed with a link, before links are refused
    inode = store.path_of(kept).stat().st_ino
    monkeypatch.setattr(os, "link", no_links)
    one = store.put_bytes(b"one")
    assert store.read_bytes(one) == b"one" and store.put_bytes(b"one") == one
    rows = [(f"r{i}", f"row {i % 7}".encode()) for i in range(20)] + [("old", b"before")]
    table = put_table(store, rows, JSON_TYPE)
    for name, data in rows:
        assert store.read_bytes(table[name]) == data
    assert store.path_of(kept).stat().st_ino == inode  # never replaced
    assert not list(store.tmp.iterdir())


def test_without_hard_links_a_blob_placed_meanwhile_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A racing writer placed the blob after this one checked: the rename must not replace it."""
    from evolane.store._blobs import publish

    def no_links(source: object, target: object) -> None:
        raise OSError(errno.EPERM, "no hard links here")

    monkeypatch.setattr(os, "link", no_links)
    final, temp = tmp_path / "blob", tmp_path / "temp"
    final.write_bytes(b"first")
    temp.write_bytes(b"second")
    inode = final.stat().st_ino
    assert publish(temp, final) is False
    assert final.stat().st_ino == inode and temp.exists()
    assert publish(temp, tmp_path / "new") is True
    assert (tmp_path / "new").read_bytes() == b"second" and not temp.exists()


def test_open_below_follows_no_symlink_under_its_folder(tmp_path: Path) -> None:
    unit, elsewhere = tmp_path / "unit", tmp_path / "elsewhere"
    (unit / "out").mkdir(parents=True)
    elsewhere.mkdir()
    (elsewhere / "usage.json").write_text("secret")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL
    os.close(open_below(unit, "out/output.json", flags))  # a plain folder: created there
    assert (unit / "out" / "output.json").exists()
    (unit / "out").rename(unit / "kept")
    (unit / "out").symlink_to(elsewhere)  # a folder swapped for a link: refused
    with pytest.raises(OSError):
        open_below(unit, "out/output.json", flags)
    with pytest.raises((OSError, NotRegularFileError)):
        read_regular_file(unit / "out" / "usage.json", 100, below=unit)
    assert read_regular_file(unit / "out" / "usage.json", 100) == b"secret"  # without below
    (unit / "kept" / "link").symlink_to(elsewhere / "usage.json")  # and the last step
    with pytest.raises(NotRegularFileError):
        read_regular_file(unit / "kept" / "link", 100, below=unit)
    assert sorted(p.name for p in elsewhere.iterdir()) == ["usage.json"]


def test_a_failing_folder_fsync_names_the_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by crash review (EIO injected at the fsync of a proposal's folder): the run's one
    error line named the store's root, since ``os.fsync`` names no file."""
    from evolane.store import fsync_dir

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError) as caught:
        fsync_dir(tmp_path)
    assert caught.value.errno == errno.EIO and caught.value.filename == str(tmp_path)
