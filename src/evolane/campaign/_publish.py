"""Faithful publish: the candidate's diff applied to the target, one path at a time.

A publish touches only the paths that differ between the parent tree (what the run started
from) and the candidate. Everything else in the target stays as it is: other files with
their modes, owners and times, empty folders, entries a snapshot does not record. The steps,
each journaled by the caller (`evolane.campaign._apply`) before the next:

1. `plan_publish`: refuse unless every path the diff touches still holds the parent's
   version (an added path must not exist yet), so a user's concurrent edit is never
   overwritten; record each original's mode, owner, mtime and inode, and the times of the
   folders that will change.
2. `back_up`: hard-link every original into a stash folder beside the target (a copy with
   the same mode, owner and times where a link is impossible).
3. `stage`: write each new file to a temp file in the stash, with its final mode and owner,
   fsynced (folders a new file needs are made here). So a reader of the target never sees a
   temp name (a loader globbing the target read them, found by review). Where a rename from
   the stash into the target would cross a filesystem (the target, or a folder in it, is a
   mount point), each temp is written beside its path instead, under a hidden name.
4. `swap`, path by path: check the path is still the original, then rename the temp over
   it (atomic: a reader sees the old or the new file, never part of one), or unlink it.

`restore` undoes any prefix of these steps, whatever the journal says: a path that holds
what the publish put there gets its original back (the stashed inode itself, so content,
mode, owner and mtime; from the store with the recorded mode, owner and mtime if the stash
is gone), a path that does not is left alone; temps, the stash and the folders made are
removed and the touched folders' times reset.

Modes and owners, precisely: a changed file keeps the target's owner and group (where the
process may set them: as root, or when they are its own) and the target's permission bits,
except that the candidate's executable bit wins: made executable, it gains ``x`` wherever
the target's mode has ``r``; made non-executable, it loses every ``x``. Set-id and sticky
bits are dropped with the old content (as a write would). An added file gets the
candidate's mode (0644 or 0755) and the process's owner. Folders are never removed: one
that a removal leaves empty stays. A diff that turns a file into a folder or a folder into
a file is refused (publish that proposal by hand).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Annotated, Final, Literal

from pydantic import Field

from evolane.campaign._files import (
    copy_verified,
    file_digest,
    fsync_folders,
    keep_original,
    remove_path,
    set_owner,
)
from evolane.messages import ArtifactRef, Record
from evolane.store import (
    MAX_TREE_FILES,
    BlobStore,
    FileEntry,
    SymlinkEntry,
    TreeEntry,
    fsync_dir,
    load_manifest,
)

MAX_OPS: Final = 2 * MAX_TREE_FILES
"""Paths one publish may touch (every file of a parent and of a candidate)."""
_Relative = Annotated[str, Field(max_length=4096)]
_PathText = Annotated[str, Field(min_length=1, max_length=4096)]
_Mode = Annotated[int, Field(ge=0, le=0o7777)]


class TargetChanged(Exception):
    """A path the publish touches was changed by someone else after the publish began."""


class Original(Record):
    """A touched path as the target held it when the publish was planned."""

    entry: TreeEntry
    """The parent's entry, which the path was checked to hold."""
    mode: _Mode
    uid: int = Field(ge=0)
    gid: int = Field(ge=0)
    mtime_ns: int
    inode: int = Field(ge=0)
    size: int = Field(ge=0)


class PublishOp(Record):
    """One path of the diff and what the publish does to it."""

    path: _Relative
    action: Literal["add", "change", "remove"]
    original: Original | None = None
    """None for an added path."""
    new: TreeEntry | None = None
    """The candidate's entry; None for a removed path."""
    mode: _Mode | None = None
    """The mode the new file gets (see the module docstring); None for a symlink."""


class FolderTime(Record):
    """A folder whose entries the publish changes, and its times before (reset on undo)."""

    path: _Relative
    """Relative to the publish root; empty for the root itself."""
    atime_ns: int
    mtime_ns: int


class PublishPlan(Record):
    """Everything a publish does and what undoing it needs, journaled before it starts."""

    root: _PathText
    """The folder the paths are relative to: the target, or a file target's folder."""
    stash: _PathText
    """Where the originals are kept during the publish: a hidden folder beside the target."""
    token: Annotated[str, Field(pattern=r"^[0-9a-f]{8,32}$")]
    """Names this publish's temp files."""
    staging: Literal["stash", "beside"] = "beside"
    """Where the new versions are staged: in the stash (out of a reader's sight), or beside
    each path under a hidden name (a target on another filesystem than the stash, and every
    journal of earlier versions)."""
    ops: Annotated[tuple[PublishOp, ...], Field(max_length=MAX_OPS)]
    made_folders: Annotated[tuple[_Relative, ...], Field(max_length=MAX_OPS)] = ()
    """Folders the added files need, shallowest first."""
    folders: Annotated[tuple[FolderTime, ...], Field(max_length=MAX_OPS)] = ()


# -- plan ---------------------------------------------------------------------------------


def plan_publish(
    store: BlobStore,
    root: Path,
    parent_ref: ArtifactRef,
    candidate_ref: ArtifactRef,
    *,
    token: str,
    stash: Path,
) -> PublishPlan | str:
    """The plan of publishing parent -> candidate under ``root``, or why it is refused (the
    target moved on since the run began: a touched path no longer holds the parent's
    version, or an added one exists). Reads the target; writes nothing."""
    parent, candidate = load_manifest(store, parent_ref), load_manifest(store, candidate_ref)
    ops: list[PublishOp] = []
    made: list[str] = []
    folders: dict[str, FolderTime] = {}
    for path in sorted(parent.keys() | candidate.keys()):
        old, new = parent.get(path), candidate.get(path)
        if old == new:
            continue
        missing, problem = _folders_of(root, path, parent)
        if problem is None and missing and old is not None:
            problem = f"{path!r} is gone from the target since the run began"
        if problem is not None:
            return problem
        made.extend(folder for folder in missing if folder not in made)
        existing = str(PurePosixPath(missing[0]).parent) if missing else _folder(path)
        _note_times(root, "" if existing == "." else existing, folders)
        op = _op(location(root, path), path, old, new)
        if isinstance(op, str):
            return op
        ops.append(op)
    devices = {os.stat(location(root, times.path)).st_dev for times in folders.values()}
    return PublishPlan(
        root=str(root),
        stash=str(stash),
        token=token,
        staging="stash" if devices <= {os.stat(stash.parent).st_dev} else "beside",
        ops=tuple(ops),
        made_folders=tuple(made),
        folders=tuple(folders.values()),
    )


def _op(where: Path, path: str, old: TreeEntry | None, new: TreeEntry | None) -> PublishOp | str:
    """One path's op, or why the target's version of it forbids publishing."""
    if old is None:
        if os.path.isdir(where) and not os.path.islink(where):
            return f"the candidate replaces the folder {path!r} with a file; publish it by hand"
        if os.path.lexists(where):
            return f"{path!r} was added to the target since the run began"
        mode = new.mode if isinstance(new, FileEntry) else None
        return PublishOp(path=path, action="add", new=new, mode=mode)
    original = _original(where, old)
    if original is None:
        return f"{path!r} changed in the target since the run began"
    mode = published_mode(original, new) if isinstance(new, FileEntry) else None
    action: Literal["change", "remove"] = "remove" if new is None else "change"
    return PublishOp(path=path, action=action, original=original, new=new, mode=mode)


def published_mode(original: Original, new: FileEntry) -> int:
    """The mode a changed file gets: the target's permission bits, except that the
    candidate's executable bit wins (see the module docstring)."""
    if not isinstance(original.entry, FileEntry):
        return new.mode
    mode = original.mode & 0o777
    if new.executable == original.entry.executable:
        return mode
    return mode | ((mode & 0o444) >> 2) if new.executable else mode & ~0o111


def _folders_of(
    root: Path, path: str, parent: Mapping[str, TreeEntry]
) -> tuple[list[str], str | None]:
    """The folders above ``path`` (below ``root``) that do not exist, and a refusal if one
    that exists is not a real folder (a symlink could lead the publish out of the target):
    the candidate's doing when the ``parent`` tree has that file or symlink too (found by
    review: that was said to be a change of the target since the run began)."""
    missing: list[str] = []
    for folder in reversed(PurePosixPath(path).parents[:-1]):
        if missing:
            missing.append(str(folder))
            continue
        try:
            info = os.lstat(location(root, str(folder)))
        except FileNotFoundError:
            missing.append(str(folder))
            continue
        if not stat.S_ISDIR(info.st_mode):
            if str(folder) in parent:
                why = f"the candidate replaces {str(folder)!r} (a file or a symlink) with a folder"
                return [], f"{why}; publish it by hand"
            return (
                [],
                f"{str(folder)!r} in the target became a file or a symlink since the run began",
            )
    return missing, None


def _original(where: Path, entry: TreeEntry) -> Original | None:
    """What ``where`` holds if it is still ``entry`` (content, type, executable bit)."""
    try:
        info = os.lstat(where)
    except FileNotFoundError:
        return None
    if isinstance(entry, SymlinkEntry):
        if not stat.S_ISLNK(info.st_mode) or os.readlink(where) != entry.target:
            return None
    elif (
        not stat.S_ISREG(info.st_mode)
        or info.st_size != entry.size
        or bool(info.st_mode & 0o111) != entry.executable
        or file_digest(where) != entry.digest
    ):
        return None
    return Original(
        entry=entry,
        mode=stat.S_IMODE(info.st_mode),
        uid=info.st_uid,
        gid=info.st_gid,
        mtime_ns=info.st_mtime_ns,
        inode=info.st_ino,
        size=info.st_size,
    )


def _note_times(root: Path, folder: str, folders: dict[str, FolderTime]) -> None:
    if folder not in folders:
        info = os.stat(location(root, folder))
        folders[folder] = FolderTime(
            path=folder, atime_ns=info.st_atime_ns, mtime_ns=info.st_mtime_ns
        )


# -- the steps ----------------------------------------------------------------------------


def back_up(plan: PublishPlan) -> None:
    """Keep every original that the publish changes or removes in the stash."""
    stash = Path(plan.stash)
    stash.mkdir(mode=0o700, exist_ok=True)
    for index, op in enumerate(plan.ops):
        if op.original is not None:
            keep_original(location(Path(plan.root), op.path), stash / str(index))
    fsync_dir(stash.parent)


def stage(store: BlobStore, plan: PublishPlan) -> None:
    """Write every new file and symlink to its temp path, with its final mode and owner."""
    root = Path(plan.root)
    Path(plan.stash).mkdir(mode=0o700, exist_ok=True)
    for folder in plan.made_folders:
        location(root, folder).mkdir(exist_ok=True)
    touched: set[Path] = set()
    for index, op in enumerate(plan.ops):
        if op.new is None:
            continue
        temp = temp_path(plan, index)
        remove_path(temp)
        write_new(store, op, temp)
        touched.add(temp.parent)
    for folder in sorted(touched):
        fsync_dir(folder)


def write_new(store: BlobStore, op: PublishOp, where: Path) -> None:
    """Write ``op``'s new file (verified against its digest) or symlink at ``where``, with
    its final mode and the original's owner."""
    assert op.new is not None
    owner = None if op.original is None else (op.original.uid, op.original.gid)
    if isinstance(op.new, FileEntry):
        assert op.mode is not None
        copy_verified(store, op.new, where, op.mode, owner)
    else:
        os.symlink(op.new.target, where)
        if owner is not None:
            set_owner(where, owner)


def swap(plan: PublishPlan, index: int) -> None:
    """Put one path's new version in place (or remove it); `TargetChanged` if the path no
    longer holds what the plan found there."""
    op = plan.ops[index]
    where = location(Path(plan.root), op.path)
    if op.original is None:
        if os.path.lexists(where):
            raise TargetChanged(f"{op.path!r} appeared in the target during the publish")
    elif not is_the_original(where, op.original):
        raise TargetChanged(f"{op.path!r} was changed in the target during the publish")
    if op.new is None:
        os.unlink(where)
    else:
        os.rename(temp_path(plan, index), where)
    fsync_dir(where.parent)


def restore(store: BlobStore, plan: PublishPlan) -> None:
    """Undo whatever part of the publish happened (see the module docstring), then clean."""
    root = Path(plan.root)
    for index, op in enumerate(plan.ops):
        where = location(root, op.path)
        if not _published(where, op):
            continue
        if op.original is None:
            os.unlink(where)
        else:
            _put_back(store, plan, index, where, op.original)
        fsync_dir(where.parent)
    clean(plan)
    for folder in reversed(plan.made_folders):
        try:
            location(root, folder).rmdir()
        except OSError:
            continue  # not empty (someone else's file) or already gone
    for times in plan.folders:
        try:
            os.utime(location(root, times.path), ns=(times.atime_ns, times.mtime_ns))
        except OSError:  # gone; or a target that refuses writes (read-only, immutable), which
            continue  # refused the publish too: its times are its own (found by review)


def clean(plan: PublishPlan) -> None:
    """Remove the temp files and the stash (after a commit, or as the end of a restore)."""
    folders = {Path(plan.stash).parent}
    for index in range(len(plan.ops)):
        temp = temp_path(plan, index)
        remove_path(temp)
        folders.add(temp.parent)
    remove_path(Path(plan.stash))
    fsync_folders(folders)


def _published(where: Path, op: PublishOp) -> bool:
    """Whether ``where`` shows this op's effect: the candidate's version, or nothing for a
    removal. Anything else (the original, or someone's edit) is not the publish's to undo."""
    if op.original is not None and is_the_original(where, op.original):
        return False
    if op.new is None:
        return not os.path.lexists(where)
    try:
        info = os.lstat(where)
    except FileNotFoundError:
        return False
    if isinstance(op.new, SymlinkEntry):
        return stat.S_ISLNK(info.st_mode) and os.readlink(where) == op.new.target
    return (
        stat.S_ISREG(info.st_mode)
        and info.st_size == op.new.size
        and file_digest(where) == op.new.digest
    )


def _put_back(
    store: BlobStore, plan: PublishPlan, index: int, where: Path, original: Original
) -> None:
    """The original back at ``where``: the stashed one, else rewritten from the store."""
    kept = Path(plan.stash) / str(index)
    where.parent.mkdir(parents=True, exist_ok=True)
    if os.path.lexists(kept):
        os.replace(kept, where)
        return
    temp = temp_path(plan, index)
    temp.parent.mkdir(mode=0o700, exist_ok=True)  # the stash, if staged there
    remove_path(temp)
    owner = (original.uid, original.gid)
    if isinstance(original.entry, FileEntry):
        copy_verified(store, original.entry, temp, original.mode, owner)
    else:
        os.symlink(original.entry.target, temp)
        set_owner(temp, owner)
    times = (original.mtime_ns, original.mtime_ns)
    os.utime(temp, ns=times, follow_symlinks=False)
    os.replace(temp, where)


def is_the_original(where: Path, original: Original) -> bool:
    """Whether ``where`` is still the very entry the plan found (inode, size, mtime)."""
    try:
        info = os.lstat(where)
    except FileNotFoundError:
        return False
    return (info.st_ino, info.st_size, info.st_mtime_ns) == (
        original.inode,
        original.size,
        original.mtime_ns,
    )


def location(root: Path, relative: str) -> Path:
    """A manifest path (or "" for the root) under ``root``."""
    return root.joinpath(*PurePosixPath(relative).parts) if relative else root


def temp_path(plan: PublishPlan, index: int) -> Path:
    """Where op ``index`` stages its new version: in the stash, or a hidden file beside
    the path (`PublishPlan.staging`)."""
    if plan.staging == "stash":
        return Path(plan.stash) / f"new-{index}"
    where = location(Path(plan.root), plan.ops[index].path)
    return where.with_name(f".{where.name[:80]}.evolane-{plan.token}-{index}")


def _folder(path: str) -> str:
    return str(PurePosixPath(path).parent)


def touched_entries(plan: PublishPlan) -> dict[str, TreeEntry]:
    """The originals of the paths the publish changes or removes (what undoing it restores)."""
    return {op.path: op.original.entry for op in plan.ops if op.original is not None}
