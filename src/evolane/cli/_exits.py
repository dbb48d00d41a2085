"""The command line's exit codes (DESIGN §10) and its one-line errors, shared by every command."""

from __future__ import annotations

import sys
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
    return f"--{flag.replace('_', '-')}{where}: {first['msg']}"
