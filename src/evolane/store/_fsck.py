"""``evolane fsck``: verify every object of a store, find damaged journal lines, quarantine
bad objects, and name the runs each problem touches (DESIGN §7, issue 17 item 6).

Walks are iterative and bounded by the store's fixed layout (``objects/sha256/<ab>/<hex>``,
``runs/<id>/<file>``): nothing here recurses, however deep a folder someone made inside.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from evolane.messages import JournalRecordError, parse_journal_record
from evolane.store._blobs import CHUNK_SIZE, StoreError, fsync_dir, open_regular_file, read_at_most
from evolane.store._journal import JournalCorruptError, scan_journal
from evolane.store._trees import FileEntry, TreeManifest

RUN_FILES = ("run.json", "report.json", "apply.json", "journal.jsonl")
"""The files of a run folder whose digests say which objects the run uses."""

JOURNALS = ("journal.jsonl", "events.jsonl")
"""The append-only files of a run folder whose lines are checked."""

MANIFEST_SCAN_BYTES = 64 * 1024 * 1024
"""A referenced object up to this size that reads as JSON is searched for the digests it
holds (a tree manifest names its files); larger ones are not searched."""

MAX_MISSING_CHECKED = 1_000_000
"""At most this many distinct referenced objects are looked for (a bound on the walk)."""

_HEX_RE = re.compile(r"^[0-9a-f]{64}$")
_REF_RE = re.compile(rb"sha256:([0-9a-f]{64})")
_ARTIFACT_RE = re.compile(  # a ref's digest, a unit's tree, a report's trees (not the dataset's)
    rb'"(?:digest|tree|parent|best_after)": ?"sha256:([0-9a-f]{64})"'
)
_OVERLAP = 96  # bytes a chunked scan carries over: longer than any match
_VERSION_HINT = ": the store was written by a newer or older evolane"


@dataclass(frozen=True)
class Problem:
    """One damaged thing and the runs that use it. ``kind``: ``object`` (bad bytes, name or
    type: quarantined by a repair), ``mode`` (an intact object left writable: made read-only
    by a repair) or ``journal`` (a damaged line before the last; or a torn last line in a
    finished run, found by `evolane fsck`)."""

    kind: str  # ``missing``: an object a run references is not in the store; ``folder``:
    # a fan-out folder of objects that cannot be listed
    path: Path
    reason: str
    digest: str | None = None
    runs: tuple[str, ...] = ()
    quarantined: Path | None = None


@dataclass
class FsckResult:
    """What `check_store` found: objects checked, and every problem (empty when clean)."""

    root: Path
    objects: int = 0
    problems: list[Problem] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        """True when nothing is damaged."""
        return not self.problems


class WalkTally(Protocol):
    """What `check_store` tells of its walk as it goes (the CLI shows it as progress)."""

    def begin(self, what: str, total: int | None) -> None:
        """``total`` items of ``what`` (None: not known before the walk) come next."""

    def tick(self, count: int = 1, damaged: int = 0) -> None:
        """``count`` more items walked, ``damaged`` more problems found among them."""


RunCheck = Callable[[str], int]
"""A caller's own check of one run folder, by its name (records the store cannot read): it
keeps what it finds and returns how many problems (counted as the walk's damage)."""


def check_store(
    root: Path | str,
    *,
    repair: bool = False,
    per_run: RunCheck | None = None,
    tally: WalkTally | None = None,
) -> FsckResult:
    """Verify every object's digest and every run journal's lines under the store ``root``;
    with ``repair``, move each bad object to ``quarantine/<stamp>/`` inside the store (a
    run that needs it then fails with a clear missing-blob error instead of a wrong one).
    ``per_run`` is called once per run folder as the walk reaches it (the caller lists
    what it finds); ``tally`` is told of each object and run walked, and the damage."""
    root = Path(root)
    result = FsckResult(root)
    bad: list[tuple[Path, str, str]] = []
    if tally is not None:
        tally.begin("objects", None)
    for path, name, unreadable in _object_files(root / "objects" / "sha256"):
        found = len(result.problems) + len(bad)
        if unreadable is not None:  # a fan-out folder not listable: its objects unchecked
            why = f"{unreadable}: its objects were not checked"
            result.problems.append(Problem("folder", path, why))
        else:
            result.objects += 1
            _check_object(result, bad, path, name, repair)
        if tally is not None:
            tally.tick(1, len(result.problems) + len(bad) - found)
    users = _users(root, {name for _, name, _ in bad}) if bad else {}
    quarantine = root / "quarantine" / time.strftime("%Y%m%d-%H%M%S")
    for path, name, reason in bad:
        moved = _quarantine(path, quarantine) if repair else None
        runs = tuple(sorted(users.get(name, ())))
        result.problems.append(Problem("object", path, reason, f"sha256:{name}", runs, moved))
    known = {name for _, name, _ in bad} | _quarantined(root)
    journals = _walk_runs(root, per_run, tally)
    result.problems.extend(_missing_problems(root, known, journals.missing))
    result.problems.extend(journals.problems)
    return result


def _check_object(
    result: FsckResult, bad: list[tuple[Path, str, str]], path: Path, name: str, repair: bool
) -> None:
    """Hash one object: a bad one goes to ``bad``, an intact writable one is a problem."""
    reason = _object_problem(path, name)
    if reason is not None:
        bad.append((path, name, reason))
    elif _writable(path):  # intact, but open to the next overwrite
        if repair:
            os.chmod(path, 0o444)
        fixed = " (made read-only)" if repair else ""
        reason = f"writable: objects are read-only{fixed}"
        result.problems.append(Problem("mode", path, reason, f"sha256:{name}"))


@dataclass
class _RunWalk:
    """What one walk of the run folders gathers: whether each object a run needs is there,
    the runs that need each one that is not, and the journals' problems. Only a missing
    object's runs are kept (found by review: every run's name for every object it uses
    was, the bulk of fsck's memory in a store of many runs)."""

    present: dict[str, bool] = field(default_factory=dict)
    missing: dict[str, set[str]] = field(default_factory=dict)
    within: dict[str, set[str]] = field(default_factory=dict)  # a tree's files, read once
    problems: list[Problem] = field(default_factory=list)


def _walk_runs(root: Path, per_run: RunCheck | None, tally: WalkTally | None) -> _RunWalk:
    """One pass over the run folders: the objects each references, its journals' problems
    and ``per_run``'s (each run's files are read in turn, not once per check)."""
    walk = _RunWalk()
    run_dirs = _run_dirs(root)
    if tally is not None:
        tally.begin("runs", len(run_dirs))
    objects = root / "objects" / "sha256"
    for run_dir in run_dirs:
        found = len(walk.problems)
        _needed_by(run_dir, objects, walk)
        walk.problems.extend(_journal_problems(run_dir))
        own = per_run(run_dir.name) if per_run is not None else 0
        if tally is not None:
            tally.tick(1, len(walk.problems) - found + own)
    return walk


def _object_files(objects: Path) -> Iterator[tuple[Path, str, str | None]]:
    """Every entry two levels under ``objects`` (``<ab>/<name>``), by a flat scan of each
    fan-out folder; anything else at the first level is yielded as itself. A fan-out folder
    that cannot be listed is yielded with why (found by review: its mode made the whole
    check one line, ``cannot be checked: Permission denied``, naming no folder, exit 2)."""
    if not objects.is_dir():
        return
    for fan in sorted(os.scandir(objects), key=lambda e: e.name):
        if not fan.is_dir(follow_symlinks=False):
            yield Path(fan.path), fan.name, None
            continue
        try:
            entries = sorted(os.scandir(fan.path), key=lambda e: e.name)
        except OSError as error:
            yield Path(fan.path), fan.name, error.strerror or str(error)
            continue
        for entry in entries:
            yield Path(entry.path), entry.name, None


def _object_problem(path: Path, name: str) -> str | None:
    """Why the object at ``path`` is bad (one phrase), or None when it hashes to its name."""
    if not _HEX_RE.match(name) or path.parent.name != name[:2]:
        return "not an object of this store (bad name or place)"
    try:
        info = path.lstat()
        if not stat.S_ISREG(info.st_mode):
            return "not a regular file"
        hasher = hashlib.sha256()
        with path.open("rb") as source:
            while chunk := source.read(CHUNK_SIZE):
                hasher.update(chunk)
    except OSError as error:
        return f"unreadable: {error.strerror or error}"
    if hasher.hexdigest() != name:
        return f"its bytes hash to sha256:{hasher.hexdigest()}"
    return None


def _writable(path: Path) -> bool:
    """Whether an intact object can be written (objects are stored read-only, 0444)."""
    try:
        return bool(path.lstat().st_mode & 0o222)
    except OSError:
        return False


def _run_dirs(root: Path) -> list[Path]:
    runs = root / "runs"
    if not runs.is_dir():
        return []
    return sorted(Path(e.path) for e in os.scandir(runs) if e.is_dir(follow_symlinks=False))


def _scan_refs(path: Path, pattern: re.Pattern[bytes]) -> set[str]:
    """The digests ``pattern`` finds in the regular file at ``path``, read a chunk at a time
    (any size, bounded memory; a FIFO is not waited on); empty when it cannot be read."""
    found: set[str] = set()
    try:
        with open_regular_file(path) as source:
            carry = b""
            while chunk := source.read(CHUNK_SIZE):
                data = carry + chunk
                found |= {m.decode() for m in pattern.findall(data)}
                carry = data[-_OVERLAP:]
    except (OSError, StoreError):
        return set()
    return found


def _run_refs(run_dir: Path, pattern: re.Pattern[bytes]) -> set[str]:
    """The digests the files of a run folder name."""
    refs: set[str] = set()
    for name in RUN_FILES:
        refs |= _scan_refs(run_dir / name, pattern)
    return refs


def _users(root: Path, wanted: set[str]) -> dict[str, set[str]]:
    """For each wanted object name, the runs that reference it: directly from a run file,
    or through a referenced tree manifest (one level: manifests are flat)."""
    users: dict[str, set[str]] = {}
    objects = root / "objects" / "sha256"
    for run_dir in _run_dirs(root):
        direct = _run_refs(run_dir, _REF_RE)
        reached = set(direct)
        for digest in direct - wanted:  # intact objects: search the manifests among them
            reached |= _digests_in(objects / digest[:2] / digest)
        for digest in reached & wanted:
            users.setdefault(digest, set()).add(run_dir.name)
    return users


def _digests_in(path: Path) -> set[str]:
    """The digests a JSON object (a tree manifest) names; empty for anything else."""
    data = _small_object(path)
    if data is None or not data.lstrip().startswith(b"{"):
        return set()
    return {m.decode() for m in _REF_RE.findall(data)}


def _small_object(path: Path) -> bytes | None:
    """The bytes of the regular file at ``path`` when it holds at most
    `MANIFEST_SCAN_BYTES`, else None (never waiting on a FIFO)."""
    try:
        with open_regular_file(path) as source:
            if os.fstat(source.fileno()).st_size > MANIFEST_SCAN_BYTES:
                return None
            data = read_at_most(source, MANIFEST_SCAN_BYTES)
    except (OSError, StoreError):
        return None
    return data if len(data) <= MANIFEST_SCAN_BYTES else None


def _manifest_files(path: Path) -> set[str]:
    """The digests of the files of the tree manifest at ``path``; empty when it is none."""
    data = _small_object(path)
    if data is None or not data.lstrip().startswith(b"{"):
        return set()
    try:
        manifest = TreeManifest.from_json(data)
    except (ValueError, StoreError):
        return set()
    files = (e for e in manifest.values() if isinstance(e, FileEntry))
    return {e.digest.removeprefix("sha256:") for e in files}


def _quarantined(root: Path) -> set[str]:
    """The names of the objects an earlier ``--repair`` moved to ``quarantine/<stamp>/``
    (reported then: a run that needs one fails on a missing blob, as it should)."""
    names: set[str] = set()
    folder = root / "quarantine"
    if not folder.is_dir():
        return names
    for stamp in os.scandir(folder):
        if stamp.is_dir(follow_symlinks=False):
            names |= {e.name.partition("-")[2] for e in os.scandir(stamp.path)}
    return names


def _needed_by(run_dir: Path, objects: Path, walk: _RunWalk) -> None:
    """Look for every object the run references (an artifact ref in its records, or a file
    of a tree it references), each once, at most `MAX_MISSING_CHECKED` in all: one that
    is not in the store gets the run added to ``walk.missing``."""
    for digest in _run_refs(run_dir, _ARTIFACT_RE):
        if digest not in walk.present and len(walk.present) >= MAX_MISSING_CHECKED:
            break
        _need(digest, run_dir.name, objects, walk)
        if digest not in walk.within:
            walk.within[digest] = _manifest_files(objects / digest[:2] / digest)
        for inner in walk.within[digest]:
            _need(inner, run_dir.name, objects, walk)


def _need(digest: str, run: str, objects: Path, walk: _RunWalk) -> None:
    if digest not in walk.present:
        walk.present[digest] = os.path.lexists(objects / digest[:2] / digest)
    if not walk.present[digest]:
        walk.missing.setdefault(digest, set()).add(run)


def _missing_problems(
    root: Path, reported: set[str], missing: dict[str, set[str]]
) -> list[Problem]:
    """A problem for every object of ``missing`` (with the runs that need it), but those
    ``reported`` as bad or quarantined."""
    objects = root / "objects" / "sha256"
    return [
        Problem("missing", objects / d[:2] / d, "missing", f"sha256:{d}", tuple(sorted(missing[d])))
        for d in sorted(missing.keys() - reported)
    ]


def _quarantine(path: Path, folder: Path) -> Path:
    """Move a bad object out of the object tree, into ``folder`` (same file system)."""
    folder.mkdir(parents=True, exist_ok=True)
    destination = folder / f"{path.parent.name}-{path.name}"
    os.replace(path, destination)
    fsync_dir(path.parent)
    fsync_dir(folder)
    return destination


def _journal_problems(run_dir: Path) -> list[Problem]:
    """The run's journals with a damaged line before their last (a torn last line is what a
    kill leaves, and is not damage: a resume repairs it), or a record of ``journal.jsonl``
    that does not validate as a journal record (as ``--resume`` reads it). Each file is
    read a line at a time (`scan_journal`): no record is kept."""
    problems = []
    for name in JOURNALS:
        path = run_dir / name
        try:
            reason = _invalid_record(path, name == "journal.jsonl")
        except JournalCorruptError as error:
            reason = str(error)
        except OSError as error:
            reason = f"unreadable: {error.strerror or error}"
        if reason is not None:
            problems.append(Problem("journal", path, reason, runs=(run_dir.name,)))
    return problems


def _invalid_record(path: Path, validate: bool) -> str | None:
    """Why the first record of the journal at ``path`` that is not a valid journal record
    (with ``validate``; else only its lines are read) is not, or None."""
    for line, value in scan_journal(path):
        if not validate:
            continue
        try:
            parse_journal_record(value, f"{path}:{line}")
        except JournalRecordError as error:
            text = str(error)
            return text if "unknown type" in text else text.removesuffix(_VERSION_HINT)
    return None
