"""Directory trees as manifest blobs: snapshot, load, materialize and diff (DESIGN §7).

A manifest maps relative POSIX paths to entries: regular files (digest, normalised mode,
size) and symlinks (target). Directories are implied by the paths, so empty directories
and directory modes are not recorded.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Annotated, Final, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from evolane.messages import ArtifactRef, Digest
from evolane.store._blobs import (
    CHUNK_SIZE,
    BlobStore,
    BlobTooLargeError,
    CorruptBlobError,
    MissingBlobError,
    NotRegularFileError,
    StoreError,
    fsync_dir,
    with_path,
)
from evolane.store._remove import remove_tree
from evolane.store._scan import (
    TreeLimitError,
    TreeLimits,
    TreeScan,
    UnsupportedEntryError,
    scan_tree,
)

TREE_MEDIA_TYPE = "application/vnd.evolane.tree+json"
"""Media type of manifest blobs; a tree ref is the ref of its manifest blob."""

FileMode = Literal[0o644, 0o755]
"""The only recorded modes: any execute bit means 0o755, otherwise 0o644."""
EXECUTABLE_MODE: Final = 0o755
REGULAR_MODE: Final = 0o644


class UnsafeEntryError(StoreError):
    """A manifest entry would write or point outside the materialization root."""


class InvalidManifestError(StoreError):
    """A blob is not a well-formed tree manifest."""


class FileEntry(BaseModel):
    """A regular file: its content blob, normalised mode (0o644 or 0o755) and size."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["file"] = "file"
    digest: Digest
    mode: FileMode
    size: int = Field(ge=0)

    @property
    def executable(self) -> bool:
        """Whether the file is materialized with execute permission."""
        return self.mode == EXECUTABLE_MODE

    @property
    def ref(self) -> ArtifactRef:
        """The content blob as a ref (for `BlobStore.verify` and friends)."""
        return ArtifactRef(digest=self.digest, size=self.size)


class SymlinkEntry(BaseModel):
    """A symbolic link, recorded by its literal target."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    type: Literal["symlink"] = "symlink"
    target: str = Field(min_length=1)


TreeEntry = Annotated[FileEntry | SymlinkEntry, Field(discriminator="type")]
_ENTRIES = TypeAdapter(dict[str, TreeEntry])


class TreeManifest(Mapping[str, FileEntry | SymlinkEntry]):
    """A validated, read-only mapping of safe relative POSIX paths to tree entries."""

    __slots__ = ("_entries",)

    def __init__(self, entries: Mapping[str, FileEntry | SymlinkEntry]) -> None:
        _check_paths(entries)
        self._entries = dict(sorted(entries.items()))

    def __getitem__(self, path: str) -> FileEntry | SymlinkEntry:
        return self._entries[path]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"TreeManifest({len(self._entries)} entries)"

    def to_json(self) -> bytes:
        """The canonical manifest bytes (compact, sorted keys): equal trees, equal bytes."""
        plain = {path: entry.model_dump() for path, entry in self._entries.items()}
        return orjson.dumps(plain, option=orjson.OPT_SORT_KEYS)

    @classmethod
    def from_json(cls, data: bytes) -> TreeManifest:
        """Parse and validate manifest bytes (`InvalidManifestError`, `UnsafeEntryError`)."""
        try:
            entries = _ENTRIES.validate_json(data)
        except ValidationError as exc:
            raise InvalidManifestError(f"not a tree manifest: {exc}") from None
        return cls(entries)


@dataclass(frozen=True, slots=True)
class TreeDiff:
    """Paths that differ between two trees, each tuple sorted."""

    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]

    def __bool__(self) -> bool:
        return bool(self.added or self.removed or self.changed)


@dataclass(frozen=True, slots=True)
class Materialized:
    """What `materialize_tree` did: the final directory and how each file got there."""

    path: Path
    linked: int
    copied: int
    symlinks: int


def _check_paths(entries: Mapping[str, object]) -> None:
    """Refuse absolute, ``..``, non-canonical and overlapping paths."""
    for path in entries:
        pure = PurePosixPath(path)
        if (
            not path
            or pure.is_absolute()
            or ".." in pure.parts
            or pure.as_posix() != path
            or "\0" in path
        ):
            raise UnsafeEntryError(f"unsafe manifest path {path!r}")
        for parent in pure.parents:
            if str(parent) in entries:
                raise UnsafeEntryError(
                    f"manifest path {path!r} lies under another entry {str(parent)!r}"
                )


# -- snapshot -----------------------------------------------------------------------------


def snapshot_tree(
    store: BlobStore,
    directory: Path | str,
    limits: TreeLimits | None = None,
    *,
    contained: bool = False,
    skip: frozenset[str] = frozenset(),
) -> ArtifactRef:
    """Store every file under ``directory`` and return the ref of the resulting manifest.

    The tree is walked within ``limits`` first (`scan_tree`: `TreeLimitError` at the first
    cap passed, before anything is read or stored; entries named in ``skip`` left out), then
    stored (`store_scan`). Symlinks are recorded as they are; with ``contained``, one
    pointing outside the tree (what `materialize_tree` would refuse) raises
    `UnsafeEntryError` before anything is stored."""
    scan = scan_tree(directory, limits, skip=skip)
    if contained:
        check_contained(scan)
    return store_scan(store, scan)


MAX_LINK_HOPS = 40
"""Symlinks the kernel follows in one path (Linux's MAXSYMLINKS): past them it fails (ELOOP),
so a longer chain or a loop leads nowhere, inside or out."""
MAX_LINK_STEPS = 1_000_000
"""Path components the containment check of one tree walks at most, plus `LINK_STEPS` per
link (a replay's output: 1.6 million, about 0.5 s): a tree whose links take more (10,000
chained links of 4 KiB targets: 800 million) is refused."""
LINK_STEPS = 64
"""Path components one link's walk takes on average at most, in a tree evolane accepts (a
link of a real tree takes about 10: its path, one hop, its target)."""


def check_contained(scan: TreeScan) -> None:
    """`UnsafeEntryError` for the first symlink of ``scan`` whose target is absolute, climbs
    above the root, or resolves outside it through the tree's other links; the message
    reads ``symlink 'PATH' points outside the tree (TARGET)``. The links are followed in
    the scan's own map, never on disk (found by hostile review: ``os.path.realpath``
    recursed once per link, so a chain of 1,100 in a replay's output raised RecursionError
    and crashed its lane, and 200 links of long targets took 200 s of evolane's CPU)."""
    links = {found.relative: found.target for found in scan.entries if found.kind == "symlink"}
    outside = _outside_link(links, (found.relative for found in scan.entries))  # bounded
    if outside is None:  # then the targets' words are too: read them as text
        outside = next((p for p, t in links.items() if _lexical_escape(p, t) is not None), None)
    if outside is not None:
        raise UnsafeEntryError(f"symlink {outside!r} points outside the tree ({links[outside]})")


def _outside_link(links: Mapping[str, str], paths: Iterable[str]) -> str | None:
    """The first of ``links`` (path -> target) that resolves outside the tree whose entries
    are ``paths`` through its other links, as the kernel resolves it in a copy of the tree
    (only folders holding an entry); `UnsafeEntryError` past its steps (`MAX_LINK_STEPS`)."""
    folders = {str(parent) for path in paths for parent in PurePosixPath(path).parents}
    left = MAX_LINK_STEPS + LINK_STEPS * len(links)
    for path in links:
        inside, left = _resolves_inside(path, links, folders, left)
        if not inside:
            return path
    return None


def _resolves_inside(
    path: str, links: Mapping[str, str], folders: set[str], left: int
) -> tuple[bool, int]:
    """Whether ``path`` stays below the root as the kernel follows it (True where the kernel
    stops: a missing folder, a file, past `MAX_LINK_HOPS` links), and the steps left."""
    resolved: list[str] = []  # the folders walked into, each as its path from the root
    pending = path.split("/")[::-1]  # the components still to walk, the next one last
    hops = 0
    while pending:
        left -= 1
        if left < 0:
            raise UnsafeEntryError(f"symlink {path!r}: the tree's links take too long to follow")
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            if not resolved:
                return False, left
            resolved.pop()
            continue
        here = f"{resolved[-1]}/{name}" if resolved else name
        target = links.get(here)
        if target is None:
            if here not in folders:  # a file, or nothing: the walk ends here
                return True, left
            resolved.append(here)
            continue
        hops += 1
        if hops > MAX_LINK_HOPS:  # the kernel follows no more (ELOOP): it leads nowhere
            return True, left
        if target.startswith("/"):
            return False, left
        parts = target.split("/")
        left -= len(parts)  # counted as they are met (a 4 KiB target: 2,048 of them)
        pending.extend(reversed(parts))  # relative to the link's own folder
    return True, left


def store_scan(store: BlobStore, scan: TreeScan) -> ArtifactRef:
    """Store the files of a scan and its manifest. Each file is read only if it is still a
    regular file (never through a symlink swapped in since), and never past what is left
    of the scan's byte cap: a file that grew after the walk raises `TreeLimitError`."""
    entries: dict[str, FileEntry | SymlinkEntry] = {}
    left = scan.limits.max_bytes
    for found in scan.entries:
        if found.kind == "symlink":
            entries[found.relative] = SymlinkEntry(target=found.target)
            continue
        try:
            ref = store.put_regular_file(found.path, left)
        except BlobTooLargeError:
            raise TreeLimitError(
                "max_bytes",
                f"over {scan.limits.max_bytes} bytes of files (max_bytes): "
                f"{found.relative!r} grew after the walk",
            ) from None
        except NotRegularFileError as error:
            raise UnsupportedEntryError(f"cannot snapshot {found.path}: {error}") from None
        left -= ref.size
        mode: FileMode = EXECUTABLE_MODE if found.executable else REGULAR_MODE
        entries[found.relative] = FileEntry(digest=ref.digest, mode=mode, size=ref.size)
    return store_manifest(store, TreeManifest(entries))


def store_manifest(store: BlobStore, manifest: TreeManifest) -> ArtifactRef:
    """Store a manifest as a blob; its ref is the tree ref."""
    return store.put_bytes(manifest.to_json(), media_type=TREE_MEDIA_TYPE)


# -- load / diff --------------------------------------------------------------------------


def load_manifest(store: BlobStore, ref: ArtifactRef | str) -> TreeManifest:
    """Read (verifying) and validate the manifest blob of a tree ref."""
    return TreeManifest.from_json(store.read_bytes(ref, verify=True))


def diff_trees(store: BlobStore, a: ArtifactRef | str, b: ArtifactRef | str) -> TreeDiff:
    """Paths added, removed and changed (content, mode, type or target) going from a to b."""
    old, new = load_manifest(store, a), load_manifest(store, b)
    return TreeDiff(
        added=tuple(sorted(new.keys() - old.keys())),
        removed=tuple(sorted(old.keys() - new.keys())),
        changed=tuple(sorted(p for p in old.keys() & new.keys() if old[p] != new[p])),
    )


# -- materialize --------------------------------------------------------------------------


def materialize_tree(
    store: BlobStore,
    ref: ArtifactRef | str,
    destination: Path | str,
    *,
    link: bool = True,
    verify: bool = True,
    durable: bool = True,
    writable: bool = False,
) -> Materialized:
    """Recreate a tree at ``destination`` (absent or empty), all or nothing.

    Non-executable files are hard-linked from the store when possible (they share the
    blob's read-only inode), otherwise copied and made read-only; executables are copied
    with mode 0o555. Symlinks must stay inside the tree. The tree is built in a temp
    sibling directory and renamed into place, so a failure leaves no destination behind.
    Durable (the default), every copied file and every folder of the tree is fsynced
    before the rename and the destination's folder after it, so a power loss leaves the
    tree whole or absent, never with empty files (found by crash review: a proposal's
    ``candidate/`` was renamed in with its copies unsynced). ``durable=False`` skips every
    fsync: for throwaway copies such as workspaces.
    ``writable=True`` (with ``link=False``) leaves copies writable by their owner (0o644,
    0o755): a workspace a command edits.
    """
    destination = Path(destination)
    manifest = load_manifest(store, ref)
    _check_destination(destination)
    _check_symlink_targets(manifest)
    destination.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(dir=destination.parent, prefix=f".{destination.name}.materialize-")
    )
    try:
        linked, copied, symlinks = _populate(
            store, manifest, staging, link=link, verify=verify, writable=writable, durable=durable
        )
        os.chmod(staging, 0o755)
        os.replace(staging, destination)
    except BaseException:
        remove_tree(staging)
        raise
    if durable:
        fsync_dir(destination.parent)
    return Materialized(path=destination, linked=linked, copied=copied, symlinks=symlinks)


def _check_destination(destination: Path) -> None:
    if destination.is_symlink() or (destination.exists() and not destination.is_dir()):
        raise FileExistsError(f"cannot materialize into {destination}: it exists")
    if destination.is_dir() and any(destination.iterdir()):
        raise FileExistsError(f"cannot materialize into {destination}: directory not empty")


def _check_symlink_targets(manifest: TreeManifest) -> None:
    """Absolute targets, targets climbing above the root and links that resolve outside it
    through the tree's other links are refused (before anything is written)."""
    links = {path: e.target for path, e in manifest.items() if isinstance(e, SymlinkEntry)}
    for path, target in links.items():
        problem = _lexical_escape(path, target)
        if problem is not None:
            raise UnsafeEntryError(problem)
    outside = _outside_link(links, manifest.keys())
    if outside is not None:
        raise UnsafeEntryError(f"symlink {outside!r} resolves outside the tree root")


def _lexical_escape(path: str, target: str) -> str | None:
    """Why the symlink at ``path`` -> ``target`` leaves the tree read as text (absolute, or
    climbing above the root), else None."""
    pure = PurePosixPath(target)
    if pure.is_absolute() or "\0" in target:
        return f"symlink {path!r} has an absolute target {target!r}"
    depth = len(PurePosixPath(path).parts) - 1
    for part in pure.parts:
        depth += -1 if part == ".." else 0 if part == "." else 1
        if depth < 0:
            return f"symlink {path!r} -> {target!r} escapes the tree root"
    return None


def _populate(
    store: BlobStore,
    manifest: TreeManifest,
    root: Path,
    *,
    link: bool,
    verify: bool,
    writable: bool,
    durable: bool = False,
) -> tuple[int, int, int]:
    linked = copied = 0
    symlinks: list[tuple[Path, str]] = []
    made: set[str] = set()
    for relative, entry in manifest.items():
        parts = PurePosixPath(relative).parts
        _make_folders(root, parts[:-1], made)
        target = root.joinpath(*parts)
        if isinstance(entry, SymlinkEntry):
            symlinks.append((target, entry.target))
        elif link and not entry.executable and _try_link(store, entry, target, verify=verify):
            linked += 1
        else:
            _copy_blob(store, entry, target, verify=verify, writable=writable, durable=durable)
            copied += 1
    # Symlinks are created last so no file is ever written through one.
    for target, link_target in symlinks:
        os.symlink(link_target, target)
    if durable:  # deepest first: each folder's entries, then the folder's own entry above
        for folder in sorted(made, key=lambda key: -key.count("/")):
            fsync_dir(root.joinpath(*folder.split("/")))
        fsync_dir(root)
    return linked, copied, len(symlinks)


def _make_folders(root: Path, parts: tuple[str, ...], made: set[str]) -> None:
    """Create ``root/parts...`` one level at a time (``Path.mkdir(parents=True)`` recurses
    once per missing level: a tree stored before depths were capped must still go)."""
    for depth in range(1, len(parts) + 1):
        key = "/".join(parts[:depth])
        if key not in made:
            with contextlib.suppress(FileExistsError):
                os.mkdir(root.joinpath(*parts[:depth]))
            made.add(key)


def _try_link(store: BlobStore, entry: FileEntry, target: Path, *, verify: bool) -> bool:
    """Hard-link the blob into place; False when the filesystem refuses (then copy)."""
    try:
        os.link(store.path_of(entry.digest), target)
    except FileNotFoundError:
        raise MissingBlobError(f"blob {entry.digest} is missing from {store.root}") from None
    except OSError as exc:
        if exc.errno in (errno.EXDEV, errno.EPERM, errno.EMLINK):
            return False
        raise
    if verify:
        # Checked after linking so a refused link costs no extra read; same inode either way.
        store.verify(entry.ref)
    return True


def _copy_blob(
    store: BlobStore,
    entry: FileEntry,
    target: Path,
    *,
    verify: bool,
    writable: bool = False,
    durable: bool = False,
) -> None:
    """Copy the blob, hashing as it goes so verification costs no second read; fsync the
    copy when ``durable``."""
    hasher = hashlib.sha256()
    size = 0
    with store.open(entry.digest) as source, target.open("xb") as out:
        while chunk := source.read(CHUNK_SIZE):
            hasher.update(chunk)
            size += len(chunk)
            out.write(chunk)
        if durable:
            out.flush()
            try:
                os.fsync(out.fileno())
            except OSError as error:  # os.fsync names no file: name the copy
                raise with_path(error, target) from None
    if verify and ("sha256:" + hasher.hexdigest() != entry.digest or size != entry.size):
        raise CorruptBlobError(
            f"corrupt blob {entry.digest} at {store.path_of(entry.digest)}: "
            f"copied bytes hash to sha256:{hasher.hexdigest()} ({size} bytes)"
        )
    read_only = 0o555 if entry.executable else 0o444
    os.chmod(target, (read_only | 0o200) if writable else read_only)
