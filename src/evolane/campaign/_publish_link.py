"""Tree-atomic publish for a target that is a symlink to a version folder.

The common layout ``app/current -> releases/v3``: a reader that resolves ``current`` once (a
``realpath``, a ``chdir`` or an open folder) reads one version, whole. A publish never
writes into that version. Its steps, each journaled by the caller
(`evolane.campaign._apply`) before the next:

1. `plan_link` (with `evolane.campaign._publish.plan_publish` on the current version):
   refuse unless every path the diff touches still holds the parent's version; name the new
   version folder ``<version>.evolane-<token>`` beside the current one.
2. `build`: make the new version folder: every entry of the current one (files and symlinks
   hard-linked, a copy with the same mode, owner and times where a link is impossible;
   folders made with their modes, owners and times; version-control metadata and every
   entry a snapshot ignores included), then the diff applied by unlinking each touched path
   and writing a new file in its place. A hard-linked file is never written or chmodded:
   the current version's files stay exactly as they are.
3. The post-apply check runs against the new version folder, before anything a reader sees
   changes: a failing check removes it, and the link never moved.
4. `switch`: check the link still points where it did, the touched paths of the current
   version are unchanged and every other entry of it is in the new version as it is (a file
   added or saved atomically meanwhile would vanish at the swap: refused), make a symlink
   to the new version under a temp name beside the link and rename it over the link
   (atomic). What changes between that comparison and the rename (microseconds) is not
   seen.

`restore_link` undoes any prefix: the link is swapped back if it points to the new version,
the temp link and the new version folder are removed. After a commit `prune` keeps the new
version and the one before it (for a rollback by hand) and removes the older version folders
a publish made (named ``*.evolane-<token>`` beside them) unless a symlink beside the link
points to one; version folders the user made are never removed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import stat
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from evolane.campaign._files import keep_original, remove_path, set_owner
from evolane.campaign._publish import (
    FolderTime,
    PublishPlan,
    TargetChanged,
    is_the_original,
    location,
    plan_publish,
    write_new,
)
from evolane.campaign._target import link_version
from evolane.messages import ArtifactRef, Record
from evolane.store import BlobStore, fsync_dir

_PathText = Annotated[str, Field(min_length=1, max_length=4096)]
_MADE = re.compile(r"\.evolane-[0-9a-f]{8,32}$")
"""The end of a version folder's name that a publish made."""


class LinkPlan(Record):
    """A publish into a new version folder, then a swap of the link (journaled first)."""

    layout: Literal["link"] = "link"
    link: _PathText
    """The target: the symlink itself."""
    old_text: _PathText
    """What the link pointed to (its text) when the publish was planned."""
    new_text: _PathText
    old_version: _PathText
    """The version folder the link pointed to (absolute, not resolved further)."""
    new_version: _PathText
    temp_link: _PathText
    diff: PublishPlan
    """The paths to publish, planned against the current version (``root``)."""
    times: tuple[FolderTime, ...] = ()
    """The link itself, its folder and the versions' folder as they were (reset on undo)."""


def plan_link(
    store: BlobStore, target: Path, parent_ref: ArtifactRef, candidate_ref: ArtifactRef, token: str
) -> LinkPlan | str:
    """The plan of publishing parent -> candidate as a new version of the link ``target``,
    or why the target moved on since the run began."""
    version = link_version(target)
    assert version is not None
    name = f"{_MADE.sub('', version.name)[:100]}.evolane-{token}"
    diff = plan_publish(
        store, version, parent_ref, candidate_ref, token=token, stash=version.parent / name
    )
    if isinstance(diff, str):
        return diff
    old_text = os.readlink(target)
    times = [target, target.parent, version.parent]
    return LinkPlan(
        times=tuple(_times(path) for path in dict.fromkeys(times)),
        link=str(target),
        old_text=old_text,
        new_text=os.path.join(os.path.dirname(os.path.normpath(old_text)), name),
        old_version=str(version),
        new_version=str(version.parent / name),
        temp_link=str(target.parent / f".{target.name[:100]}.evolane-{token}"),
        diff=diff,
    )


def _times(path: Path) -> FolderTime:
    info = os.lstat(path)
    return FolderTime(path=str(path), atime_ns=info.st_atime_ns, mtime_ns=info.st_mtime_ns)


def build(store: BlobStore, plan: LinkPlan) -> None:
    """Make the new version folder: the current one's entries, then the diff applied."""
    new = Path(plan.new_version)
    remove_path(new)
    folders = _replicate(Path(plan.old_version), new)
    for op in plan.diff.ops:
        where = location(new, op.path)
        if op.original is not None:
            os.unlink(where)  # the hard link goes; the current version's file stays
        if op.new is None:
            continue
        where.parent.mkdir(parents=True, exist_ok=True)
        write_new(store, op, where)
    for folder, info in reversed(folders):  # deepest first; a read-only mode only now
        fsync_dir(folder)
        os.chmod(folder, stat.S_IMODE(info.st_mode))
        os.utime(folder, ns=(info.st_atime_ns, info.st_mtime_ns))
    fsync_dir(new.parent)
    _check_unchanged(plan)


def _replicate(old: Path, new: Path) -> list[tuple[Path, os.stat_result]]:
    """Every entry of ``old`` into ``new`` (files and symlinks as `keep_original` keeps
    them); the folders made, shallowest first, with the stat their times come from."""
    folders: list[tuple[Path, os.stat_result]] = []
    pending = [(old, new)]
    while pending:
        source, made = pending.pop()
        info = os.lstat(source)
        made.mkdir(mode=0o700)  # its own mode once filled (`build`)
        set_owner(made, (info.st_uid, info.st_gid))
        folders.append((made, info))
        with os.scandir(source) as listing:
            for entry in listing:
                mode = entry.stat(follow_symlinks=False).st_mode
                if stat.S_ISDIR(mode):
                    pending.append((Path(entry.path), made / entry.name))
                elif stat.S_ISREG(mode) or stat.S_ISLNK(mode):
                    keep_original(Path(entry.path), made / entry.name)
                else:
                    raise OSError(f"{entry.path}: neither a file, a symlink nor a folder")
    return folders


def _check_unchanged(plan: LinkPlan) -> None:
    for op in plan.diff.ops:
        where = location(Path(plan.old_version), op.path)
        if op.original is None:
            if os.path.lexists(where):
                raise TargetChanged(f"{op.path!r} appeared in the target during the publish")
        elif not is_the_original(where, op.original):
            raise TargetChanged(f"{op.path!r} was changed in the target during the publish")


def _check_untouched(plan: LinkPlan) -> None:
    """`TargetChanged` unless every entry of the current version that the diff does not
    touch is in the new version as it is: the same names in every folder (but the touched
    paths and the folders that hold them), each file and symlink the same inode (a hard
    link) or, for a copy, of the same kind, size, mtime, mode and owner, each folder of the
    same mode and owner. Found by review: a file added to the current version while the new
    one was built or checked, or replaced there by an atomic save (temp + rename), was not
    in the new one and vanished from the link at the swap (kept only in the previous
    folder). Walked iteratively, never following a symlink; a listing of the current
    version is read no further than its new counterpart's names and the diff's could reach
    (the new version is the bound: the build made it)."""
    touched = {op.path for op in plan.diff.ops}
    above = {path.rsplit("/", up)[0] for path in touched for up in range(1, path.count("/") + 1)}
    _check_same(plan, "", live=True, new=True)
    pending: list[tuple[str, bool]] = [("", True)]  # (folder, whether the current one has it)
    while pending:
        folder, live = pending.pop()
        new_names = set(os.listdir(Path(plan.new_version, folder)))  # made by `build`
        cap = len(new_names) + len(touched) + len(above)  # what a current folder can hold
        old_names = _names(Path(plan.old_version, folder), cap) if live else set()
        if old_names is None:
            raise _changed(f"{folder or '.'!r} gained entries or is no longer a folder")
        for name in sorted(old_names | new_names):
            path = f"{folder}/{name}" if folder else name
            in_old, in_new = name in old_names, name in new_names
            if path in touched:
                continue
            if path not in above or (in_old and in_new):  # a folder made for added files
                _check_same(plan, path, live=in_old, new=in_new)
            if stat.S_ISDIR(os.lstat(Path(plan.new_version, path)).st_mode):
                pending.append((path, in_old))


def _names(folder: Path, cap: int) -> set[str] | None:
    """The names in the current version's ``folder``, never through a symlink (an empty set
    for a missing one; None past ``cap`` or for a folder that is no longer one)."""
    try:
        handle = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return set()
    except OSError as error:
        if error.errno in (errno.ENOTDIR, errno.ELOOP):
            return None
        raise
    names: set[str] = set()
    try:
        with os.scandir(handle) as listing:
            for entry in listing:
                names.add(entry.name)
                if len(names) > cap:
                    return None
    finally:
        os.close(handle)
    return names


def _check_same(plan: LinkPlan, path: str, *, live: bool, new: bool) -> None:
    """`TargetChanged` unless ``path`` (untouched by the diff) is in the new version as it
    is in the current one."""
    if not new:
        raise _changed(f"{path!r} appeared in the target")
    if not live:
        why = "removed from the target, or written there by the check"
        raise _changed(f"{path!r} is in the new version only ({why})")
    try:
        old_info = os.lstat(Path(plan.old_version, path))
    except FileNotFoundError:  # removed since its folder was listed
        raise _changed(f"{path!r} was removed from the target") from None
    new_info = os.lstat(Path(plan.new_version, path))
    kind = stat.S_IFMT(old_info.st_mode)
    if kind != stat.S_IFMT(new_info.st_mode):
        raise _changed(f"{path or '.'!r} was replaced in the target")
    if stat.S_ISDIR(kind):
        fields = ("st_mode", "st_uid", "st_gid")
    elif (old_info.st_dev, old_info.st_ino) == (new_info.st_dev, new_info.st_ino):
        return  # the very file: an in-place edit is shared
    else:
        fields = ("st_size", "st_mtime_ns", "st_mode", "st_uid", "st_gid")
    if any(getattr(old_info, field) != getattr(new_info, field) for field in fields):
        raise _changed(f"{path or '.'!r} was replaced in the target")


def _changed(what: str) -> TargetChanged:
    return TargetChanged(f"the target changed during the publish: {what}")


def switch(plan: LinkPlan) -> None:
    """Point the link at the new version, atomically; `TargetChanged` if the link or the
    current version changed meanwhile (a touched path, or anything else the new version
    would then not hold as it is: `_check_untouched`)."""
    link = Path(plan.link)
    if not link.is_symlink() or os.readlink(link) != plan.old_text:
        raise TargetChanged(f"the symlink {link} was changed during the publish")
    _check_unchanged(plan)
    _check_untouched(plan)
    _point(link, Path(plan.temp_link), plan.new_text)


def _point(link: Path, temp: Path, text: str) -> None:
    info = os.lstat(link)
    remove_path(temp)
    os.symlink(text, temp)
    set_owner(temp, (info.st_uid, info.st_gid))
    os.rename(temp, link)
    fsync_dir(link.parent)


def restore_link(plan: LinkPlan) -> None:
    """Undo whatever part of the publish happened: the link back, the new version gone."""
    link = Path(plan.link)
    back = link.is_symlink() and os.readlink(link) == plan.new_text
    if back:
        _point(link, Path(plan.temp_link), plan.old_text)
    clean_link(plan)
    remove_path(Path(plan.new_version))
    fsync_dir(Path(plan.new_version).parent)
    for times in plan.times:  # the link (if swapped back here), then its folders
        if times.path == plan.link and not back:
            continue  # the link never moved, or someone else's link stands
        with contextlib.suppress(OSError):  # gone, or a folder that refuses writes
            stamp = (times.atime_ns, times.mtime_ns)
            os.utime(times.path, ns=stamp, follow_symlinks=False)


def clean_link(plan: LinkPlan) -> None:
    """Remove the temp link (after a commit, or as part of a restore)."""
    remove_path(Path(plan.temp_link))


def prune(plan: LinkPlan) -> None:
    """Remove the version folders a publish made before the previous one (see the module
    docstring); a folder that cannot be removed stays."""
    keep = {Path(plan.new_version).name, Path(plan.old_version).name}
    link_folder = Path(plan.link).parent
    pointed = set()
    for entry in os.scandir(link_folder):
        if entry.is_symlink():
            pointed.add(os.path.realpath(entry.path))
    versions = Path(plan.new_version).parent
    for entry in os.scandir(versions):
        made = _MADE.search(entry.name) and entry.is_dir(follow_symlinks=False)
        if made and entry.name not in keep and os.path.realpath(entry.path) not in pointed:
            try:
                remove_path(Path(entry.path))
            except OSError:
                continue
