"""What the read-only commands (``report``, ``runs``) share: the ``--store`` option and the
formatting of their output (JSON, times, numbers, a console that keeps ids whole)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import orjson
import typer
from rich.console import Console

DEFAULT_STORE = Path(".evolane")
"""The store a command reads when ``--store`` is not given."""

StoreOption = Annotated[
    Path, typer.Option("--store", help="The store directory.", show_default=True)
]


def write_json(value: Any) -> None:
    """Print ``value`` as indented JSON on stdout."""
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def stamp(seconds: float | None, spec: str = "%Y-%m-%d %H:%M:%S") -> str:
    """A local time of day for an epoch time, ``-`` when there is none."""
    if not seconds:
        return "-"
    return time.strftime(spec, time.localtime(seconds))


def wide_console() -> Console:
    """A console; output that is not a terminal is not folded at 80 columns (ids stay whole)."""
    console = Console()
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console.width = max(console.width, 160)
    return console


def number(value: float | None, spec: str = ".3f") -> str:
    """``value`` formatted by ``spec``, ``-`` when there is none."""
    return "-" if value is None else format(value, spec)
