"""``evolane init [DIR]``: write a working starter project and print the command that runs it.

The project (`evolane.cli._starter`): ``skill/`` (the target), ``dataset.jsonl`` (train, val
and test cases), ``scripts/`` (replay, judge, optimizer) and ``evolane.toml``. A folder that
already holds an ``evolane.toml``, or any of the files to write, is refused (exit 2).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Annotated

import typer

from evolane.cli._exits import EXIT_OK, fail_usage


def is_script(path: str) -> bool:
    """Whether the program at ``path`` is a script (``#!``), e.g. a pyenv or asdf shim that
    needs its manager's folders, which a confined command does not see."""
    try:
        with open(path, "rb") as program:
            return program.read(2) == b"#!"
    except OSError:
        return False


def python_program() -> str:
    """How the starter's templates start Python: ``python3`` when PATH finds a real
    interpreter there, else the absolute path of one (a shim does not run confined)."""
    found = shutil.which("python3")
    if found is not None and not is_script(found):
        return "python3"
    for path in ("/usr/bin/python3", "/usr/local/bin/python3", os.path.realpath(sys.executable)):
        if os.access(path, os.X_OK) and not is_script(path):
            return path
    return "python3"


def _files(root: Path) -> dict[Path, str]:
    from evolane.cli import _starter

    scripts = root / "scripts"
    return {
        root / "skill" / "greetings.txt": _starter.SKILL,
        root / "dataset.jsonl": _starter.dataset_text(),
        scripts / "replay.py": _starter.REPLAY,
        scripts / "judge.py": _starter.JUDGE,
        scripts / "optimize.py": _starter.OPTIMIZER,
        root / "evolane.toml": _starter.config_text(str(scripts), python_program()),
    }


def _refusal(root: Path) -> str | None:
    """Why ``root`` cannot take a starter project, or None."""
    if root.exists() and not root.is_dir():
        return f"{root}: not a folder"
    config = root / "evolane.toml"
    if config.exists():
        return f"{config} already exists: this folder already holds an evolane project"
    taken = [path for path in _files(root) if os.path.lexists(path)]
    taken += [root / name for name in ("skill", "scripts") if os.path.lexists(root / name)]
    if taken:
        return f"{taken[0]} already exists: choose an empty folder (evolane init NEW_DIR)"
    return None


def _write(files: dict[Path, str]) -> None:
    """Write ``files`` (each new: an existing one is never overwritten), or none of them: on
    an error the files and folders made so far are removed and the error is one line, exit 2
    (found by review: an unwritable folder was a traceback, and a write that failed midway
    left a partial project that the next ``init`` refused as already there)."""
    made: list[Path] = []
    try:
        for path, text in files.items():
            missing = [folder for folder in path.parents if not folder.exists()]
            for folder in reversed(missing):
                folder.mkdir()
                made.append(folder)
            with open(path, "x", encoding="utf-8") as file:
                made.append(path)
                file.write(text)
    except (OSError, UnicodeEncodeError) as error:  # the latter: a folder not UTF-8 named
        for done in reversed(made):
            with contextlib.suppress(OSError):
                done.rmdir() if done.is_dir() and not done.is_symlink() else done.unlink()
        if isinstance(error, UnicodeEncodeError):  # found by hostile review: a traceback
            fail_usage(f"init: cannot write {path}: its folder's name is not UTF-8 text")
        where = error.filename or (made[-1] if made else "the folder")
        fail_usage(f"init: cannot write {where}: {error.strerror or error}")


def _folder(text: str) -> Path:
    """DIR as a path; an empty one (an unset ``"$DIR"``) is refused, not taken as the current
    folder (found by review: ``init ""`` wrote the project here, unasked)."""
    if not str(text).strip():
        raise typer.BadParameter("empty: name the folder (or give none for this one)")
    return Path(text)


def init(
    directory: Annotated[
        Path,
        typer.Argument(
            help="The folder to write the project in (default: this one).",
            show_default=False,
            parser=_folder,
            metavar="DIR",
        ),
    ] = Path("."),
) -> None:
    """Write a starter project (skill, dataset, replay, judge, optimizer, evolane.toml)."""
    root = directory.absolute()
    try:
        problem = _refusal(root)
    except OSError as error:  # found by hostile review: a name too long was a traceback
        problem = f"{root}: {error.strerror or error}"
    if problem is not None:
        fail_usage(f"init: {problem}")
    files = _files(root)
    _write(files)
    print(f"wrote a starter project in {root}:")
    for path in files:
        print(f"  {path.relative_to(root)}")
    here = Path.cwd().absolute()
    prefix = "" if root == here else f"cd {shlex.quote(str(directory))} && "
    print("check it (host, inputs, one real replay and judge):")
    print(f"  {prefix}evolane doctor")
    print("run it (a campaign of about half a minute that accepts better skills):")
    print(f"  {prefix}evolane optimize")
    raise typer.Exit(EXIT_OK)
