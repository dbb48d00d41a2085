"""Local gates: cheap checks that reject a bad candidate tree before it costs budget or replay.

In order, stopping at the first gate that does not pass: ``no_op`` (same tree as the parent),
``duplicate`` (an earlier candidate's tree), ``protected_paths`` (the edit touches a protected
glob or version-control metadata: ``indecisive``, a tampering candidate is never scored),
``size_limit`` and ``malformed`` (required files, then an optional validator command run in
the sandbox).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import trio

from evolane.campaign._config import MAX_GROWTH_BYTES
from evolane.campaign._vcs import vcs_paths
from evolane.inputs import CommandTemplate
from evolane.lanes import limit_reason, limits_hit, scratch_dir
from evolane.measure import CommandSettings
from evolane.messages import ArtifactRef, GateOutcome, LocalGate, LocalGateResult
from evolane.sandbox import (
    Limits,
    ProcessOutcome,
    SandboxHost,
    SandboxSpec,
    materialize_workspace,
)
from evolane.store import (
    BlobStore,
    FileEntry,
    TreeLimits,
    TreeManifest,
    UnsafeEntryError,
    diff_trees,
    load_manifest,
    remove_tree,
)

VALIDATOR_PLACEHOLDERS = frozenset({"candidate", "workspace"})
"""Placeholders a validator command may use."""
_SHORT = 256  # ShortText bound of a reason or a path in a LocalGateResult
_MAX_PATHS = 4


@dataclass(frozen=True)
class GateSettings:
    """What the local gates enforce; checked on construction (``ValueError``)."""

    protected: tuple[str, ...] = ()
    """Globs relative to the tree root, e.g. ``grader/**``, ``data/*.jsonl``, ``README.md``."""
    required_files: tuple[str, ...] = ()
    """Paths that must exist in every candidate as non-empty regular files."""
    max_tree_bytes: int = 16 << 20
    max_file_bytes: int = 256 << 10
    """Bound on any added or changed file."""
    max_growth_bytes: int = MAX_GROWTH_BYTES
    """Bound on the candidate's total size minus the parent's."""
    max_files: int = 10_000
    validator: CommandTemplate | None = None
    """Run on the materialised candidate; placeholders ``{candidate}`` and ``{workspace}``."""
    validator_timeout: float = 60.0
    commands: CommandSettings = field(default_factory=CommandSettings)
    """How the validator command is run (its kill grace and resource limits)."""

    def __post_init__(self) -> None:
        validate_protected(self.protected)
        for path in self.required_files:
            if _normalised(path) != path:
                raise ValueError(f"required file {path!r} is not a relative POSIX path in the tree")
        for name in ("max_tree_bytes", "max_file_bytes", "max_growth_bytes", "max_files"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not self.validator_timeout > 0:
            raise ValueError("validator_timeout must be > 0")
        if self.validator is not None:
            extra = self.validator.placeholders - VALIDATOR_PLACEHOLDERS
            if extra:
                names = ", ".join("{" + name + "}" for name in sorted(extra))
                raise ValueError(f"the validator command cannot use {names}")

    @property
    def tree_limits(self) -> TreeLimits:
        """The size gate's caps as walk caps for the optimizer's workdir, so a tree the gate
        would refuse is refused while it is walked, before it is hashed or stored: at most
        ``max_files`` files and as many folders, ``max_tree_bytes`` bytes in all."""
        return TreeLimits(
            max_files=self.max_files, max_folders=self.max_files, max_bytes=self.max_tree_bytes
        )


# -- protected globs ----------------------------------------------------------------------


def _normalised(path: str) -> str | None:
    """``path`` without ``.``/empty segments or a trailing slash; None when it is unusable."""
    if not path or path.startswith("/") or "\0" in path:
        return None
    parts = [part for part in path.split("/") if part not in ("", ".")]
    if not parts or ".." in parts:
        return None
    return "/".join(parts)


def validate_protected(patterns: Iterable[str]) -> None:
    """Raise ``ValueError`` naming the first invalid pattern (empty, absolute or with ``..``)."""
    for pattern in patterns:
        _compile(pattern)


def protected_match(pattern: str, path: str) -> bool:
    """Whether ``path`` (a manifest path) matches ``pattern`` or lies under a matching directory.

    ``**`` matches any number of whole segments (zero included), ``*`` and ``?`` match within
    one segment, ``[...]`` is a character class (``[!...]`` negates); matching is case-sensitive.
    """
    return _compile(pattern).fullmatch(path) is not None


@functools.lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    normal = _normalised(pattern)
    if normal is None:
        raise ValueError(
            f"invalid protected pattern {pattern!r}: it must be a non-empty relative path "
            "without '..'"
        )
    segments = normal.split("/")
    out: list[str] = []
    previous_literal = False
    for index, segment in enumerate(segments):
        if segment == "**":
            if index > 0 and segments[index - 1] == "**":
                continue
            last = all(rest == "**" for rest in segments[index + 1 :])
            if last and not previous_literal:
                out.append(".*")
            elif last:
                out.append("(?:/[^/]+)*")
            else:
                out.append("/(?:[^/]+/)*" if previous_literal else "(?:[^/]+/)*")
            previous_literal = False
            continue
        if previous_literal:
            out.append("/")
        out.append(_segment_regex(segment))
        previous_literal = True
    try:
        return re.compile("".join(out) + "(?:/.*)?", re.DOTALL)
    except re.error as error:
        raise ValueError(f"invalid protected pattern {pattern!r}: {error}") from None


def _segment_regex(segment: str) -> str:
    """One segment's glob as a regex that never crosses a ``/``."""
    out: list[str] = []
    index = 0
    while index < len(segment):
        char = segment[index]
        index += 1
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = index + 1 if index < len(segment) and segment[index] in "!^" else index
            end = end + 1 if end < len(segment) and segment[end] == "]" else end
            end = segment.find("]", end)
            if end < 0:
                out.append(re.escape(char))  # an unclosed bracket is a literal
                continue
            body = segment[index:end]
            index = end + 1
            negate = body[:1] in ("!", "^")
            body = body[1:] if negate else body
            escaped = "".join("\\" + c if c in "\\^[]" else c for c in body)
            out.append(f"(?!/)[{'^' if negate else ''}{escaped}]")
        else:
            out.append(re.escape(char))
    return "".join(out)


def untouchable(
    touched: Iterable[str],
    protected: Iterable[str],
    parent: TreeManifest,
    candidate: TreeManifest,
) -> list[str]:
    """The ``touched`` paths (sorted) that no candidate of ``parent`` may change: those a
    ``protected`` glob matches, and version-control metadata whatever the globs say
    (`evolane.campaign._vcs`: a repository's config and hooks run commands on sight)."""
    paths, globs = sorted(touched), tuple(protected)
    matched = {p for p in paths if any(protected_match(glob, p) for glob in globs)}
    matched.update(vcs_paths(paths, parent, candidate))
    return sorted(matched)


# -- the gates ----------------------------------------------------------------------------


def _short(text: str, limit: int = _SHORT) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _result(
    gate: LocalGate, outcome: GateOutcome, reason: str = "", paths: Iterable[str] = ()
) -> LocalGateResult:
    shown = tuple(_short(path) for path in list(paths)[:_MAX_PATHS])
    return LocalGateResult(gate=gate, outcome=outcome, reason=_short(reason), paths=shown)


def _listing(paths: list[str]) -> str:
    shown = ", ".join(repr(path) for path in paths[:_MAX_PATHS])
    more = len(paths) - _MAX_PATHS
    return shown + (f" (+{more} more)" if more > 0 else "")


def _total_bytes(manifest: TreeManifest) -> int:
    return sum(entry.size for entry in manifest.values() if isinstance(entry, FileEntry))


def check_tree(
    store: BlobStore,
    settings: GateSettings,
    parent_ref: ArtifactRef,
    candidate_ref: ArtifactRef,
    seen: Collection[str],
) -> list[LocalGateResult]:
    """Run every gate except the validator command; the list ends at the first non-pass.

    Reads manifests only (blocking: call it through ``trio.to_thread.run_sync``).
    """
    results: list[LocalGateResult] = []
    if candidate_ref.digest == parent_ref.digest:
        return [_result("no_op", "reject", "same tree as the parent")]
    results.append(_result("no_op", "pass"))
    if candidate_ref.digest in seen:
        results.append(_result("duplicate", "reject", "same tree as an earlier candidate"))
        return results
    results.append(_result("duplicate", "pass"))

    diff = diff_trees(store, parent_ref, candidate_ref)
    touched = sorted({*diff.added, *diff.removed, *diff.changed})
    parent, candidate = load_manifest(store, parent_ref), load_manifest(store, candidate_ref)
    offending = untouchable(touched, settings.protected, parent, candidate)
    if offending:
        reason = f"touches protected paths: {_listing(offending)}"
        results.append(_result("protected_paths", "indecisive", reason, offending))
        return results
    results.append(_result("protected_paths", "pass"))

    results.append(_size_gate(settings, parent, candidate, [*diff.added, *diff.changed]))
    if not results[-1].passed:
        return results
    results.append(_required_gate(settings, candidate))
    return results


def _size_gate(
    settings: GateSettings, parent: TreeManifest, candidate: TreeManifest, edited: list[str]
) -> LocalGateResult:
    if len(candidate) > settings.max_files:
        reason = f"{len(candidate)} files, over the limit of {settings.max_files}"
        return _result("size_limit", "reject", reason)
    total = _total_bytes(candidate)
    if total > settings.max_tree_bytes:
        reason = f"the tree holds {total} bytes, over the limit of {settings.max_tree_bytes}"
        return _result("size_limit", "reject", reason)
    large = sorted(
        (path for path in edited if _size(candidate, path) > settings.max_file_bytes),
        key=lambda path: (-_size(candidate, path), path),
    )
    if large:
        biggest = _size(candidate, large[0])
        reason = (
            f"{len(large)} added or changed file(s) over the limit of {settings.max_file_bytes} "
            f"bytes (largest {large[0]!r}: {biggest} bytes)"
        )
        return _result("size_limit", "reject", reason, large)
    growth = total - _total_bytes(parent)
    if growth > settings.max_growth_bytes:
        reason = (
            f"the tree grows by {growth} bytes over its parent, over the limit of "
            f"{settings.max_growth_bytes}"
        )
        return _result("size_limit", "reject", reason)
    return _result("size_limit", "pass")


def _size(manifest: TreeManifest, path: str) -> int:
    entry = manifest[path]
    return entry.size if isinstance(entry, FileEntry) else 0


def _required_gate(settings: GateSettings, candidate: TreeManifest) -> LocalGateResult:
    problems: list[tuple[str, str]] = []
    for path in settings.required_files:
        entry = candidate.get(path)
        if entry is None:
            problems.append((path, "missing"))
        elif not isinstance(entry, FileEntry):
            problems.append((path, "not a regular file"))
        elif entry.size == 0:
            problems.append((path, "empty"))
    if not problems:
        return _result("malformed", "pass")
    listed = "; ".join(f"{path!r} is {what}" for path, what in problems[:_MAX_PATHS])
    more = len(problems) - _MAX_PATHS
    reason = "required file " + listed + (f" (+{more} more)" if more > 0 else "")
    return _result("malformed", "reject", reason, [path for path, _ in problems])


# -- the validator ------------------------------------------------------------------------


async def run_local_gates(
    store: BlobStore,
    host: SandboxHost,
    settings: GateSettings,
    parent_ref: ArtifactRef,
    candidate_ref: ArtifactRef,
    seen: Collection[str],
    *,
    label: str = "validator",
    stop: trio.Event | None = None,
) -> list[LocalGateResult]:
    """`check_tree`, then the validator command (if any) on the materialised candidate.

    The validator's verdict replaces the required-files pass of ``malformed``: exit 0 passes,
    any other exit rejects, a timeout, spawn failure, limit hit or ``stop`` is ``indecisive``.
    """
    results = await trio.to_thread.run_sync(
        check_tree, store, settings, parent_ref, candidate_ref, seen
    )
    if settings.validator is None or not results[-1].passed:
        return results
    verdict = await _run_validator(store, host, settings, candidate_ref, label, stop)
    return [*results[:-1], verdict]


async def _run_validator(
    store: BlobStore,
    host: SandboxHost,
    settings: GateSettings,
    candidate_ref: ArtifactRef,
    label: str,
    stop: trio.Event | None,
) -> LocalGateResult:
    assert settings.validator is not None
    scratch = scratch_dir(host, "gates", host.unit_name(label))
    candidate, workspace = scratch / "candidate", scratch / "workspace"
    try:
        try:
            await trio.to_thread.run_sync(_prepare, store, candidate_ref, candidate, workspace)
        except UnsafeEntryError as error:
            return _result("malformed", "reject", f"cannot materialise the tree: {error}")
        except OSError as error:
            return _result("malformed", "indecisive", f"cannot materialise the tree: {error}")
        argv = settings.validator.render({"candidate": str(candidate), "workspace": str(workspace)})
        spec = SandboxSpec(
            argv=argv,
            workspace=str(workspace),
            kill_grace=settings.commands.kill_grace,
            isolation=settings.commands.isolation,
            pass_env=settings.commands.passed("validator"),
            view=settings.commands.view("validator", settings.validator).model_copy(
                update={"own": ((str(scratch), True),)}
            ),
            drop_root=True,
            limits=settings.commands.sandbox_limits(),
            label=_short(label, 128) or "validator",
        )
        outcome = await host.run(spec, timeout=settings.validator_timeout, stop=stop)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(remove_tree, scratch)
    return _validator_verdict(outcome, settings.validator_timeout, spec.limits)


def _prepare(store: BlobStore, ref: ArtifactRef, candidate: Path, workspace: Path) -> None:
    """Lay out the scratch directory: a writable copy of the candidate and an empty workspace."""
    candidate.parent.mkdir(parents=True)
    materialize_workspace(store, ref, (), candidate)
    workspace.mkdir()


def _validator_verdict(outcome: ProcessOutcome, timeout: float, limits: Limits) -> LocalGateResult:
    if outcome.ok:
        return _result("malformed", "pass")
    hit = limits_hit(outcome, limits)
    if hit:  # out of the room the run gave it: that says nothing of the candidate
        why = f"the validator stopped: {limit_reason(hit, limits)}"
        return _result("malformed", "indecisive", why)
    if outcome.status == "timed_out":
        return _result("malformed", "indecisive", f"the validator timed out after {timeout:g}s")
    if outcome.status == "spawn_failed":
        return _result("malformed", "indecisive", f"the validator did not start: {outcome.error}")
    if outcome.status == "cancelled":
        return _result("malformed", "indecisive", "the validator was stopped")
    if outcome.exit_code is not None:
        how = f"exit {outcome.exit_code}"
    elif outcome.signal is not None:
        how = f"signal {outcome.signal}"
    else:
        how = outcome.status
    reason = f"the validator failed ({how})"
    line = _first_line(outcome.stderr.text()) or _first_line(outcome.stdout.text())
    return _result("malformed", "reject", f"{reason}: {line}" if line else reason)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


__all__ = [
    "MAX_GROWTH_BYTES",
    "VALIDATOR_PLACEHOLDERS",
    "GateSettings",
    "check_tree",
    "protected_match",
    "run_local_gates",
    "untouchable",
    "validate_protected",
]
