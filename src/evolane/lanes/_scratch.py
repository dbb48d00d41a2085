"""The one scratch layout: every directory a lane, a gate or a publish lays out for a
command lives at ``<sandbox lease>/<kind>/<safe name>``, so whatever a crash leaves goes
with the lease (swept at the next start) and no two layouts can collide."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import re
import secrets
import stat
from pathlib import Path
from typing import Any, Literal

import orjson

from evolane.messages import ArtifactRef, JudgeJob, ProposeJob, ReplayJob
from evolane.sandbox import SandboxHost, materialize_workspace
from evolane.store import BlobStore, materialize_tree, remove_tree

ScratchKind = Literal["units", "optimizer", "gates", "apply"]
"""What a scratch directory is for: a replay or judge unit, an optimizer slot, a local gate
command, a publish check."""

_NAME_CHARS = 64


def safe_name(name: str) -> str:
    """``name`` as one safe path component; names that had to change get a digest suffix,
    so two different names never share a directory."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)[:_NAME_CHARS]
    if safe == name and safe not in ("", ".", ".."):
        return safe
    return f"{safe}-{hashlib.sha256(name.encode()).hexdigest()[:10]}"


def blind_name(key: str, unit_id: str) -> str:
    """The opaque name a replay command knows its unit by (``EVOLANE_UNIT``, its folder):
    a keyed digest of ``unit_id``, whose parts (``<measurement>.<case>.<rep>.<b|c>``) name
    the arm, measurement and split. ``key``: the run's reuse fingerprint, stable across a
    resume and out of a confined command's reach (found by review: a tree that failed
    whenever ``EVOLANE_UNIT`` ended in ``.b`` sandbagged its own baseline, and a worse
    candidate was confirmed against it and published)."""
    return "u" + hashlib.blake2b(unit_id.encode(), key=_secret(key), digest_size=10).hexdigest()


@functools.lru_cache(maxsize=8)
def _secret(key: str) -> bytes:
    """`blind_name`'s blake2b key for ``key`` (once a run, not once a unit)."""
    return hashlib.sha256(b"evolane-unit-name:" + key.encode()).digest()


def replay_name(job: ReplayJob | JudgeJob) -> str:
    """The job's opaque ``name`` (`ReplayJob.name`, `JudgeJob.name`), else a random one (a
    job built without the run's key)."""
    return job.name or blind_name(secrets.token_hex(16), job.unit_id)


def replay_environment(job: ReplayJob, name: str) -> dict[str, str]:
    """The ``EVOLANE_*`` variables a replay command sees for ``job`` run as ``name`` (a
    command's `replay_name`). Not its arm: a replay is blind to whether it is the baseline
    or the candidate, so a result serves either, and a tree cannot fail its parent's."""
    return {
        "EVOLANE_UNIT": name,
        "EVOLANE_CASE_ID": job.case_id,
        "EVOLANE_REPETITION": str(job.repetition),
        "EVOLANE_SEED": str(job.seed),
    }


def scratch_dir(host: SandboxHost, kind: ScratchKind, name: str) -> Path:
    """The scratch directory of ``name`` for ``kind`` under ``host``'s lease (not created)."""
    return host.lease_dir / kind / safe_name(name)


class UnitScratch:
    """A unit's directory under the sandbox root: case.json, candidate/, work/, out/."""

    def __init__(self, host: SandboxHost, store: BlobStore, unit_id: str, attempt: int) -> None:
        self.store, self.attempt = store, attempt
        self.dir = scratch_dir(host, "units", f"{unit_id}.{attempt}")
        self.case_file, self.candidate = self.dir / "case.json", self.dir / "candidate"
        self.work, self.out = self.dir / "work", self.dir / "out"
        self.shared = False

    def share_candidate(self, tree: Path) -> None:
        """Use ``tree``, the candidate laid out read-only once for every unit, instead of a
        copy of its own (before `placeholders` and `prepare`)."""
        self.candidate, self.shared = tree, True

    def prepare(
        self,
        case_ref: ArtifactRef,
        tree_ref: ArtifactRef | None,
        seed_ref: ArtifactRef | None,
        output_ref: ArtifactRef | None = None,
        leftover: Path | None = None,
        *,
        case_file: bool = True,
    ) -> dict[str, Any]:
        """Lay the unit out and return the case row (blocking I/O: run it in a thread).

        ``leftover``, a worker's previous scratch directory, is removed first. After
        `share_candidate`, ``tree_ref`` is not copied. ``case_file=False`` writes no
        ``case.json`` (a judge command that does not name it)."""
        if leftover is not None:
            remove_tree(leftover)
        try:
            self.dir.mkdir(parents=True)
        except FileExistsError:
            remove_tree(self.dir)
            self.dir.mkdir(parents=True)
        case_bytes = self.store.read_bytes(case_ref)
        if case_file:
            self.case_file.write_bytes(case_bytes)
        if not self.shared:
            materialize_workspace(self.store, tree_ref, (), self.candidate)
        materialize_workspace(self.store, seed_ref, (), self.work)
        materialize_workspace(self.store, output_ref, (), self.out)
        return orjson.loads(case_bytes)

    def placeholders(self, seed: int) -> dict[str, str]:
        return {
            "candidate": str(self.candidate),
            "workspace": str(self.work),
            "case_file": str(self.case_file),
            "output_dir": str(self.out),
            "seed": str(seed),
        }

    def usage_file(self, label: str) -> Path:
        """Where the unit's ``label`` command (replay or judge) writes its usage document:
        a replay's in its output folder (``{output_dir}/usage.json``), a judge's beside it."""
        return self.out / "usage.json" if label == "replay" else self.dir / "judge-usage.json"

    def own(self) -> tuple[tuple[str, bool], ...]:
        """What a confined command of this unit sees of it: the directory, writable, with
        the candidate read-only over it (a replay may not edit the tree it runs)."""
        return ((str(self.dir), True), (str(self.candidate), False))

    def remove(self) -> None:
        remove_tree(self.dir)


class SlotScratch:
    """One job's directory: workdir/, prompt.json, context/ (read-only), usage.json, and for
    a coding-agent CLI prompt.md (the prompt as text, read-only)."""

    def __init__(self, host: SandboxHost, slot_id: str) -> None:
        self.dir = scratch_dir(host, "optimizer", slot_id)
        self.workdir, self.context = self.dir / "workdir", self.dir / "context"
        self.prompt_file = self.dir / "prompt.json"
        self.prompt_text_file = self.dir / "prompt.md"

    def prepare(self, store: BlobStore, job: ProposeJob) -> None:
        """Lay the job out (blocking I/O: run it in a thread)."""
        self.remove()
        self.dir.mkdir(parents=True)
        # Copies, never hard links: the optimizer edits the workdir in place.
        materialize_workspace(store, job.parent_ref, (), self.workdir)
        self.prompt_file.write_bytes(store.read_bytes(job.prompt_ref))
        if job.context_ref is not None:
            materialize_tree(store, job.context_ref, self.context, link=False, durable=False)
        else:
            self.context.mkdir()
        _set_writable(self.context, False)

    def placeholders(self, seed: int) -> dict[str, str]:
        return {
            "workdir": str(self.workdir),
            "prompt_file": str(self.prompt_file),
            "seed": str(seed),
            "workspace": str(self.context),
        }

    def own(self) -> tuple[tuple[str, bool], ...]:
        """What a confined optimizer sees of its job: the directory, writable (its workdir
        and usage file), with the context folder and the prompt (and prompt.md, once
        written) read-only over it."""
        shown = [(str(self.dir), True), (str(self.context), False), (str(self.prompt_file), False)]
        if self.prompt_text_file.is_file():
            shown.append((str(self.prompt_text_file), False))
        return tuple(shown)

    def remove(self) -> None:
        remove_tree(self.dir)  # read-only folders are made writable as it goes


def _set_writable(root: Path, writable: bool) -> None:
    """Give or take write permission on every folder and file under ``root`` (no symlinks
    followed, no recursion)."""
    pending = [root]
    while pending:
        path = pending.pop()
        with contextlib.suppress(OSError):
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                continue
            bits = stat.S_IMODE(mode)
            path.chmod((bits | stat.S_IWUSR) if writable else (bits & ~0o222))
            if stat.S_ISDIR(mode):
                pending.extend(path.iterdir())
