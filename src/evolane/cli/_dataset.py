"""``evolane dataset from-trajectory``: preview the cases ``optimize --from-trajectory``
would run, written as a dataset JSONL file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from evolane.cli._exits import fail_usage

dataset_app = typer.Typer(
    name="dataset",
    help="Datasets: derive one from agent trajectories.",
    no_args_is_help=True,
    add_completion=False,
)


@dataset_app.command(name="from-trajectory")
def from_trajectory(
    paths: Annotated[list[Path], typer.Argument(help="Trajectory JSONL files or folders of them.")],
    output: Annotated[
        Path, typer.Option("-o", "--output", help="Where to write the cases (JSONL).")
    ],
    group: Annotated[
        str | None,
        typer.Option("--group", help="The task family (default: the largest with failures)."),
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the split.")] = 0,
) -> None:
    """Derive the cases of one task family from trajectory files; print the groups, the
    choice and the excluded (context_incomplete) turns."""
    from evolane.inputs import InputError, ingest_trajectories, summary_lines
    from evolane.store import write_bytes_atomic

    try:
        derived = ingest_trajectories(paths, group=group, seed=seed)
    except InputError as error:
        fail_usage(str(error))
    try:
        write_bytes_atomic(output, derived.dataset.canonical_jsonl())
    except OSError as error:
        fail_usage(f"{output}: cannot write: {error.strerror or error}")
    for line in summary_lines(derived.summary):
        typer.echo(line)
    counts = ", ".join(f"{n} {name}" for name, n in derived.dataset.split_counts.items())
    typer.echo(f"wrote {len(derived.dataset)} cases ({counts}) to {output}")
