"""What travels between the driver and a Dask worker for one replay unit (pickled by Dask)."""

from __future__ import annotations

from dataclasses import dataclass, field

from evolane.lanes import LaneSettings
from evolane.messages import ReplayJob, ReplayResult

INLINE_BYTES = 256 << 10
"""Blobs up to this size come back inside the result; larger ones through the shared store."""

INLINE_TOTAL = 16 << 20
"""At most this much comes back inline per unit when a shared store can take the rest."""

REPORT_FILE = "report.pickle"
"""With a shared store, the worker leaves its `UnitReport` in the unit's staging directory."""

PRIVATE_RESULT_BYTES = 256 << 20
"""Without a shared store everything comes back inline, at most this much per unit."""


@dataclass(frozen=True)
class UnitRequest:
    """One attempt of one replay unit, as the worker receives it.

    ``deadline_epoch`` is the unit's hard deadline on the wall clock (time queued counts).
    With ``shared`` the worker reads inputs from ``store_root`` and stages large results
    under ``staging``; otherwise inputs arrive as blob bundles and results come back inline.
    """

    key: str
    job: ReplayJob
    attempt: int
    settings: LaneSettings  # without a backend: a worker runs the command
    deadline_epoch: float
    shared: bool
    store_root: str
    staging: str | None = None
    inline_bytes: int = INLINE_BYTES
    inline_total: int = INLINE_TOTAL


@dataclass(frozen=True)
class UnitReport:
    """The worker's answer: the result (refs into ``inline``/``staged`` blobs) and the blobs.

    ``inline`` maps digests to bytes; ``staged`` maps digests to sizes of blobs written to
    the request's staging store. The driver verifies every digest before storing a blob.
    """

    result: ReplayResult
    inline: dict[str, bytes] = field(default_factory=dict)
    staged: dict[str, int] = field(default_factory=dict)
    worker: str = ""
