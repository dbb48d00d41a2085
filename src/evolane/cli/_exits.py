"""The command line's exit codes (DESIGN §10) and its one-line errors, shared by every command."""

from __future__ import annotations

import errno
import sys
import traceback
from typing import Any, NoReturn

import typer

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE, EXIT_BUDGET, EXIT_INTERRUPTED = 0, 1, 2, 3, 130
"""Finished; an internal error (or a failed run); bad usage or input; the budget ran out;
interrupted (Ctrl-C)."""


def error_words(message: str) -> str:
    """The one-line error the CLI contract asks for, as text: a name in it may come from a
    file or a command (a trajectory folder's file name, a case id), and its control and
    bidirectional characters are shown as U+FFFD, never run (found by review: a trajectory
    file named with an escape sequence set the terminal's title from the error line)."""
    from evolane.messages import printable

    return f"evolane: error: {printable(message)}"


def error_line(message: str) -> None:
    """Print the one-line error the CLI contract asks for."""
    print(error_words(message), file=sys.stderr)


def fail_usage(message: str) -> NoReturn:
    """Print one clear error line and exit with the usage code (2)."""
    typer.echo(error_words(message), err=True)
    raise typer.Exit(EXIT_USAGE)


def flag_problem(error: Any) -> str:
    """A pydantic ``ValidationError`` on config values as one line naming the flag."""
    first = error.errors()[0]
    flag, *within = [str(part) for part in first["loc"]] or ["config"]
    where = f" ({'.'.join(within)})" if within else ""  # e.g. a role of a per-role flag
    message = str(first["msg"]).removeprefix("Value error, ")  # pydantic's, not ours
    return f"--{flag.replace('_', '-')}{where}: {message}"


def broken_entry_points() -> str | None:
    """One line naming the first installed distribution whose ``entry_points.txt`` cannot be
    parsed (the file and the line), or None. Such a file (a hand-made or half-written
    ``.dist-info`` on the path) made ``importlib.metadata.entry_points`` raise inside
    pydantic's plugin loader, and so evolane's start, with a traceback (found by review).
    Asked after an error only: it reads every distribution on the path."""
    from importlib.metadata import distributions

    for dist in distributions():
        try:
            dist.entry_points  # noqa: B018 (parsed here, as the loaders parse it)
        except Exception:  # the parser raises TypeError or ValueError, by version
            folder = getattr(dist, "_path", None)
            where = f"{folder}/entry_points.txt" if folder is not None else "entry_points.txt"
            text = dist.read_text("entry_points.txt") or ""
            number = next(
                (n for n, line in enumerate(text.splitlines(), 1) if _not_an_entry(line)), None
            )
            at = f"{where}:{number}" if number is not None else where
            return (
                f"{at}: not an entry point ('name = module:attr' under a [group]): a broken "
                "distribution on the path (PYTHONPATH, site-packages); fix or remove it"
            )
    return None


def _not_an_entry(line: str) -> bool:
    """Whether ``line`` of an ``entry_points.txt`` is neither blank, a comment, a
    ``[group]`` header nor ``name = value``."""
    text = line.strip()
    if not text or text.startswith(("#", ";")):
        return False
    if text.startswith("[") and text.endswith("]"):
        return False
    return "=" not in text


def name_too_long(error: BaseException) -> str | None:
    """The one-line error for a path given that the file system cannot take (a name over 255
    bytes, a path over 4096: ENAMETOOLONG), else None. Python's ``Path.exists`` raises it,
    so it came up wherever a path was first looked at (found by hostile review: ``--target``,
    ``--store``, ``--config``, ``--expose``, ``init``, ``runs --store``, ``dataset
    from-trajectory -o`` each failed with a traceback, exit 1)."""
    if not isinstance(error, OSError) or error.errno != errno.ENAMETOOLONG:
        return None
    return f"{error.filename}: a file name too long for the file system (over 255 bytes)"


def internal_error(error: BaseException, debug: bool) -> int:
    """Say an unexpected ``error`` in one line (its traceback first with ``--debug``) and
    return the exit code: 2 when a broken distribution's entry points caused it (the line
    names its file: `broken_entry_points`) or a path given is too long (`name_too_long`),
    else 1."""
    if debug:
        traceback.print_exception(error)
    too_long = name_too_long(error)
    if too_long is not None:
        error_line(too_long)
        return EXIT_USAGE
    broken = broken_entry_points()
    if broken is not None:
        error_line(broken)
        return EXIT_USAGE
    error_line(f"internal error: {type(error).__name__}: {error}")
    return EXIT_INTERNAL
