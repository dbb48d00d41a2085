"""``evolane compare RUN_A RUN_B``: two runs side by side: the settings that differ (and the
main ones), the scores with their CIs, the spend by role and the decisions."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from evolane.cli._diff import load_finished_report
from evolane.cli._output import StoreOption, open_store, resolve_run, store_of, write_json

if TYPE_CHECKING:
    from evolane.campaign import Report, StoreLayout

MAIN_SETTINGS = (
    "target",
    "dataset",
    "iterations",
    "population",
    "gate.gate",
    "feedback_split",
    "seed",
)
"""Settings shown even when the two runs agree on them."""
SCORES = (
    ("val seed", "baseline_val"),
    ("val best", "best_val"),
    ("test seed", "baseline_test"),
    ("test best", "best_test"),
)


def _flat(value: Any, prefix: str = "") -> dict[str, Any]:
    """A nested settings mapping as ``{"gate.k_se": 1.0, ...}``."""
    if isinstance(value, dict):
        found: dict[str, Any] = {}
        for key, inner in value.items():
            found.update(_flat(inner, f"{prefix}{key}."))
        return found
    return {prefix.rstrip("."): value}


def _text(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, list | tuple):
        return ", ".join(str(v) for v in value) or "-"
    return str(value)


def settings_rows(a: Report, b: Report) -> list[tuple[str, str, str]]:
    """(setting, A, B) for the main settings and every one that differs."""
    left = _flat(a.config.model_dump(mode="json"))
    right = _flat(b.config.model_dump(mode="json"))
    keys = [k for k in MAIN_SETTINGS if k in left or k in right]
    keys += sorted(k for k in left.keys() | right.keys() if left.get(k) != right.get(k))
    return [(k, _text(left.get(k)), _text(right.get(k))) for k in dict.fromkeys(keys)]


def score_rows(a: Report, b: Report) -> list[tuple[str, str, str]]:
    """(score, A, B): the seed's and the best's val and test scores with their CIs."""
    from evolane.campaign import ci_text as _ci

    rows = [(name, _ci(getattr(a.scores, f)), _ci(getattr(b.scores, f))) for name, f in SCORES]
    rows.insert(0, ("status", f"{a.status} ({a.wall_text()})", f"{b.status} ({b.wall_text()})"))
    rows.append(("confirmation", _verdict(a), _verdict(b)))
    rows.append(("apply", _applied(a), _applied(b)))
    return rows


def _verdict(report: Report) -> str:
    """The test split's verdict on the best (found by review: side by side, a best the test
    split did not confirm, and so did not publish, read as well as one it did)."""
    from evolane.campaign import p_beside_level

    c = report.confirmation
    if c is None:
        return "-"
    p, level = p_beside_level(c.p_value, c.level)
    return f"{c.decision} (mean {c.mean_delta:+.3f}, p = {p}, level {level})"


def _applied(report: Report) -> str:
    """What the run did with its best: the apply policy and its outcome."""
    return "-" if report.apply is None else f"{report.apply.policy}: {report.apply.status}"


def spend_rows(a: Report, b: Report) -> list[tuple[str, str, str]]:
    """(role, A, B): tokens and cost by role, then the command time (all roles' commands)."""

    from evolane.views import token_count

    def role(report: Report, name: str) -> str:
        usage = report.budget.spent_by_role.get(name)
        if usage is None:
            return "-"
        return f"{token_count(usage.tokens)} tokens, ${usage.cost_usd or 0:.4f}"

    roles = list(dict.fromkeys([*a.budget.spent_by_role, *b.budget.spent_by_role]))
    rows = [(name, role(a, name), role(b, name)) for name in roles]
    wall = [f"{r.budget.spent.wall_seconds or 0:.1f} s" for r in (a, b)]
    return [*rows, ("command time", wall[0], wall[1])]


def decision_rows(a: Report, b: Report) -> list[tuple[str, str, str]]:
    """(slot, A, B): each decision of either run by its cycle, iteration and slot."""

    def by_slot(report: Report) -> dict[str, str]:
        return {
            f"c{d.cycle}.i{d.iteration}.s{d.slot}": f"{d.decision} {d.digest[7:19] or '(no tree)'}"
            for d in report.decisions
        }

    left, right = by_slot(a), by_slot(b)
    order = list(dict.fromkeys([*left, *right]))
    rows = [(slot, left.get(slot, "-"), right.get(slot, "-")) for slot in order]
    best = [r.best.digest[7:19] + (" (the seed)" if r.selected is None else "") for r in (a, b)]
    return [*rows, ("best", best[0], best[1])]


def _dataset_digest(layout: StoreLayout, run_id: str) -> str | None:
    """The digest of the dataset the run read (its run.json's), None when unreadable."""
    from evolane.campaign import load_run

    try:
        return load_run(layout, run_id).dataset_digest
    except (OSError, ValueError):
        return None


def input_rows(
    a: Report, b: Report, datasets: tuple[str | None, str | None]
) -> tuple[list[tuple[str, str, str]], list[str]]:
    """(name, A, B) rows for what each run measured on (the dataset's content, the seed
    tree), and a warning for each that differs: the same path can hold another dataset,
    and side by side its scores read as comparable when they are not (found by review)."""
    short = [("-" if d is None else d[7:19]) for d in datasets]
    seeds = [r.seed.digest[7:19] for r in (a, b)]
    rows = [("dataset content", short[0], short[1]), ("seed tree", seeds[0], seeds[1])]
    warnings = []
    if None not in datasets and datasets[0] != datasets[1]:
        warnings.append(
            "the runs read different datasets (content differs): their scores are not on "
            "the same cases"
        )
    if a.seed.digest != b.seed.digest:
        warnings.append("the runs started from different seed trees")
    return rows, warnings


def comparison(
    a: Report, b: Report, datasets: tuple[str | None, str | None] = (None, None)
) -> dict[str, Any]:
    """The whole comparison as sections of (name, A, B) rows, and its warnings."""
    inputs, warnings = input_rows(a, b, datasets)
    return {
        "runs": [a.run_id, b.run_id],
        "warnings": warnings,
        "settings": settings_rows(a, b) + inputs,
        "scores": score_rows(a, b),
        "spend": spend_rows(a, b),
        "decisions": decision_rows(a, b),
    }


def compare(
    run_a: Annotated[str, typer.Argument(help="The first run (an id or a unique prefix).")],
    run_b: Annotated[str, typer.Argument(help="The second run.")],
    store: StoreOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the comparison as JSON.")] = False,
) -> None:
    """Put two runs side by side: settings, scores, spend by role and decisions."""
    store = store_of(store)
    layout = open_store(store)
    ids = [resolve_run(layout, run) for run in (run_a, run_b)]
    a, b = (load_finished_report(layout, run) for run in ids)
    found = comparison(a, b, (_dataset_digest(layout, ids[0]), _dataset_digest(layout, ids[1])))
    if as_json:
        write_json(
            {
                "runs": found["runs"],
                "warnings": found["warnings"],
                **{
                    part: {name: {"a": left, "b": right} for name, left, right in rows}
                    for part, rows in found.items()
                    if part not in ("runs", "warnings")
                },
            }
        )
        return
    for warning in found["warnings"]:
        print(f"warning: {warning}")
    console = Console(highlight=False)
    if not console.is_terminal:
        _print_plain(found)
        return
    for part in ("settings", "scores", "spend", "decisions"):
        table = Table(title=part, title_justify="left", expand=False)
        table.add_column("", style="bold", no_wrap=True)
        for run in found["runs"]:
            table.add_column(run, overflow="fold")
        for name, left, right in found[part]:
            table.add_row(Text(name), Text(left), Text(right))
        console.print(table)


def _print_plain(found: dict[str, Any]) -> None:
    """Plain aligned columns for a pipe: one section after another."""
    a, b = found["runs"]
    out = sys.stdout
    for part in ("settings", "scores", "spend", "decisions"):
        rows = [("", a, b), *found[part]]
        name_w = max(len(r[0]) for r in rows)
        left_w = max(len(r[1]) for r in rows)
        out.write(f"{part}\n")
        for name, left, right in rows:
            out.write(f"  {name:<{name_w}}  {left:<{left_w}}  {right}\n".rstrip() + "\n")
        out.write("\n")
