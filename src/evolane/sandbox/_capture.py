"""Bounded output capture: head + tail + total, and a capped spool for the store."""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

import trio

from evolane.messages import ArtifactRef
from evolane.sandbox._spec import OutputCaps, StreamCapture
from evolane.store import BlobStore, write_all

_F_SETPIPE_SZ = 1031
_PIPE_BYTES = 1 << 20
_READ_BYTES = 1 << 20


class BoundedCapture:
    """Keeps the first and last bytes of a stream and counts the rest; memory stays bounded.

    With a spool directory, the first ``stored_bytes`` also go to the store: kept in the
    head while they fit there, else in an anonymous temporary file, made only then, that
    only this process holds (no path a sandboxed child could replace).
    """

    def __init__(self, caps: OutputCaps, spool_dir: Path | None) -> None:
        self._caps = caps
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self.spooled = 0
        self.spool_failed = False
        self._spool_dir = spool_dir if caps.stored_bytes > 0 else None
        self._spool: BinaryIO | None = None

    def feed(self, chunk: bytes) -> None:
        """Account for one chunk of output."""
        self.total += len(chunk)
        self._to_spool(chunk)
        room = self._caps.head_bytes - len(self._head)
        if room > 0:
            self._head += chunk[:room]
            chunk = chunk[room:]
        cap = self._caps.tail_bytes
        if chunk and cap:
            if len(chunk) >= cap:
                self._tail[:] = chunk[-cap:]
            else:
                self._tail += chunk
                if len(self._tail) > cap:
                    del self._tail[: len(self._tail) - cap]

    def _to_spool(self, chunk: bytes) -> None:
        """Spool what is left of the first ``stored_bytes`` of ``chunk`` (called before the
        head takes ``chunk``: the head then holds exactly the bytes spooled so far)."""
        left = self._caps.stored_bytes - self.spooled
        if self._spool_dir is None or self.spool_failed or left <= 0:
            return
        piece = memoryview(chunk)[:left]
        if self._spool is None and self.spooled + len(piece) <= self._caps.head_bytes:
            self.spooled += len(piece)  # the head holds it
            return
        try:
            if self._spool is None:
                self._spool = tempfile.TemporaryFile(dir=self._spool_dir, buffering=0)  # noqa: SIM115
                write_all(self._spool.fileno(), self._head[: self.spooled])  # one copy
            write_all(self._spool.fileno(), piece)
            self.spooled += len(piece)
        except OSError:  # a full disk costs the stored copy, never the run
            self.spool_failed = True

    def _spooled_chunks(self) -> Iterator[bytes]:
        if self._spool is None:  # all of it fit in the head
            yield bytes(self._head[: self.spooled])
            return
        offset = 0
        while offset < self.spooled:
            chunk = os.pread(self._spool.fileno(), min(_READ_BYTES, self.spooled - offset), offset)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk

    def store(self, store: BlobStore) -> ArtifactRef | None:
        """Put the spooled copy in ``store`` (blocking I/O: call it from a thread)."""
        if self._spool_dir is None or self.spool_failed or not self.spooled:
            return None
        return store.put_stream(self._spooled_chunks())

    def close(self) -> None:
        if self._spool is not None:
            self._spool.close()
            self._spool = None

    def result(self, ref: ArtifactRef | None = None) -> StreamCapture:
        """The frozen capture; ``truncated`` when bytes between head and tail were dropped."""
        kept = len(self._head) + len(self._tail)
        return StreamCapture(
            head=bytes(self._head),
            tail=bytes(self._tail),
            total_bytes=self.total,
            truncated=self.total > kept,
            ref=ref,
        )


def open_pipe() -> tuple[int, int]:
    """A close-on-exec pipe with a 1 MiB buffer where the kernel allows it: (read fd, write fd).
    The read end is non-blocking (for `drain`); the write end, the command's, is not (each
    end is an open file description of its own)."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    try:
        with contextlib.suppress(OSError):
            fcntl.fcntl(read_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
        os.set_blocking(read_fd, False)
    except BaseException:
        os.close(read_fd)
        os.close(write_fd)
        raise
    return read_fd, write_fd


async def drain(
    read_fd: int,
    capture: BoundedCapture,
    activity: Callable[[], object] | None = None,
) -> None:
    """Read the pipe ``read_fd`` (a non-blocking read end: `open_pipe`) to its end into
    ``capture``, and close it, however this ends; never stalls the writer on a full pipe.

    ``activity``, if given, is called (in the trio thread) after every chunk read. Not a
    ``trio.lowlevel.FdStream``: it switched the pipe to non-blocking and back, three system
    calls a stream, two streams a command (issue 22)."""
    try:
        while True:
            try:
                chunk = os.read(read_fd, _READ_BYTES)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(read_fd)
                continue
            if not chunk:
                return
            capture.feed(chunk)
            if activity is not None:
                activity()
            await trio.lowlevel.checkpoint()  # a writer that never pauses starves no task
    finally:
        trio.lowlevel.notify_closing(read_fd)
        os.close(read_fd)


class OwnedPipes:
    """Pipe ends this run still owns: each is closed exactly once, here or by its new owner."""

    def __init__(self) -> None:
        self._open: set[int] = set()

    def open(self) -> tuple[int, int]:
        read_fd, write_fd = open_pipe()
        self._open |= {read_fd, write_fd}
        return read_fd, write_fd

    def close(self, fd: int) -> None:
        self._open.discard(fd)
        os.close(fd)

    def hand_over(self, fd: int) -> int:
        """Give ``fd`` to a new owner (a `drain`, which closes it)."""
        self._open.discard(fd)
        return fd

    def close_all(self) -> None:
        for fd in self._open:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._open.clear()
