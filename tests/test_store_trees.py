"""Tree manifests: deterministic snapshots, safe all-or-nothing materialization, diffs."""

from __future__ import annotations

import errno
import os
import posixpath
import tempfile
from collections.abc import Mapping
from pathlib import Path

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from evolane.messages import ArtifactRef
from evolane.store import (
    TREE_MEDIA_TYPE,
    BlobStore,
    CorruptBlobError,
    FileEntry,
    InvalidManifestError,
    MissingBlobError,
    SymlinkEntry,
    TreeManifest,
    UnsafeEntryError,
    UnsupportedEntryError,
    diff_trees,
    load_manifest,
    materialize_tree,
    snapshot_tree,
)


def write(root: Path, relative: str, data: bytes, mode: int = 0o644) -> Path:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    path.chmod(mode)
    return path


def raw_manifest(store: BlobStore, entries: Mapping[str, Mapping[str, object]]) -> ArtifactRef:
    """Store a hand-written manifest, bypassing the validation `snapshot_tree` applies."""
    return store.put_bytes(orjson.dumps(dict(entries)), media_type=TREE_MEDIA_TYPE)


def digest_at(manifest: TreeManifest, path: str) -> str:
    entry = manifest[path]
    assert isinstance(entry, FileEntry)
    return entry.digest


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir()) if path.parent.exists() else []


@pytest.fixture
def store(tmp_path: Path) -> BlobStore:
    return BlobStore(tmp_path / "store")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    root = tmp_path / "src"
    write(root, "README.md", b"# readme\n")
    write(root, "pkg/__init__.py", b"")
    write(root, "pkg/core.py", b"def f():\n    return 1\n")
    write(root, "bin/run.sh", b"#!/bin/sh\necho hi\n", 0o755)
    (root / "empty-dir").mkdir()
    (root / "pkg" / "alias.py").symlink_to("core.py")
    return root


# -- snapshot ------------------------------------------------------------------------------


def test_snapshot_records_files_modes_and_symlinks(store: BlobStore, source: Path) -> None:
    ref = snapshot_tree(store, source)
    assert ref.media_type == TREE_MEDIA_TYPE
    manifest = load_manifest(store, ref)

    assert list(manifest) == [
        "README.md",
        "bin/run.sh",
        "pkg/__init__.py",
        "pkg/alias.py",
        "pkg/core.py",
    ]  # the empty directory is not recorded
    core = manifest["pkg/core.py"]
    assert isinstance(core, FileEntry)
    assert store.read_bytes(core.ref) == b"def f():\n    return 1\n"
    assert core.mode == 0o644 and core.size == 22
    assert manifest["bin/run.sh"] == FileEntry(
        digest=digest_at(manifest, "bin/run.sh"), mode=0o755, size=18
    )
    assert manifest["pkg/alias.py"] == SymlinkEntry(target="core.py")
    stored = orjson.loads(store.read_bytes(ref))
    assert stored["pkg/alias.py"] == {"type": "symlink", "target": "core.py"}
    assert stored["README.md"]["type"] == "file"
    assert list(stored) == sorted(stored)


def test_snapshot_is_deterministic_and_normalises_modes(store: BlobStore, tmp_path: Path) -> None:
    first, second = tmp_path / "one", tmp_path / "two"
    write(first, "a/x", b"x", 0o600)
    write(first, "b", b"b", 0o700)
    write(second, "b", b"b", 0o755)  # created in another order, with other modes
    write(second, "a/x", b"x", 0o444)
    (second / "unrecorded").mkdir()
    assert snapshot_tree(store, first) == snapshot_tree(store, second)

    (second / "b").chmod(0o644)
    assert snapshot_tree(store, first) != snapshot_tree(store, second)


def test_snapshot_does_not_follow_directory_symlinks(store: BlobStore, tmp_path: Path) -> None:
    root = tmp_path / "src"
    write(root, "real/f", b"f")
    (root / "linked").symlink_to("real", target_is_directory=True)
    manifest = load_manifest(store, snapshot_tree(store, root))
    assert manifest["linked"] == SymlinkEntry(target="real")
    assert "linked/f" not in manifest


def test_snapshot_refuses_a_fifo(store: BlobStore, tmp_path: Path) -> None:
    root = tmp_path / "src"
    write(root, "ok.txt", b"ok")
    os.mkfifo(root / "sub-pipe")
    with pytest.raises(UnsupportedEntryError, match="sub-pipe"):
        snapshot_tree(store, root)


# -- materialize ---------------------------------------------------------------------------


def test_materialize_links_read_only_and_keeps_exec(
    store: BlobStore, source: Path, tmp_path: Path
) -> None:
    ref = snapshot_tree(store, source)
    manifest = load_manifest(store, ref)
    dest = tmp_path / "out" / "tree"
    result = materialize_tree(store, ref, dest)

    assert result.path == dest and (result.linked, result.copied, result.symlinks) == (3, 1, 1)
    for relative in ("README.md", "pkg/core.py", "pkg/__init__.py"):
        entry = manifest[relative]
        assert isinstance(entry, FileEntry)
        info = (dest / relative).stat()
        assert info.st_ino == store.path_of(entry.digest).stat().st_ino
        assert info.st_nlink > 1
        assert info.st_mode & 0o777 == 0o444
    script = (dest / "bin/run.sh").stat()
    assert script.st_mode & 0o777 == 0o555
    assert script.st_ino != store.path_of(digest_at(manifest, "bin/run.sh")).stat().st_ino
    assert (dest / "bin/run.sh").read_bytes() == b"#!/bin/sh\necho hi\n"
    assert os.readlink(dest / "pkg/alias.py") == "core.py"
    assert (dest / "pkg/alias.py").read_bytes() == (source / "pkg/core.py").read_bytes()
    assert siblings(dest) == ["tree"]
    assert snapshot_tree(store, dest) == ref


def test_materialize_without_links_copies_read_only(
    store: BlobStore, source: Path, tmp_path: Path
) -> None:
    ref = snapshot_tree(store, source)
    dest = tmp_path / "copy"
    result = materialize_tree(store, ref, dest, link=False)
    assert (result.linked, result.copied) == (0, 4)
    info = (dest / "README.md").stat()
    assert info.st_nlink == 1 and info.st_mode & 0o777 == 0o444
    assert (dest / "bin/run.sh").stat().st_mode & 0o777 == 0o555
    assert snapshot_tree(store, dest) == ref


def test_materialize_falls_back_to_copy_across_filesystems(
    store: BlobStore, source: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ref = snapshot_tree(store, source)

    def cross_device(src: object, dst: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", cross_device)
    dest = tmp_path / "other-fs"
    result = materialize_tree(store, ref, dest)
    assert (result.linked, result.copied) == (0, 4)
    assert (dest / "pkg/core.py").stat().st_mode & 0o777 == 0o444
    monkeypatch.undo()
    assert snapshot_tree(store, dest) == ref


def test_materialize_into_empty_dir_but_not_a_full_one(
    store: BlobStore, source: Path, tmp_path: Path
) -> None:
    ref = snapshot_tree(store, source)
    empty = tmp_path / "empty"
    empty.mkdir()
    materialize_tree(store, ref, empty)
    assert (empty / "README.md").exists()
    with pytest.raises(FileExistsError):
        materialize_tree(store, ref, empty)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(FileExistsError):
        materialize_tree(store, ref, blocker)


def test_corrupt_blob_fails_materialization_and_leaves_nothing(
    store: BlobStore, source: Path, tmp_path: Path
) -> None:
    ref = snapshot_tree(store, source)
    manifest = load_manifest(store, ref)
    for link in (True, False):
        for relative in ("pkg/core.py", "bin/run.sh"):  # a linked and a copied file
            digest = digest_at(manifest, relative)
            blob = store.path_of(digest)
            original = blob.read_bytes()
            blob.chmod(0o644)
            blob.write_bytes(original.replace(b"1", b"2").replace(b"hi", b"ho"))
            dest = tmp_path / "out" / f"dest-{link}"
            with pytest.raises(CorruptBlobError, match=digest):
                materialize_tree(store, ref, dest, link=link)
            assert not dest.exists()
            assert siblings(dest) == []
            blob.write_bytes(original)


def test_missing_blob_fails_materialization(store: BlobStore, source: Path, tmp_path: Path) -> None:
    ref = snapshot_tree(store, source)
    store.path_of(digest_at(load_manifest(store, ref), "README.md")).unlink()
    for link in (True, False):
        dest = tmp_path / f"dest-{link}"
        with pytest.raises(MissingBlobError):
            materialize_tree(store, ref, dest, link=link, verify=False)
        assert not dest.exists()


@pytest.mark.parametrize(
    ("link_path", "target"),
    [
        ("escape", "../outside"),
        ("sub/escape", "../../outside"),
        ("sub/escape", "./x/../../.."),
        ("absolute", "/etc/passwd"),
    ],
)
def test_unsafe_symlink_is_refused(
    store: BlobStore, tmp_path: Path, link_path: str, target: str
) -> None:
    root = tmp_path / "src"
    write(root, "sub/ok", b"ok")
    (root / link_path).symlink_to(target)
    ref = snapshot_tree(store, root)  # recorded faithfully, refused on the way out
    dest = tmp_path / "out" / "dest"
    with pytest.raises(UnsafeEntryError, match=link_path):
        materialize_tree(store, ref, dest)
    assert not dest.exists() and siblings(dest) == []


@pytest.mark.parametrize(
    ("link_path", "target"),
    [
        ("shadow", "/etc/shadow"),
        ("root", "/"),
        ("escape", "../outside"),
        ("sub/escape", "../../outside"),
        ("l", "sub/up/../x"),  # lexically inside; through sub/up -> .. it is outside
    ],
)
def test_a_contained_snapshot_refuses_a_symlink_out_of_the_tree_before_storing(
    store: BlobStore, tmp_path: Path, link_path: str, target: str
) -> None:
    root = tmp_path / "src"
    write(root, "sub/ok", b"ok")
    (root / "sub" / "up").symlink_to("..")
    (root / link_path).symlink_to(target)
    blobs = sorted(store.root.rglob("*"))
    with pytest.raises(UnsafeEntryError, match=rf"symlink '{link_path}' points outside the tree"):
        snapshot_tree(store, root, contained=True)
    assert sorted(store.root.rglob("*")) == blobs  # nothing stored


def test_a_contained_snapshot_keeps_symlinks_inside_the_tree(
    store: BlobStore, tmp_path: Path
) -> None:
    root = tmp_path / "src"
    write(root, "sub/ok", b"ok")
    (root / "top").symlink_to("sub/ok")
    (root / "sub" / "up").symlink_to("..")  # the root itself
    (root / "a").symlink_to("b")  # a loop of links inside: nothing escapes
    (root / "b").symlink_to("a")
    manifest = load_manifest(store, snapshot_tree(store, root, contained=True))
    assert manifest["top"] == SymlinkEntry(target="sub/ok")
    assert manifest["sub/up"] == SymlinkEntry(target="..")


def test_unsafe_symlink_is_refused_before_anything_is_written(
    store: BlobStore, tmp_path: Path
) -> None:
    missing = "sha256:" + "0" * 64  # would raise MissingBlobError if it were reached
    ref = raw_manifest(
        store,
        {
            "a.txt": {"type": "file", "digest": missing, "mode": 0o644, "size": 1},
            "z": {"type": "symlink", "target": "../../etc"},
        },
    )
    with pytest.raises(UnsafeEntryError, match="escapes"):
        materialize_tree(store, ref, tmp_path / "out" / "dest")
    assert not (tmp_path / "out").exists()


def test_symlink_chain_escaping_through_another_link_is_refused(
    store: BlobStore, tmp_path: Path
) -> None:
    # x/b -> .. is the root itself; "x/b/../y" looks inside lexically but resolves outside.
    ref = raw_manifest(
        store,
        {
            "x/b": {"type": "symlink", "target": ".."},
            "l": {"type": "symlink", "target": "x/b/../y"},
        },
    )
    dest = tmp_path / "out" / "dest"
    with pytest.raises(UnsafeEntryError, match="'l'"):
        materialize_tree(store, ref, dest)
    assert not dest.exists() and siblings(dest) == []


def test_a_chain_of_links_is_followed_as_far_as_the_kernel_follows_one(
    store: BlobStore, tmp_path: Path
) -> None:
    # Found by hostile review: os.path.realpath recursed once per link, so a replay's
    # output of 1,100 chained links raised RecursionError in the lane that checked it.
    chain = {f"l{i:04d}": {"type": "symlink", "target": f"l{i + 1:04d}"} for i in range(1100)}
    dest = materialize_tree(store, raw_manifest(store, chain), tmp_path / "chain").path
    assert os.readlink(dest / "l0000") == "l0001"  # leads nowhere (ELOOP): harmless
    escaping = {f"e{i:02d}": {"type": "symlink", "target": f"e{i + 1:02d}"} for i in range(20)}
    escaping["e20"] = {"type": "symlink", "target": "d/up/.."}
    escaping["d/up"] = {"type": "symlink", "target": ".."}  # e00 leads out in 22 links
    with pytest.raises(UnsafeEntryError, match="'e00'"):
        materialize_tree(store, raw_manifest(store, escaping), tmp_path / "out")


def test_links_that_take_too_long_to_follow_are_refused(store: BlobStore, tmp_path: Path) -> None:
    # Found by hostile review: each link was followed on disk (realpath), its 4 KiB target
    # component by component at every hop: 200 such links in a replay's output took 200 s
    # of evolane's CPU. The walk is bounded now (MAX_LINK_STEPS) and such a tree refused.
    root = tmp_path / "src"
    write(root, "a/f", b"x")
    for index in range(20):
        (root / f"l{index:02d}").symlink_to("a/../" * 800 + f"l{(index + 1) % 20:02d}")
    with pytest.raises(UnsafeEntryError, match="take too long to follow"):
        snapshot_tree(store, root, contained=True)


@pytest.mark.parametrize("path", ["../evil", "a/../../evil", "/abs", "a//b", "./a", ""])
def test_unsafe_manifest_path_is_refused(store: BlobStore, tmp_path: Path, path: str) -> None:
    blob = store.put_bytes(b"evil")
    entry = {"type": "file", "digest": blob.digest, "mode": 0o644, "size": 4}
    ref = raw_manifest(store, {path: entry})
    with pytest.raises(UnsafeEntryError):
        load_manifest(store, ref)
    with pytest.raises(UnsafeEntryError):
        materialize_tree(store, ref, tmp_path / "dest")
    assert not (tmp_path / "dest").exists()
    assert not (tmp_path / "evil").exists()


def test_overlapping_manifest_paths_are_refused(store: BlobStore) -> None:
    blob = store.put_bytes(b"x")
    entry = {"type": "file", "digest": blob.digest, "mode": 0o644, "size": 1}
    link = {"type": "symlink", "target": "elsewhere"}
    overlapping: list[dict[str, Mapping[str, object]]] = [
        {"a": entry, "a/b": entry},
        {"d": link, "d/f": entry},
    ]
    for entries in overlapping:
        with pytest.raises(UnsafeEntryError, match="under another entry"):
            load_manifest(store, raw_manifest(store, entries))


@pytest.mark.parametrize(
    "entries",
    [
        [1, 2],
        {"f": {"type": "file", "digest": "sha256:00", "mode": 0o644, "size": 1}},
        {"f": {"type": "file", "digest": "sha256:" + "0" * 64, "mode": 0o600, "size": 1}},
        {"f": {"type": "device"}},
    ],
)
def test_malformed_manifest_is_refused(store: BlobStore, entries: object) -> None:
    ref = store.put_bytes(orjson.dumps(entries), media_type=TREE_MEDIA_TYPE)
    with pytest.raises(InvalidManifestError):
        load_manifest(store, ref)


# -- diff ----------------------------------------------------------------------------------


def test_diff_trees(store: BlobStore, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for root in (a, b):
        write(root, "same.txt", b"same")
        write(root, "mode.sh", b"#!/bin/sh\n")
    write(a, "content.txt", b"old")
    write(b, "content.txt", b"new")
    write(a, "gone/old.txt", b"gone")
    write(b, "new/fresh.txt", b"fresh")
    write(b, "z-added.txt", b"z")
    (b / "mode.sh").chmod(0o755)
    write(a, "kind", b"file")
    (b / "kind").symlink_to("same.txt")
    (a / "link").symlink_to("same.txt")
    (b / "link").symlink_to("mode.sh")

    diff = diff_trees(store, snapshot_tree(store, a), snapshot_tree(store, b))
    assert diff.added == ("new/fresh.txt", "z-added.txt")
    assert diff.removed == ("gone/old.txt",)
    assert diff.changed == ("content.txt", "kind", "link", "mode.sh")
    assert diff
    ref = snapshot_tree(store, a)
    assert not diff_trees(store, ref, ref)


# -- property: snapshot -> materialize -> snapshot is the identity on refs -----------------

NAMES = st.sampled_from(["a", "b", "c", "d.txt", "e-f", "ü"])
MODES = st.sampled_from([0o644, 0o600, 0o444, 0o755, 0o700, 0o555])


@st.composite
def trees(draw: st.DrawFn) -> tuple[dict[str, tuple[bytes, int]], dict[str, str]]:
    """Random small trees: nested files with random bytes and modes, maybe a safe symlink."""
    files: dict[tuple[str, ...], tuple[bytes, int]] = {}
    dirs: set[tuple[str, ...]] = set()
    for _ in range(draw(st.integers(0, 8))):
        parts = tuple(draw(st.lists(NAMES, min_size=1, max_size=3)))
        prefixes = [parts[:i] for i in range(1, len(parts))]
        if parts in files or parts in dirs or any(p in files for p in prefixes):
            continue
        files[parts] = (draw(st.binary(max_size=64)), draw(MODES))
        dirs.update(prefixes)
    links: dict[str, str] = {}
    add_link = draw(st.booleans())
    if files and add_link:
        where = (*draw(st.lists(NAMES, max_size=2)), "lnk")
        if not any(where[:i] in files for i in range(1, len(where))):
            target = "/".join(draw(st.sampled_from(sorted(files))))
            start = posixpath.dirname("/".join(where)) or "."
            links["/".join(where)] = posixpath.relpath(target, start)
    return {"/".join(k): v for k, v in files.items()}, links


@settings(max_examples=30, deadline=None)
@given(tree=trees(), link=st.booleans())
def test_snapshot_materialize_round_trip(
    tree: tuple[dict[str, tuple[bytes, int]], dict[str, str]], link: bool
) -> None:
    files, links = tree
    with tempfile.TemporaryDirectory() as scratch:
        base = Path(scratch)
        store = BlobStore(base / "store")
        src = base / "src"
        src.mkdir()
        for relative, (data, mode) in files.items():
            write(src, relative, data, mode)
        for relative, target in links.items():
            (src / relative).parent.mkdir(parents=True, exist_ok=True)
            (src / relative).symlink_to(target)

        ref = snapshot_tree(store, src)
        assert sorted(load_manifest(store, ref)) == sorted([*files, *links])
        dest = base / "dest"
        materialize_tree(store, ref, dest, link=link)
        assert snapshot_tree(store, dest) == ref
        for relative, (data, mode) in files.items():
            assert (dest / relative).read_bytes() == data
            executable = bool((dest / relative).stat().st_mode & 0o111)
            assert executable == bool(mode & 0o111)
        for relative, target in links.items():
            assert os.readlink(dest / relative) == target


def test_a_durable_materialization_fsyncs_every_copy_and_folder_before_its_rename(
    store: BlobStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by crash review (strace of a run): a proposal's ``candidate/`` copies were
    renamed into place unsynced, so a power loss could leave them empty."""
    source = tmp_path / "src"
    for relative in ("a.txt", "deep/er/b.txt", "deep/c.sh"):
        write(source, relative, relative.encode(), 0o755 if relative.endswith(".sh") else 0o644)
    ref = snapshot_tree(store, source)
    synced: set[int] = set()
    real = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.add(os.fstat(fd).st_ino), real(fd)))
    out = tmp_path / "out"
    materialize_tree(store, ref, out, link=False)
    made = [out, *(p for p in out.rglob("*"))]
    assert {p.stat().st_ino for p in made} <= synced

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError) as caught:  # one line naming the copy, never the store root
        materialize_tree(store, ref, tmp_path / "again", link=False)
    assert caught.value.filename is not None and "again" in caught.value.filename
