"""Whether ``--resume`` can work for a run: `report` suggests it only then, and otherwise
says why not (an ended run, or a damaged journal or blob: ``evolane fsck`` finds those)."""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from evolane.campaign import RunRecord, StoreLayout

RESUMABLE = ("running", "interrupted")
"""The run statuses `--resume` accepts."""


def resume_blocker(layout: StoreLayout, record: RunRecord, store: Path) -> str | None:
    """Why ``--resume`` of ``record`` cannot work (one plain line), or None when it can: the
    run has not ended, its journal reads whole and the trees it starts from are intact."""
    from evolane.campaign import read_resume_state
    from evolane.store import CorruptBlobError, StoreError

    if record.status not in RESUMABLE:
        return f"the run ended {record.status}; start a new run (or --resume-campaign)"
    fsck = f"run `evolane fsck --store {store}`"
    try:
        read_resume_state(layout.run_dir(record.run_id) / "journal.jsonl")
    except (OSError, ValueError, StoreError) as error:
        return f"its journal is damaged ({type(error).__name__}); {fsck}"
    blobs = layout.blobs()
    for ref in (record.seed_ref, record.parent_ref):
        if not blobs.has(ref):
            continue
        try:
            blobs.verify(ref)
        except CorruptBlobError:
            return f"blob {ref.digest} it starts from is corrupt; {fsck}"
        except OSError as error:
            return f"blob {ref.digest} cannot be read ({error.strerror}); {fsck}"
    return None


def resume_command(run_id: str, store: Path) -> str:
    """The command that continues an interrupted run."""
    return f"evolane optimize --resume {shlex.quote(run_id)} --store {shlex.quote(str(store))}"
