"""Whether a command that never started was the tree's doing: its program is a file of the
tree under test that cannot be run.

A replay template may run a program the candidate carries (``{candidate}/run.sh``). A candidate
that deletes it, drops its executable bit, breaks its ``#!`` line or ships a binary linked for
a loader the host lacks breaks its own replay, like one that makes it exit non-zero: that is
the candidate's failure (its cases score 0), not a spawn the host could not make (left out of
the comparison, the measurement stopped as a shared failure). Found by review: such a candidate
was ``indecisive``, never rejected, its failure blamed on the infrastructure, and under
``--isolation process`` a broken ``#!`` line was so while a confined run (bwrap's own exec)
rejected the same edit.
"""

from __future__ import annotations

import os
import re
import struct
from pathlib import Path
from typing import BinaryIO

from evolane.messages import FailureEvent, ReplayResult

_SHEBANG_BYTES = 256  # the kernel reads at most this much of a "#!" line (BINPRM_BUF_SIZE)
_ELF_HEADERS = 64 * 1024  # the program headers read at most (the kernel takes <= 64 KiB)
_PT_INTERP = 3
_SCRIPT_LEVELS = 5  # the "#!" files an exec follows, one naming the next (fs/exec.c)


TREE_OWNERS = ("task", "candidate")
"""Owners of a failure the tree under test caused, one per arm (`arm_owner`)."""


def arm_owner(arm: str) -> str:
    """Who owns a failure of the tree under test on ``arm``: the candidate, or for the
    baseline the task (its cases are left out, never scored 0)."""
    return TREE_OWNERS[1] if arm == "candidate" else TREE_OWNERS[0]


def unrunnable(program: Path) -> str | None:
    """Why the file ``program`` cannot be run, when the file itself says so: missing, not
    a regular executable file, a ``#!`` line naming an interpreter that cannot be run
    itself (missing, not executable, its own ``#!`` line broken, ``#!`` lines nested deeper
    than the kernel follows), or an ELF file naming a loader that cannot be run (blocking
    I/O). None: it looks runnable."""
    return _fault(program, 0)


def _fault(program: Path, scripts: int) -> str | None:
    """`unrunnable` of ``program``, the interpreter of ``scripts`` ``#!`` files."""
    if not program.is_file():
        return f"{program} is missing (or not a regular file)"
    if not os.access(program, os.X_OK):
        return f"{program} is not executable"
    try:
        with program.open("rb") as file:
            head = file.read(_SHEBANG_BYTES)
    except OSError:
        return None  # unreadable to evolane: the exec's own verdict stands
    if head.startswith(b"\x7fELF"):
        return _elf_fault(program)
    if not head.startswith(b"#!"):
        return None
    if scripts >= _SCRIPT_LEVELS:  # the exec fails ELOOP (found by review)
        return f"{program}: #! interpreters nested deeper than {_SCRIPT_LEVELS}"
    name = _interpreter_name(head)
    if not name:
        return f"{program} has an empty #! line"
    interpreter = Path(os.fsdecode(name))
    if not interpreter.is_absolute():
        return f"{program}: its #! interpreter {interpreter} is not an absolute path"
    if not interpreter.is_file() or not os.access(interpreter, os.X_OK):
        return f"{program}: its #! interpreter {interpreter} is missing or not executable"
    # A script as interpreter runs by its own #! line (found by review: one naming a
    # missing interpreter failed the exec ENOENT, and the host was blamed).
    fault = _fault(interpreter, scripts + 1)
    return None if fault is None else f"{program}: its #! interpreter cannot run: {fault}"


def _elf_fault(program: Path) -> str | None:
    """Why the ELF file ``program`` cannot be run when it names a program interpreter
    (``PT_INTERP``, the dynamic loader) that is missing or not an executable ELF file of its
    machine: the exec fails (ENOENT, ELIBBAD, EACCES) though the file is there (found by
    review: a candidate shipping a binary linked for another loader, a musl one, made every replay
    ``spawn_failed`` under ``--isolation process``, and so the run ``failed``, again on each
    resume). None: it names none, or one that is there, or it cannot be read (the exec's
    verdict stands)."""
    try:
        with program.open("rb") as file:
            head = file.read(_ELF_HEADERS)
            interpreter = _elf_interpreter(head, file)
    except (OSError, struct.error, IndexError):
        return None
    if interpreter is None:
        return None
    path = Path(os.fsdecode(interpreter))
    if not path.is_absolute():  # found from the exec's working folder, the unit's: never there
        return f"{program}: its ELF interpreter {path} is not an absolute path"
    try:
        with path.open("rb") as file:
            its = file.read(20)
    except OSError:
        return f"{program}: its ELF interpreter {path} is missing or unreadable"
    if not path.is_file() or not its.startswith(b"\x7fELF") or not os.access(path, os.X_OK):
        return f"{program}: its ELF interpreter {path} is not an executable ELF file"
    if (its[4:6], its[18:20]) != (head[4:6], head[18:20]):  # class, byte order, machine
        return f"{program}: its ELF interpreter {path} is built for another machine"
    return None


def _elf_interpreter(head: bytes, file: BinaryIO) -> bytes | None:
    """The ``PT_INTERP`` path of the ELF file whose first bytes are ``head`` (read from the
    open ``file`` when it lies further), or None when it names none."""
    wide, order = head[4] == 2, "<" if head[5] == 1 else ">"
    if wide:
        phoff, size, count = struct.unpack_from(f"{order}32xQ14xHH", head)
        layout = f"{order}I4xQ16xQ"  # p_type, p_offset, p_filesz
    else:
        phoff, size, count = struct.unpack_from(f"{order}28xI8xHH", head)
        layout = f"{order}II8xI"
    for index in range(count):
        start = phoff + index * size
        if start + struct.calcsize(layout) > len(head):
            return None
        kind, offset, length = struct.unpack_from(layout, head, start)
        if kind != _PT_INTERP:
            continue
        if length < 2 or length > 4096:  # the kernel refuses these (ENOEXEC): sh runs it
            return None
        file.seek(offset)
        return file.read(length).split(b"\0", 1)[0]
    return None


def _interpreter_name(head: bytes) -> bytes:
    """The interpreter a ``#!`` line names, read as the kernel reads it (binfmt_script):
    the line's first word, words ending at a space, a tab or a NUL only. Any other byte is
    part of the name: a line ``#!/bin/sh\\r`` (a file saved with CRLF line ends) names
    ``/bin/sh\\r``, which is missing (found by review: ``bytes.split`` took it for
    ``/bin/sh`` and the candidate's broken file was blamed on the host)."""
    line = head[2:].split(b"\n", 1)[0].lstrip(b" \t")
    return re.split(b"[ \t\0]", line, maxsplit=1)[0]


def tree_program_fault(argv: tuple[str, ...], tree: Path) -> str | None:
    """Why the program of ``argv`` cannot run, when it is a file of ``tree`` (the tree
    under test, as laid out for the unit) that `unrunnable` finds broken; None when the
    program lies elsewhere or looks runnable (a failure to start it is the host's)."""
    if not argv or not argv[0].startswith("/"):
        return None
    program, root = Path(os.path.normpath(argv[0])), Path(os.path.normpath(tree))
    if program == root or not program.is_relative_to(root):
        return None
    # The file the exec looked for, as given: ``{candidate}/bin/../run.sh`` goes through
    # ``bin`` (the kernel resolves ``..`` after it, a symlink or a missing folder included),
    # not to the ``run.sh`` that normpath names (found by review).
    return unrunnable(Path(argv[0]))


def blame_tree(result: ReplayResult, argv: tuple[str, ...], tree: Path) -> ReplayResult:
    """``result`` of a replay that never started, its failure the tree's (``owner``
    candidate, or task for the baseline; code ``program_unrunnable``) when
    `tree_program_fault` finds its program broken; else ``result`` as it is."""
    fault = tree_program_fault(argv, tree)
    if fault is None:
        return result
    failure = FailureEvent(
        owner=arm_owner(result.arm),  # type: ignore[arg-type]
        stage="replay",
        code="program_unrunnable",
        message=fault[:512],
    )
    return result.model_copy(update={"failure": failure})


JUDGE_PROGRAM_UNRUNNABLE = "judge_program_unrunnable"
"""The code of a judgement whose ``--judge`` program is a file of the tree under test that the
tree broke: the tree's doing (a candidate's unit counts 0), not the host's."""


def judge_program_fault(argv: tuple[str, ...], tree: Path) -> FailureEvent | None:
    """The failure of a ``--judge`` command that never started because its program is a file
    of ``tree`` (the tree under test, as laid out for the unit) that `tree_program_fault`
    finds broken; None when the program lies elsewhere or looks runnable: then the spawn
    failed on the host (a program gone, a broken interpreter), shared by every unit, and
    the measurement stops (`evolane.measure.shared_failure`)."""
    fault = tree_program_fault(argv, tree)
    if fault is None:
        return None
    return FailureEvent(
        owner="infrastructure", stage="judge", code=JUDGE_PROGRAM_UNRUNNABLE, message=fault[:512]
    )


VERIFICATION_PROGRAM_UNRUNNABLE = "verification_program_unrunnable"
"""The code of a judgement whose case's verification command runs a program the replay wrote
(``{output_dir}/check.sh``) that is missing or broken: the tree's doing, not the host's."""


def verification_program_fault(argv: tuple[str, ...], output: Path) -> FailureEvent | None:
    """The failure of a case's verification command that never started because its program
    is a file of the replay's ``output`` folder that `tree_program_fault` finds broken (a
    candidate's unit counts 0); None when the program lies elsewhere: a program missing on
    the host, which every unit of the case meets, and the measurement stops as for a
    ``--judge`` command (found by review: such cases were left out, the run `finished`)."""
    fault = tree_program_fault(argv, output)
    if fault is None:
        return None
    return FailureEvent(
        owner="infrastructure",
        stage="judge",
        code=VERIFICATION_PROGRAM_UNRUNNABLE,
        message=fault[:512],
    )
