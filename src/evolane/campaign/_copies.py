"""Copies of the held-out cases in the folders a run's commands are shown, masked before it
starts (README "Honest splits").

A confined command sees the folders its template names and those ``--expose`` and
``--expose-rw`` grant, its program's prefix, and evolane's interpreter's folders (its
prefixes and what is on its ``sys.path``: the root of a project installed editable). The
dataset and the store are masked there, but a copy of the cases was not: the trajectory log
the dataset came from, a backup or a CSV export beside the ``agent.py`` a replay names let a
candidate read the val and test answers and pass the gate and the confirmation (found by
holdout review). Before anything runs, every such folder is walked (iteratively, capped:
`MAX_FILES`, `MAX_DEPTH`, `MAX_FILE_BYTES`, `MAX_TOTAL_BYTES`; the hidden paths, VCS
metadata and installed code, evolane's own included, skipped, symlinks never followed) and
each file is matched against distinctive strings of the held-out cases (`held_out_tokens`).
A file holding `MIN_CASES` of them is masked from every command as the dataset is (the
judge reads the expected outputs from its ``{case_file}``); without confinement, nothing can
be masked and a warning says so. A folder the caps cut short is said, never passed over silently.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import stat
import sys
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import orjson

from evolane.campaign._config import CampaignConfig
from evolane.campaign._gates import GateSettings
from evolane.campaign._splits import SplitPlan, legacy_plan, split_ids
from evolane.campaign._vcs import VCS_FOLDERS
from evolane.inputs import (
    ALL_PLACEHOLDERS,
    Case,
    CommandTemplate,
    Dataset,
    InputError,
    TemplateError,
)
from evolane.lanes import optimizer_command
from evolane.measure import CommandRole, split_grant
from evolane.sandbox import (
    interpreter_folders,
    interpreter_prefixes,
    outermost,
    program_folders,
    resolve_isolation,
    template_paths,
    within,
)
from evolane.store import NotRegularFileError, open_regular_file

MIN_TOKEN = 16
"""Characters a string of a case must have to be matched: "yes" or "4" is in every folder."""
MIN_CASES = 3
"""Held-out cases a file, or the files of one folder together, must hold to be copies
(fewer when val and test hold fewer)."""
SKIPPED = VCS_FOLDERS | {"__pycache__", "node_modules", "site-packages", "dist-packages"}
"""Folders never walked (with a Python's standard library: a ``python3.X`` folder holding
``os.py``): compressed objects and installed code, thousands of files no copy is kept in."""
INSTALL_MARKS = frozenset({"pyvenv.cfg", "conda-meta"})
"""What a virtual or conda environment's folder holds (the running interpreter's prefixes
are installs too, marked or not)."""
INSTALL_TREES = frozenset({"bin", "include", "lib", "lib32", "lib64", "share", "pkgs"})
"""An install's own folders, not walked: the rest of it is (a project made its virtual
environment at its root: ``python -m venv .``; found by review)."""
MAX_FILES = 50_000
MAX_DEPTH = 32
MAX_FILE_BYTES = 128 << 20
MAX_TOTAL_BYTES = 1 << 30
MAX_COPIES = 64
"""Files masked at most: more is refused (a folder of copies belongs out of sight)."""
MAX_LINES = 3
"""Preflight lines about copies at most (the rest summed up in the last), besides one
about the folders the caps cut short."""
BLOCK_BYTES = 4 << 20
_SEPARATORS = b"\"'\\,:;=<>{}[]|`\x7f" + bytes(range(0x20))
"""What splits a text into the strings matched: what JSON, CSV, YAML, Markdown or a
Python repr escape or put between fields, so a string comes out the same from each."""
_SPLIT = bytes(10 if byte in _SEPARATORS else byte for byte in range(256))
"""Every separator made a newline (`bytes.translate`): one ``split`` then cuts at each."""
_CUT = (b"\n", b'"', b",")
"""Where a block read is cut (separators a long file has), so no string is split."""
_HELD_OUT = ("val", "test")
_MAX_LEAVES = 10_000
"""String values of one case's input or expected output looked at, at most."""


@dataclass
class Scan:
    """What the walk found: each file holding held-out cases (path, how many), and each
    folder it could not scan whole (folder, why)."""

    copies: list[tuple[str, int]] = field(default_factory=list)
    partial: dict[str, str] = field(default_factory=dict)
    files: int = 0
    read: int = 0


def mask_held_out_copies(
    config: CampaignConfig, dataset: Dataset, splits: dict[str, tuple[str, ...]]
) -> tuple[CampaignConfig, list[str]]:
    """``config`` with every copy of the held-out cases (``splits``: case ids by split as
    measured) found in its commands' folders hidden from every command, and the preflight
    lines saying what was found; `InputError` when a template names a copy itself."""
    folders = shown_folders(config)
    tokens = held_out_tokens(dataset, splits) if folders else {}
    if not tokens:
        return config, []
    needed = min(MIN_CASES, len(set(tokens.values())))
    scan = scan_folders(folders, config.run_commands.hidden, tokens, needed)
    if len(scan.copies) > MAX_COPIES:
        raise InputError(
            f"{len(scan.copies)} files in the folders commands are shown hold val/test cases "
            f"(first {scan.copies[0][0]}): move them out of those folders"
        )
    level, _ = resolve_isolation(config.commands.isolation)
    masked = tuple(path for path, _ in scan.copies)
    if level == "confined" and masked:
        _check_not_named(config, masked)
        commands = config.commands.model_copy(update={"hidden": masked})
        config = config.model_copy(update={"commands": commands})
    return config, _lines(scan, level == "confined")


def held_out_tokens(dataset: Dataset, splits: dict[str, tuple[str, ...]]) -> dict[bytes, int]:
    """Each distinctive string of a val or test case (at least `MIN_TOKEN` characters, of
    one held-out case only, in no train case) and the case's place among them."""
    held = [case_id for name in _HELD_OUT for case_id in splits.get(name, ())]
    owner: dict[bytes, int] = {}
    seen: Counter[bytes] = Counter()
    for place, case_id in enumerate(held):
        for token in _case_tokens(dataset.by_id(case_id)):
            owner[token] = place
            seen[token] += 1
    for case_id in splits.get("train", ()):
        seen.update(dict.fromkeys(_case_tokens(dataset.by_id(case_id)), 2))
    return {token: place for token, place in owner.items() if seen[token] == 1}


def _case_tokens(case: Case) -> set[bytes]:
    """The strings of a case's input and expected output as a file may hold them: each
    string value as it is and as JSON writes it (escaped)."""
    found: set[bytes] = set()
    for value in (case.input, case.expected_output):
        if value is None:
            continue
        texts = [orjson.dumps(value)]
        pending, looked = [value], 0
        while pending and looked < _MAX_LEAVES:
            item = pending.pop()
            looked += 1
            if isinstance(item, str):
                texts.append(item.encode())
            elif isinstance(item, dict):
                pending.extend(item.values())
            elif isinstance(item, list):
                pending.extend(item)
        for text in texts:
            found.update(_tokens(text))
    return found


def _tokens(text: bytes) -> Iterator[bytes]:
    """The strings of ``text`` between separators, spaces around them cut, long enough."""
    for piece in text.translate(_SPLIT).split(b"\n"):
        if len(piece) >= MIN_TOKEN and len(token := piece.strip(b" ")) >= MIN_TOKEN:
            yield token


@dataclass(frozen=True)
class _Wanted:
    """The strings looked for, each also with a space before, after, or both (``a, b``,
    ``key: value``: a file's strings are then looked up as they are, in one set
    intersection), and the case each is of."""

    strings: frozenset[bytes]
    case: dict[bytes, int]

    @classmethod
    def of(cls, tokens: dict[bytes, int]) -> _Wanted:
        case = {
            spelling: place
            for token, place in tokens.items()
            for spelling in (token, b" " + token, token + b" ", b" " + token + b" ")
        }
        return cls(frozenset(case), case)

    def found(self, block: bytes) -> Iterator[int]:
        """The cases whose strings ``block`` holds."""
        for string in self.strings.intersection(block.translate(_SPLIT).split(b"\n")):
            yield self.case[string]


def shown_folders(config: CampaignConfig) -> tuple[str, ...]:
    """The folders (or files) some command of ``config`` is shown from the host: those its
    templates name, ``--expose``/``--expose-rw``, its program's prefix, and the running
    interpreter's folders (`interpreter_folders`: a flat project installed editable has
    its whole root on ``sys.path``; found by review)."""
    commands = config.run_commands
    shown: list[str] = [*interpreter_folders()]
    for role, text in _templates(config):
        template = None
        if text:
            with contextlib.suppress(TemplateError, ValueError):
                template = CommandTemplate.parse(text, role=role, allowed=ALL_PLACEHOLDERS)
        view = commands.view(role, template)
        shown += [*view.read_only, *view.read_write, *_program_prefix(template)]
    return outermost(os.path.realpath(path) for path in shown if os.path.lexists(path))


def _program_prefix(template: CommandTemplate | None) -> list[str]:
    """The folders a confined command is shown for the program it runs (its prefix:
    ``/proj`` for ``/proj/bin/agent``; `evolane.sandbox.program_folders`)."""
    if template is None or not template.argv or "{" in template.argv[0]:
        return []
    program = template.argv[0]
    if "/" in program and not program.startswith("/"):
        return []  # relative to the command's own workspace, not the host's
    found = program if program.startswith("/") else shutil.which(program)
    return program_folders(found) if found else []


def _templates(config: CampaignConfig) -> Iterator[tuple[CommandRole, str | None]]:
    """Each role's command template text (None where the role has none)."""
    yield "replay", config.measure.replay
    yield "judge", config.measure.judge
    yield "optimizer", optimizer_command(config.propose.optimizer)
    yield "validator", config.validator
    yield "check", config.check


def _check_not_named(config: CampaignConfig, copies: tuple[str, ...]) -> None:
    """`InputError` when a template or a grant names a copy itself: masked, its command
    would read nothing (unconfined, the warning line says it is readable)."""
    real = {os.path.realpath(path) for path in copies}
    named = [
        (f"--{role}", path)
        for role, text in _templates(config)
        for path in template_paths([text] if text else [])
    ]
    commands = config.commands
    for flag, grants in (("--expose", commands.expose), ("--expose-rw", commands.expose_rw)):
        named += [(flag, split_grant(grant)[1]) for grant in grants]
    for flag, path in named:
        if os.path.realpath(path) in real:
            raise InputError(
                f"{flag} names {path}, which holds val/test cases: a command shown it could "
                "read the answers; give the judge the expected outputs through {case_file}, "
                "and move the file out of the folders commands are shown"
            )


def scan_folders(
    folders: Iterable[str], hidden: Iterable[str], tokens: dict[bytes, int], needed: int
) -> Scan:
    """Walk ``folders`` (capped; ``hidden`` skipped) for files holding at least ``needed``
    of the cases ``tokens`` names, or any of them when their folder's files hold as many
    together (a trajectory a file: found by review of this scan)."""
    scan = Scan()
    skip = {os.path.realpath(path) for path in hidden} | evolane_packages()
    wanted = _Wanted.of(tokens)
    found: dict[str, set[int]] = {}
    prefixes = {os.path.realpath(prefix) for prefix in interpreter_prefixes()}
    for top in folders:
        for path, size in _files(top, skip, scan, prefixes):
            if size > MAX_TOTAL_BYTES - scan.read:
                scan.partial.setdefault(top, f"over {MAX_TOTAL_BYTES >> 20} MiB read in all")
                if scan.read >= MAX_TOTAL_BYTES:
                    break
            elif size > MAX_FILE_BYTES:
                scan.partial.setdefault(
                    top, f"{os.path.relpath(path, top)} is over {MAX_FILE_BYTES >> 20} MiB"
                )
            held = _cases_in_file(path, wanted, scan)
            if held:
                found[path] = held
    by_folder: dict[str, set[int]] = {}
    for path, held in found.items():
        by_folder.setdefault(os.path.dirname(path), set()).update(held)
    for path, held in found.items():  # a folder of one session a file holds them together
        if len(held) >= needed or len(by_folder[os.path.dirname(path)]) >= needed:
            scan.copies.append((path, len(held)))
    return scan


def evolane_packages() -> set[str]:
    """evolane's own package folders (this one, and one on ``sys.path`` elsewhere): installed
    code, never walked, as site-packages is. Installed editable, its folder is on
    ``sys.path`` (shown to every command), and its example's case generator
    (``examples/selfevolve/_cases.py``) holds the traces walk-through's own held-out cases:
    the scan masked it, and every replay of the README's walk-through failed to import
    evolane (found by review)."""
    found = {os.path.realpath(os.path.dirname(os.path.dirname(__file__)))}
    for entry in sys.path:
        package = os.path.join(entry or os.getcwd(), "evolane")
        if os.path.isfile(os.path.join(package, "__init__.py")):
            found.add(os.path.realpath(package))
    return found


def _files(top: str, skip: set[str], scan: Scan, prefixes: set[str]) -> Iterator[tuple[str, int]]:
    """Each regular file under ``top`` (``top`` itself when a file) with its size, walked
    iteratively without following symlinks, installed code left out (``prefixes``: the
    interpreter's); a cap reached is noted in ``scan.partial``."""
    parent = os.path.dirname(top)
    marks = [name for name in INSTALL_MARKS if os.path.lexists(os.path.join(parent, name))]
    if _left_out(top, os.path.basename(top), _install(parent, marks, prefixes)):
        return
    pending = [(top, 0)]
    while pending:
        folder, depth = pending.pop()
        if any(within(folder, hidden) for hidden in skip):
            continue
        try:
            info = os.lstat(folder)
        except OSError:
            continue
        if stat.S_ISREG(info.st_mode):
            scan.files += 1
            yield folder, info.st_size
            continue
        if not stat.S_ISDIR(info.st_mode):
            continue
        if depth >= MAX_DEPTH:
            scan.partial.setdefault(top, f"folders deeper than {MAX_DEPTH}")
            continue
        try:
            with os.scandir(folder) as listing:
                entries = list(listing)
        except OSError:
            continue
        install = _install(folder, (entry.name for entry in entries), prefixes)
        for entry in entries:
            if entry.path in skip or _left_out(entry.path, entry.name, install):
                continue
            if scan.files >= MAX_FILES:
                scan.partial.setdefault(top, f"over {MAX_FILES} files")
                return
            with contextlib.suppress(OSError):
                if entry.is_dir(follow_symlinks=False):
                    pending.append((entry.path, depth + 1))
                elif entry.is_file(follow_symlinks=False):
                    scan.files += 1
                    yield entry.path, entry.stat(follow_symlinks=False).st_size


def _install(folder: str, names: Iterable[str], prefixes: set[str]) -> bool:
    """Whether ``folder``, holding ``names``, is a Python install: a virtual or conda
    environment, or a prefix of the running interpreter."""
    return folder in prefixes or not INSTALL_MARKS.isdisjoint(names)


def _left_out(path: str, name: str, in_install: bool) -> bool:
    """Whether the walk leaves ``path`` out: `SKIPPED`, an install's own folder
    (`INSTALL_TREES`) or a standard library (a ``python3.X`` folder holding ``os.py``)."""
    if name in SKIPPED or (in_install and name in INSTALL_TREES):
        return True
    return name.startswith(("python", "pypy")) and os.path.lexists(os.path.join(path, "os.py"))


def _cases_in_file(path: str, wanted: _Wanted, scan: Scan) -> set[int]:
    """The cases ``wanted`` that the first `MAX_FILE_BYTES` of ``path`` hold."""
    held: set[int] = set()
    left = min(MAX_FILE_BYTES, MAX_TOTAL_BYTES - scan.read)
    rest = b""
    try:
        with open_regular_file(path) as handle:
            while left > 0 and (chunk := handle.read(min(BLOCK_BYTES, left))):
                left -= len(chunk)
                scan.read += len(chunk)
                block = rest + chunk
                end = max(block.rfind(cut) for cut in _CUT) + 1 or len(block)
                rest = block[end:] if left > 0 else b""
                held.update(wanted.found(block[:end]))
            held.update(wanted.found(rest))
    except (OSError, NotRegularFileError):
        pass  # a FIFO, a socket or a file gone: nothing to read
    return held


def _lines(scan: Scan, masked: bool) -> list[str]:
    """The preflight lines: each copy (masked, or a warning when it cannot be), then the
    folders the caps cut short."""
    lines = []
    for path, count in scan.copies[: MAX_LINES - 1]:
        cases = f"{count} val/test case{'s' if count != 1 else ''}"
        if masked:
            lines.append(f"{path} holds {cases}: masked from every command, as the dataset is")
        else:
            lines.append(
                f"warning: {path} holds {cases} and every command can read "
                "it (no confinement masks it): move it out of the folders commands are "
                "shown, or run with --isolation confined"
            )
    more = scan.copies[MAX_LINES - 1 :]
    if more:
        how = "masked as well" if masked else "readable by every command as well"
        lines.append(f"{len(more)} more files hold val/test cases: {how}")
    if scan.partial:  # one line, however many folders: the preflight's lines are few
        top, why = next(iter(scan.partial.items()))
        others = len(scan.partial) - 1
        also = f" (and {others} more folder{'s' if others != 1 else ''})" if others else ""
        lines.append(
            f"{top}{also} was not scanned whole for copies of the val/test cases ({why}): a "
            "copy there is not masked"
        )
    return lines


def mask_for_run(
    config: CampaignConfig, gates: GateSettings, dataset: Dataset, plan: SplitPlan | None
) -> tuple[CampaignConfig, GateSettings, list[str]]:
    """`mask_held_out_copies` for a run whose splits are ``plan`` (None: the dataset's),
    with ``gates`` running the validator under the same masks."""
    in_file = split_ids(dataset)
    measured = (plan or legacy_plan(in_file)).splits(in_file)
    config, lines = mask_held_out_copies(config, dataset, measured)
    return config, dataclasses.replace(gates, commands=config.run_commands), lines
