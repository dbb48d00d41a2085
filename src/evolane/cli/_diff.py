"""``evolane diff RUN_ID``: the unified diff of a run's best tree (or of one of its
candidates) against the seed, from the trees in the store."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from evolane.cli._exits import fail_usage
from evolane.cli._output import StoreOption, open_store, resolve_run, store_of

if TYPE_CHECKING:
    from evolane.campaign import Report, StoreLayout


def load_finished_report(layout: StoreLayout, run_id: str) -> Report:
    """The report.json of ``run_id`` (exit 2, one line, when it has none or it is unreadable)."""
    from evolane.campaign import Report
    from evolane.store import read_json

    path = layout.run_dir(run_id) / "report.json"
    if not path.is_file():
        fail_usage(f"run {run_id} has no report yet (see `evolane report {run_id}`)")
    try:
        return Report.model_validate(read_json(path))
    except (OSError, ValueError) as error:
        first = str(error).strip().splitlines()
        why = first[0] if first else type(error).__name__
        fail_usage(f"cannot read {path}: {why}; run `evolane fsck --store {layout.root}`")


def candidate_digests(report: Report) -> list[str]:
    """Every candidate tree the run decided on or kept in its funnel, in report order."""
    found = [entry.digest for entry in report.funnel if entry.digest]
    found += [d.digest for d in report.decisions if d.digest]
    return list(dict.fromkeys(found))


def match_candidate(report: Report, prefix: str) -> str:
    """The one candidate digest starting with ``prefix`` (with or without ``sha256:``)."""
    wanted = prefix.lower().removeprefix("sha256:")
    if not wanted:
        fail_usage("--candidate: give a digest prefix (see the decisions of `evolane report`)")
    matches = [d for d in candidate_digests(report) if d.removeprefix("sha256:").startswith(wanted)]
    if not matches:
        fail_usage(f"--candidate {prefix}: no candidate of run {report.run_id} has that digest")
    if len(matches) > 1:
        shown = ", ".join(d[7:19] for d in matches[:5])
        fail_usage(f"--candidate {prefix}: matches {len(matches)} candidates ({shown})")
    return matches[0]


def diff(
    run_id: Annotated[str, typer.Argument(help="The run id (or a prefix of exactly one run).")],
    best: Annotated[
        bool, typer.Option("--best", help="The best tree against the seed (the default).")
    ] = False,
    candidate: Annotated[
        str | None,
        typer.Option("--candidate", help="A candidate's digest prefix (from the decisions)."),
    ] = None,
    store: StoreOption = None,
) -> None:
    """Print the unified diff of the best tree (or a candidate) against the seed.

    On a terminal, control characters of the candidate's names and text (escape sequences
    that erase a line of the diff, set the clipboard or the title: a hidden `curl ... | sh`
    line could read as a harmless one) are shown as U+FFFD; piped, the diff is the stored
    bytes, as `changes.diff` holds them."""
    from evolane.campaign import unified_tree_diff
    from evolane.messages import printable
    from evolane.store import StoreError

    if best and candidate is not None:
        fail_usage("--best and --candidate are exclusive: give one")
    store = store_of(store)
    layout = open_store(store)
    run_id = resolve_run(layout, run_id)
    report = load_finished_report(layout, run_id)
    digest = report.best.digest if candidate is None else match_candidate(report, candidate)
    if digest == report.seed.digest:
        print(f"run {run_id}: the best is the seed (nothing was accepted)", file=sys.stderr)
        return
    try:
        text = unified_tree_diff(layout.blobs(), report.seed, digest)
    except (StoreError, OSError, ValueError) as error:
        where = Path(store) / "objects"
        fail_usage(f"tree {digest[:19]} cannot be read from {where}: {error}")
    if sys.stdout.isatty():  # the candidate's bytes must not drive the terminal
        text = printable(text.decode("utf-8", "replace")).encode("utf-8")
    sys.stdout.buffer.write(text)
    sys.stdout.flush()
