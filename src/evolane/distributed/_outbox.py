"""A write-only store for one remote unit's results: small blobs in memory, large ones staged."""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable
from pathlib import Path

from evolane.messages import ArtifactRef
from evolane.store import DEFAULT_MEDIA_TYPE, BlobId, BlobStore, StoreError

_NOWHERE = Path("/nonexistent/evolane-outbox")


class ResultTooLarge(StoreError):
    """A unit produced more than may travel inline (and there is no shared store to stage it)."""


class Outbox(BlobStore):
    """Collects what a unit stores (captured streams, its output tree) for the trip home.

    Blobs up to ``inline_bytes`` stay in memory; larger ones are written to the staging
    store at ``staging`` (a directory the driver can read), as are small ones beyond
    ``inline_total`` bytes in all; without a staging store that total is a hard limit.
    Nothing here is ever read back on the worker.
    """

    def __init__(self, staging: Path | None, inline_bytes: int, inline_total: int) -> None:
        super().__init__(staging if staging is not None else _NOWHERE)
        self.staging = staging
        self.inline_bytes, self.inline_total = inline_bytes, inline_total
        self.inline: dict[str, bytes] = {}
        self.staged: dict[str, int] = {}
        self._kept = 0

    def has(self, blob: BlobId) -> bool:
        digest = blob.digest if isinstance(blob, ArtifactRef) else blob
        return digest in self.inline or digest in self.staged

    def put_stream(
        self, chunks: Iterable[bytes], *, media_type: str = DEFAULT_MEDIA_TYPE
    ) -> ArtifactRef:
        """Keep the blob in memory, or stream it to the staging store once it grows large."""
        source = iter(chunks)
        buffer = bytearray()
        for chunk in source:
            buffer += chunk
            over = self._kept + len(buffer) > self.inline_total
            if self.staging is not None and (over or len(buffer) > self.inline_bytes):
                rest = itertools.chain([bytes(buffer)], source)
                ref = super().put_stream(rest, media_type=media_type)
                self.staged[ref.digest] = ref.size
                return ref
            if over:
                raise ResultTooLarge(
                    f"the unit's results exceed {self.inline_total} bytes and no shared store "
                    "is available to stage them"
                )
        data = bytes(buffer)
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        if digest not in self.inline:
            self.inline[digest] = data
            self._kept += len(data)
        return ArtifactRef(digest=digest, size=len(data), media_type=media_type)
