"""``evolane dataset from-trajectory``: preview the cases ``optimize --from-trajectory``
would run, written as a dataset JSONL file."""

from __future__ import annotations

import os
import stat
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

    source = _input_at(output, paths)
    if source is not None:
        fail_usage(f"-o {output}: it is an input ({source}); write the cases elsewhere")
    try:
        derived = ingest_trajectories(paths, group=group, seed=seed)
    except InputError as error:
        fail_usage(str(error))
    aside = _is_stdout(output)
    try:
        _write_output(output, derived.dataset.canonical_jsonl())
    except OSError as error:
        fail_usage(f"{output}: cannot write: {error.strerror or error}")
    for line in summary_lines(derived.summary):
        typer.echo(line, err=aside)
    counts = ", ".join(f"{n} {name}" for name, n in derived.dataset.split_counts.items())
    typer.echo(f"wrote {len(derived.dataset)} cases ({counts}) to {output}", err=aside)


def _is_stdout(path: Path) -> bool:
    """Whether ``path`` names this process's standard output, a pipe or a device (``-o
    /dev/stdout | ...``): the summary then goes to standard error, not into the cases
    (found by review: the groups and the "wrote" line were read as bad cases)."""
    try:
        named, ours = path.stat(), os.fstat(1)
    except OSError:
        return False
    return not stat.S_ISREG(named.st_mode) and os.path.samestat(named, ours)


def _write_output(path: Path, data: bytes) -> None:
    """Write ``data`` where ``-o`` names: a file (or a new one) is replaced atomically, through
    a symlink its target; a device or a pipe (``/dev/stdout``, a FIFO) is written to, never
    replaced: the atomic rename put a regular file in place of ``/dev/full`` (as root; found
    by review), and of a symlink rather than the file it names."""
    from evolane.store import write_bytes_atomic

    try:
        mode: int | None = path.stat().st_mode
    except FileNotFoundError:
        mode = None
    if mode is not None and not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        with open(path, "wb") as out:
            out.write(data)
        return
    write_bytes_atomic(path.resolve() if path.is_symlink() else path, data)


def _input_at(output: Path, paths: list[Path]) -> Path | None:
    """The input ``output`` would overwrite: one of ``paths``, or a trajectory file in a
    folder of them (found by review: ``-o`` naming the trajectory file replaced it)."""
    if not output.exists():
        return None
    for path in paths:
        if path.is_dir():
            inside = output.resolve().is_relative_to(path.resolve())
            if inside and output.suffix in (".jsonl", ".ndjson"):
                return path
        elif path.exists() and os.path.samefile(path, output):
            return path
    return None
