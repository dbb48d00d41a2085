"""Bounded output capture: head + tail + total, and a capped spool for the store."""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

import trio

from evolane.messages import ArtifactRef
from evolane.sandbox._spec import OutputCaps, StreamCapture

_F_SETPIPE_SZ = 1031
_PIPE_BYTES = 1 << 20
_READ_BYTES = 1 << 20


class BoundedCapture:
    """Keeps the first and last bytes of a stream and counts the rest; memory stays bounded."""

    def __init__(self, caps: OutputCaps, spool_path: Path | None) -> None:
        self._caps = caps
        self._head = bytearray()
        self._tail = bytearray()
        self.total = 0
        self._spool_left = caps.stored_bytes if spool_path is not None else 0
        self.spool_path = spool_path
        self._spool_fd = (
            os.open(spool_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            if spool_path is not None and caps.stored_bytes > 0
            else None
        )

    def feed(self, chunk: bytes) -> None:
        """Account for one chunk of output."""
        self.total += len(chunk)
        if self._spool_fd is not None and self._spool_left > 0:
            self._spool_left -= os.write(self._spool_fd, memoryview(chunk)[: self._spool_left])
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

    def close_spool(self) -> None:
        if self._spool_fd is not None:
            os.close(self._spool_fd)
            self._spool_fd = None

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
    """A close-on-exec pipe with a 1 MiB buffer where the kernel allows it: (read fd, write fd)."""
    read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        fcntl.fcntl(read_fd, _F_SETPIPE_SZ, _PIPE_BYTES)
    return read_fd, write_fd


async def drain(stream: trio.lowlevel.FdStream, capture: BoundedCapture) -> None:
    """Read ``stream`` to its end into ``capture``; never stalls the writer on a full pipe."""
    async with stream:
        while True:
            chunk = await stream.receive_some(_READ_BYTES)
            if not chunk:
                return
            capture.feed(chunk)
