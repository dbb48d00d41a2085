"""``evolane plugins``: what a ``--replay``/``--judge``/``--optimizer NAME:ARGS`` or an
``--observer NAME`` can name here, group by group, with who ships it."""

from __future__ import annotations

import sys
from typing import Annotated

import orjson
import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from evolane.cli._exits import EXIT_OK

_USE = {
    "evolane.backends": "--replay NAME:ARGS",
    "evolane.judges": "--judge NAME:ARGS",
    "evolane.optimizers": "--optimizer NAME:ARGS",
    "evolane.observers": "--observer NAME",
    "evolane.agents": "--optimizer agent:NAME",
}
"""How each group's entries are used on the command line (the order they are listed in)."""


def plugins(
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON.")] = False,
) -> None:
    """List installed backends, judges, optimizers and observers (built-ins included)."""
    from evolane.lanes import installed_plugins
    from evolane.messages import printable

    found = installed_plugins()
    if as_json:
        rows = [
            {
                "group": p.group,
                "name": p.name,
                "target": p.target,
                "distribution": p.distribution,
                "version": p.version,
                "builtin": p.builtin,
                "shadowed": p.shadowed,
                "missing_extra": p.missing or None,
            }
            for p in found
        ]
        sys.stdout.write(orjson.dumps({"plugins": rows}, option=orjson.OPT_INDENT_2).decode())
        sys.stdout.write("\n")
        raise typer.Exit(EXIT_OK)
    console = Console(highlight=False)
    for group, use in _USE.items():
        table = Table(title=f"{group}  ({use})", title_justify="left")
        for column in ("name", "module:attr", "distribution", "version"):
            table.add_column(column, overflow="fold")
        entries = [p for p in found if p.group == group]
        for p in entries:
            name = f"{p.name} (built-in)" if p.builtin else p.name
            name += " (shadowed by the built-in: unused)" if p.shadowed else ""
            name += f" (needs pip install 'evolane[{p.missing}]')" if p.missing else ""
            cells = (name, p.target, p.distribution, p.version)  # a package's words: text
            table.add_row(*(Text(printable(cell)) for cell in cells))
        if entries:
            console.print(table)
        else:
            console.print(f"{group}  ({use}): none installed", markup=False)
    raise typer.Exit(EXIT_OK)
