"""``evolane fsck``: verify the store, quarantine bad objects, name the runs they touch."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from evolane.cli._exits import EXIT_INTERNAL, EXIT_OK, fail_usage
from evolane.cli._output import StoreOption, store_of

if TYPE_CHECKING:
    from evolane.store import Problem

EXIT_DAMAGED = EXIT_INTERNAL
"""``fsck``'s exit code when it found damage (repaired or not); 0 means clean."""


def fsck(
    store: StoreOption = None,
    repair: Annotated[
        bool,
        typer.Option(
            "--repair",
            help="Move bad objects to quarantine/ inside the store; make objects read-only.",
        ),
    ] = False,
) -> None:
    """Verify every object's digest and every run journal; exit 0 when clean, 1 on damage."""
    from evolane.store import check_store

    store = store_of(store)
    if not store.is_dir():
        fail_usage(f"--store {store}: no evolane store there")
    try:
        result = check_store(store, repair=repair)
    except OSError as error:
        fail_usage(f"--store {store}: cannot be checked: {error.strerror or error}")
    for line in report_lines(result.problems):
        typer.echo(line)
    found = len(result.problems)
    summary = f"{result.objects} objects checked in {store}: "
    if not found:
        typer.echo(summary + "clean")
        raise typer.Exit(EXIT_OK)
    hint = "" if repair else " (run with --repair to quarantine bad objects)"
    typer.echo(summary + f"{found} problem{'s' if found != 1 else ''} found{hint}")
    raise typer.Exit(EXIT_DAMAGED)


def report_lines(problems: list[Problem]) -> list[str]:
    """One plain line per problem: what and where, why, which runs use it, where it went."""
    lines = []
    for problem in problems:
        what = {"object": "bad object", "mode": "object", "journal": "damaged journal"}
        line = f"{what.get(problem.kind, problem.kind)} {problem.path}: {problem.reason}"
        if problem.runs:
            line += f"; used by run {', '.join(problem.runs)}"
        elif problem.kind == "object":
            line += "; no run uses it"
        if problem.quarantined is not None:
            line += f"; moved to {problem.quarantined}"
        lines.append(line)
    return lines
