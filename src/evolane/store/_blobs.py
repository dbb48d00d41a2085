"""Content-addressed immutable blobs under ``<root>/objects/sha256/<ab>/<hex>`` (DESIGN §7)."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import re
import stat
import tempfile
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import BinaryIO

from evolane.messages import ArtifactRef
from evolane.store._remove import remove_tree

DEFAULT_MEDIA_TYPE = "application/octet-stream"
"""Media type given to blobs stored without one."""

CHUNK_SIZE = 1024 * 1024
"""Read and hash granularity: large blobs are never held in memory whole."""

_DIGEST_RE = re.compile(r"^sha256:([0-9a-f]{64})$")

BlobId = ArtifactRef | str
"""Either an `ArtifactRef` or its bare ``sha256:<hex>`` digest."""


class StoreError(Exception):
    """Base of every error raised by the durable store."""


class InvalidDigestError(StoreError, ValueError):
    """A digest string is not ``sha256:`` followed by 64 lowercase hex digits."""


class MissingBlobError(StoreError, FileNotFoundError):
    """The blob a ref points to is not in the store."""


class CorruptBlobError(StoreError):
    """A stored blob's bytes no longer hash to its digest (or its size differs)."""


class BlobTooLargeError(StoreError):
    """A capped read met more bytes than its cap (nothing was stored)."""


class NotRegularFileError(StoreError):
    """A path to be stored or read is not a regular file: ``what`` it is (`describe_mode`)."""

    def __init__(self, path: Path | str, what: str) -> None:
        super().__init__(f"{path} is {what}, not a regular file")
        self.what = what


_KINDS = {
    stat.S_IFREG: "a regular file",
    stat.S_IFDIR: "a directory",
    stat.S_IFLNK: "a symlink",
    stat.S_IFIFO: "a FIFO",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


def describe_mode(mode: int) -> str:
    """What a file of ``mode`` (``st_mode``) is, in a few words: ``a FIFO``, ``a directory``."""
    return _KINDS.get(stat.S_IFMT(mode), "not a regular file")


def digest_hex(blob: BlobId) -> str:
    """The 64 hex digits of a ref or digest; validated so it can never escape the store."""
    digest = blob.digest if isinstance(blob, ArtifactRef) else blob
    match = _DIGEST_RE.match(digest)
    if match is None:
        raise InvalidDigestError(f"not a sha256 digest: {digest!r}")
    return match.group(1)


def with_path(error: OSError, path: os.PathLike[str] | str) -> OSError:
    """``error`` naming ``path`` when it names no file (``os.write`` and ``os.fsync`` do
    not), so a full disk is reported with the file that could not be written."""
    if error.filename is not None or error.errno is None:
        return error
    named = OSError(error.errno, error.strerror, os.fspath(path))
    named.__cause__ = error
    return named


def fsync_dir(directory: Path) -> None:
    """Flush a directory's entries so a rename or link into it survives a crash."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    except OSError as error:  # os.fsync names no file: name the directory (crash review)
        raise with_path(error, directory) from None
    finally:
        os.close(fd)


def publish(temp: Path, final: Path) -> bool:
    """Publish the complete file ``temp`` at ``final`` unless a blob is there (a hard link:
    the first writer wins; without hard links a rename, as atomic: a racer's bytes are the
    same); whether it was placed. FileNotFoundError when ``final``'s folder is missing."""
    try:
        os.link(temp, final)
    except FileExistsError:
        return False
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EMLINK):
            raise
        if final.exists():
            return False
        os.replace(temp, final)
    return True


class _Deferred:
    """Blobs stored without their fsync (`BlobStore.deferring`), process-wide, until
    `sync_deferred` flushes them: the files, then the folders their links were made in."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files: list[Path] = []
        self.folders: set[Path] = set()

    def add(self, path: Path, folders: tuple[Path, ...]) -> None:
        with self.lock:
            self.files.append(path)
            self.folders.update(folders)

    def take(self) -> tuple[list[Path], set[Path]]:
        with self.lock:
            files, folders = self.files, self.folders
            self.files, self.folders = [], set()
            return files, folders


_DEFERRED = _Deferred()


def sync_deferred() -> int:
    """Make every blob this process stored with a deferred fsync durable (blocking I/O): the
    group commit of a journal calls it before the fsync that makes records naming them count,
    and every durable store write calls it first, so nothing durable names a blob that is not.
    Returns how many blobs it flushed."""
    files, folders = _DEFERRED.take()
    try:
        for path in files:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        for folder in sorted(folders, key=lambda p: -len(p.parts)):  # leaves before parents
            fsync_dir(folder)
    except BaseException:
        with _DEFERRED.lock:  # not flushed: the next sync tries again
            _DEFERRED.files[:0] = files
            _DEFERRED.folders.update(folders)
        raise
    return len(files)


def deferred_blobs() -> int:
    """How many stored blobs still wait for `sync_deferred`."""
    with _DEFERRED.lock:
        return len(_DEFERRED.files)


class BlobStore:
    """Immutable blobs addressed by SHA-256; safe under concurrent writers (threads, processes).

    Writers stream into a unique temp file in ``objects/tmp``, fsync it, make it read-only
    and hard-link it into place (the first writer wins): readers never see a partial blob.
    """

    def __init__(self, root: Path | str, *, deferred: bool = False) -> None:
        self.root = Path(root)
        self.objects = self.root / "objects" / "sha256"
        self.tmp = self.root / "objects" / "tmp"
        self.deferred = deferred
        """Whether new blobs skip their fsync until `sync_deferred` (a group commit) runs."""

    def __repr__(self) -> str:
        return f"BlobStore({str(self.root)!r})"

    def deferring(self) -> BlobStore:
        """This store, writing new blobs without an fsync each: `sync_deferred` (called by a
        journal's group commit and by every durable write) makes them durable in one pass."""
        return BlobStore(self.root, deferred=True)

    def _durable(self) -> None:
        """Before a durable write or answer: flush the blobs whose fsync was deferred."""
        if not self.deferred and _DEFERRED.files:
            sync_deferred()

    # -- writing -------------------------------------------------------------------------

    def put_bytes(self, data: bytes, *, media_type: str = DEFAULT_MEDIA_TYPE) -> ArtifactRef:
        """Store ``data`` (skipping the write when the blob is already present)."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        self._durable()
        if self.has(digest):
            return ArtifactRef(digest=digest, size=len(data), media_type=media_type)
        return self.put_stream([data], media_type=media_type)

    def stored(self, data: bytes, *, media_type: str = DEFAULT_MEDIA_TYPE) -> ArtifactRef | None:
        """The ref of ``data`` when the store already holds it (one ``stat``: cheap enough
        for an event loop), else None; `put_bytes` stores it."""
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        flushed = self.deferred or not _DEFERRED.files  # nothing to flush first (`_durable`)
        if flushed and self.has(digest):
            return ArtifactRef(digest=digest, size=len(data), media_type=media_type)
        return None

    def put_file(self, path: Path | str, *, media_type: str = DEFAULT_MEDIA_TYPE) -> ArtifactRef:
        """Store a file's content; it is hashed first so already-stored content costs no write."""
        with Path(path).open("rb") as source:
            return self._put_source(source, media_type, None)

    def put_regular_file(
        self, path: Path | str, max_bytes: int, *, media_type: str = DEFAULT_MEDIA_TYPE
    ) -> ArtifactRef:
        """Store the regular file at ``path`` (a command wrote), reading at most ``max_bytes``
        of it. A symlink is never followed, a FIFO never waited on (`NotRegularFileError`);
        a file holding more raises `BlobTooLargeError` before anything is stored."""
        with open_regular_file(path) as source:
            if os.fstat(source.fileno()).st_size < CHUNK_SIZE:  # small: read once, unbuffered
                data = _read_fd(source.fileno(), max_bytes)
                if len(data) <= CHUNK_SIZE:
                    return self.put_bytes(data, media_type=media_type)
                source.seek(0)  # it grew meanwhile: stream it
            return self._put_source(source, media_type, max_bytes)

    def _put_source(self, source: BinaryIO, media_type: str, max_bytes: int | None) -> ArtifactRef:
        hasher = hashlib.sha256()
        size = 0
        for chunk in _read_chunks(source, max_bytes):
            hasher.update(chunk)
            size += len(chunk)
        digest = "sha256:" + hasher.hexdigest()
        self._durable()
        if self.has(digest):
            return ArtifactRef(digest=digest, size=size, media_type=media_type)
        source.seek(0)
        # The ref is taken from this second read, so a file that changed meanwhile is
        # still stored under the digest of the bytes actually written.
        return self.put_stream(_read_chunks(source, max_bytes), media_type=media_type)

    def put_stream(
        self, chunks: Iterable[bytes], *, media_type: str = DEFAULT_MEDIA_TYPE
    ) -> ArtifactRef:
        """Store a stream of byte chunks, hashing while writing; memory use is one chunk."""
        try:
            fd, tmp_name = tempfile.mkstemp(dir=self.tmp, prefix="blob-", suffix=".tmp")
        except FileNotFoundError:  # the store's first blob
            self.tmp.mkdir(parents=True, exist_ok=True)
            fd, tmp_name = tempfile.mkstemp(dir=self.tmp, prefix="blob-", suffix=".tmp")
        tmp_path = Path(tmp_name)
        try:
            hasher = hashlib.sha256()
            size = 0
            with os.fdopen(fd, "wb") as out:
                for chunk in chunks:
                    hasher.update(chunk)
                    size += len(chunk)
                    out.write(chunk)
                out.flush()
                if not self.deferred:
                    os.fsync(out.fileno())
                os.fchmod(out.fileno(), 0o444)
            digest = "sha256:" + hasher.hexdigest()
            self._durable()
            self._place(tmp_path, self.path_of(digest))
        except OSError as error:
            raise with_path(error, tmp_path) from None
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp_path.unlink()
        return ArtifactRef(digest=digest, size=size, media_type=media_type)

    def _place(self, tmp_path: Path, final: Path) -> None:
        """Publish a complete temp file at ``final`` unless a blob is already there."""
        parent = final.parent
        created = False
        try:
            placed = publish(tmp_path, final)
        except FileNotFoundError:  # the first blob of its folder
            created = not parent.is_dir()
            parent.mkdir(parents=True, exist_ok=True)
            placed = publish(tmp_path, final)
        if not placed:
            return
        folders = (parent, parent.parent) if created else (parent,)
        if self.deferred:
            _DEFERRED.add(final, folders)
            return
        for folder in folders:
            fsync_dir(folder)

    def remove_stale_temp(self, max_age_seconds: float = 3600.0) -> int:
        """Delete temp files and folders (an optimizer's context) abandoned by crashed
        writers (untouched for ``max_age_seconds``: a live writer's are fresh); how many."""
        if not self.tmp.is_dir():
            return 0
        cutoff = time.time() - max_age_seconds
        removed = 0
        for entry in os.scandir(self.tmp):
            with contextlib.suppress(OSError):  # gone meanwhile
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    removed += remove_tree(entry.path)
        return removed

    # -- reading -------------------------------------------------------------------------

    def path_of(self, blob: BlobId) -> Path:
        """Where the blob lives (whether or not it exists); never outside the store."""
        hex_digest = digest_hex(blob)
        return self.objects / hex_digest[:2] / hex_digest

    def has(self, blob: BlobId) -> bool:
        """Whether the blob is present (its content is not checked; see `verify`)."""
        return self.path_of(blob).is_file()

    def open(self, blob: BlobId) -> BinaryIO:
        """Open the blob for binary reading; the caller closes it. A FIFO, device or folder
        in its place is `CorruptBlobError` (never waited on)."""
        fd = self._open_fd(blob)
        return os.fdopen(fd, "rb")

    def _open_fd(self, blob: BlobId) -> int:
        """A descriptor of the blob's regular file (`MissingBlobError`, `CorruptBlobError`)."""
        where, digest = self.path_of(blob), _digest(blob)
        try:
            return _regular_fd(where, follow_symlinks=True)
        except FileNotFoundError:
            raise MissingBlobError(f"blob {digest} is missing (expected at {where})") from None
        except NotRegularFileError as error:
            message = f"corrupt blob {digest} at {where}: {error.what}, not a file"
            raise CorruptBlobError(message) from None
        except OSError as error:
            raise with_path(error, where) from None

    def read_bytes(self, blob: BlobId, *, verify: bool = True) -> bytes:
        """The blob's content, checked against its digest and size (a ref's caps the read)."""
        fd = self._open_fd(blob)  # unbuffered: open, fstat, read, close (one read if small)
        try:
            data = _read_fd(fd, blob.size if verify and isinstance(blob, ArtifactRef) else None)
        except OSError as error:
            raise with_path(error, self.path_of(blob)) from None
        except BlobTooLargeError:
            raise CorruptBlobError(f"corrupt blob {self.path_of(blob)}: over its size") from None
        finally:
            os.close(fd)
        if verify:
            actual = "sha256:" + hashlib.sha256(data).hexdigest()
            self._check(blob, actual, len(data))
        return data

    def verify(self, blob: BlobId) -> None:
        """Re-hash the stored bytes; raise `CorruptBlobError` if they do not match the ref."""
        hasher = hashlib.sha256()
        size = 0
        with self.open(blob) as source:
            for chunk in _read_chunks(source):
                hasher.update(chunk)
                size += len(chunk)
        self._check(blob, "sha256:" + hasher.hexdigest(), size)

    def _check(self, blob: BlobId, actual_digest: str, actual_size: int) -> None:
        expected = _digest(blob)
        path = self.path_of(blob)
        if actual_digest != expected:
            raise CorruptBlobError(
                f"corrupt blob {expected} at {path}: its bytes hash to {actual_digest}"
            )
        if isinstance(blob, ArtifactRef) and blob.size != actual_size:
            raise CorruptBlobError(
                f"corrupt blob {expected} at {path}: size {actual_size}, ref says {blob.size}"
            )


def read_at_most(source: BinaryIO, limit: int) -> bytes:
    """At most ``limit + 1`` bytes of ``source`` (one more than ``limit`` says it holds more),
    asking its size first: ``read(limit + 1)`` alone allocates the whole limit for any file."""
    try:
        size = os.fstat(source.fileno()).st_size
    except (OSError, ValueError):  # no descriptor (an in-memory stream): read as asked
        return source.read(limit + 1)
    data = source.read(min(size, limit) + 1)
    if size < len(data) <= limit:  # it grew since its size was asked: read on
        data += source.read(limit + 1 - len(data))
    return data


_FOLDER_BELOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def open_below(folder: Path, relative: str, flags: int, mode: int = 0o644) -> int:
    """Open ``folder``/``relative`` with ``flags`` without following a symlink anywhere below
    ``folder`` (a trusted folder: a command's unit folder, whose contents the command may
    have swapped for symlinks to anywhere); ELOOP or ENOTDIR (``OSError``) when one is."""
    parts = relative.split("/")
    where = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for part in parts[:-1]:
            inner = os.open(part, _FOLDER_BELOW, dir_fd=where)
            os.close(where)
            where = inner
        return os.open(parts[-1], flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=where)
    finally:
        os.close(where)


def read_regular_file(
    path: Path | str,
    max_bytes: int,
    *,
    follow_symlinks: bool = False,
    below: Path | None = None,
) -> bytes:
    """The content of the regular file at ``path``, for files a command wrote: at most
    ``max_bytes`` are read (`BlobTooLargeError` when it holds more), a symlink is not
    followed (unless ``follow_symlinks``: for a tree evolane laid out itself, whose links
    were checked to stay inside; ``below``: nor at any step of ``path`` below that folder)
    and a FIFO or device is not read (`NotRegularFileError`); other ``OSError`` as usual."""
    with open_regular_file(path, follow_symlinks=follow_symlinks, below=below) as source:
        data = read_at_most(source, max_bytes)
    if len(data) > max_bytes:
        raise BlobTooLargeError(f"{path} holds more than {max_bytes} bytes")
    return data


def open_regular_file(
    path: Path | str, *, follow_symlinks: bool = False, below: Path | None = None
) -> BinaryIO:  # the file object of `_regular_fd`'s descriptor
    return os.fdopen(_regular_fd(path, follow_symlinks=follow_symlinks, below=below), "rb")


def _regular_fd(
    path: Path | str, *, follow_symlinks: bool = False, below: Path | None = None
) -> int:
    """A descriptor of ``path`` only if it is a regular file (never through a symlink unless
    asked, nor below ``below`` at all; never blocking on a FIFO): `NotRegularFileError`."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC
    flags |= 0 if follow_symlinks else os.O_NOFOLLOW
    try:
        if below is not None:
            fd = open_below(below, Path(path).relative_to(below).as_posix(), flags)
        else:
            fd = os.open(path, flags)
    except OSError as error:  # ELOOP: a symlink not followed; ENXIO: a socket (never opened)
        if (what := {errno.ELOOP: "a symlink", errno.ENXIO: "a socket"}.get(error.errno)) is None:
            raise
        raise NotRegularFileError(path, what) from None
    if not stat.S_ISREG(mode := os.fstat(fd).st_mode):  # fstat first: fdopen refuses a dir
        os.close(fd)
        raise NotRegularFileError(path, describe_mode(mode))
    return fd


def _read_fd(fd: int, max_bytes: int | None = None) -> bytes:
    """Everything from ``fd`` (a regular file) to its end: a read of its size plus one byte,
    so a file that did not grow ends in one read; a longer one is read on in chunks. Past
    ``max_bytes`` (if given) `BlobTooLargeError`."""
    size = os.fstat(fd).st_size
    cap = size + 1 if max_bytes is None else min(size, max_bytes) + 1
    first = os.read(fd, cap)
    if len(first) <= size and (max_bytes is None or len(first) <= max_bytes):
        return first  # a short read of a regular file: its end
    chunks, total = [first], len(first)
    while (max_bytes is None or total <= max_bytes) and (chunk := os.read(fd, CHUNK_SIZE)):
        chunks.append(chunk)
        total += len(chunk)
    if max_bytes is not None and total > max_bytes:
        raise BlobTooLargeError(f"more than {max_bytes} bytes")
    return b"".join(chunks)


def _digest(blob: BlobId) -> str:
    return blob.digest if isinstance(blob, ArtifactRef) else blob


def _read_chunks(source: BinaryIO, max_bytes: int | None = None) -> Iterator[bytes]:
    """The source's bytes in chunks; past ``max_bytes`` (if given) `BlobTooLargeError`."""
    total = 0
    while chunk := source.read(CHUNK_SIZE):
        total += len(chunk)
        if max_bytes is not None and total > max_bytes:
            raise BlobTooLargeError(f"more than {max_bytes} bytes")
        yield chunk
