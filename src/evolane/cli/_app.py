"""The `evolane` command line: a thin typer client of the runtime's public API."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated, NoReturn

import orjson
import trio
import typer
from rich.console import Console
from rich.table import Table
from typer.exceptions import TyperException

if TYPE_CHECKING:
    from evolane.stress import StressReport

EXIT_OK, EXIT_INTERNAL, EXIT_USAGE = 0, 1, 2

app = typer.Typer(
    name="evolane",
    help="Run self-evolve optimisation campaigns fast, within hard budgets, leaving nothing.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def fail_usage(message: str) -> NoReturn:
    """Print one clear error line and exit with the usage code (2)."""
    typer.echo(f"evolane: error: {message}", err=True)
    raise typer.Exit(EXIT_USAGE)


@app.command()
def stress(
    actors: Annotated[int, typer.Option(help="Actors in the supervision tree.")] = 2000,
    messages: Annotated[int, typer.Option(help="Messages to send in all.")] = 200_000,
    faults: Annotated[
        float, typer.Option(help="Fraction of messages whose handler crashes.")
    ] = 0.01,
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule.")] = 0,
    quick: Annotated[
        bool, typer.Option("--quick", help="A small case that runs in seconds.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Load a supervision tree with messages and crashes; check that no message is lost."""
    if quick:
        actors, messages = min(actors, 200), min(messages, 20_000)
    if actors < 1:
        fail_usage(f"--actors must be at least 1, got {actors}")
    if messages < 1:
        fail_usage(f"--messages must be at least 1, got {messages}")
    if not 0.0 <= faults <= 1.0:
        fail_usage(f"--faults must lie in [0, 1], got {faults}")
    if seed < 0:
        fail_usage(f"--seed must not be negative, got {seed}")
    from evolane.stress import StressConfig, run_actor_stress

    config = StressConfig(actors=actors, messages=messages, faults=faults, seed=seed)
    report = trio.run(run_actor_stress, config)
    if as_json:
        sys.stdout.write(
            orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode()
        )
        sys.stdout.write("\n")
    else:
        _print_stress(report)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_INTERNAL)


def _print_stress(report: StressReport) -> None:
    console = Console()
    table = Table(title=f"evolane stress: {report.config.actors} actors", show_header=False)
    rows = [
        ("sent", f"{report.sent:,}"),
        ("delivered", f"{report.delivered:,}"),
        ("dead-lettered", f"{report.dead_lettered:,}"),
        ("refused", f"{report.refused:,}"),
        ("lost", f"{report.lost:,}"),
        ("restarts", f"{report.restarts:,}"),
        ("wall", f"{report.seconds:.2f} s"),
        ("throughput", f"{report.throughput_per_second:,.0f} msg/s"),
        ("ask p50 / p99", f"{report.ask_p50_ms:.2f} / {report.ask_p99_ms:.2f} ms"),
        ("peak RSS", f"{report.peak_rss_mb:.1f} MB"),
    ]
    for name, value in rows:
        table.add_row(name, value)
    console.print(table)
    for name, held in report.invariants.items():
        mark = "[green]ok[/green]  " if held else "[red]FAIL[/red]"
        console.print(f"{mark} {name}")


def _register() -> None:
    from evolane.cli._optimize import estimate, optimize

    app.command(name="optimize")(optimize)
    app.command(name="estimate")(estimate)


_register()


def main() -> None:
    """Console-script entry point: usage errors become one line and exit code 2."""
    from evolane.cli import STARTED, _session

    _session.LAUNCHED = STARTED
    try:
        code = app(standalone_mode=False)
    except TyperException as error:
        ctx = getattr(error, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        if error.format_message():  # empty when the help was shown for a bare `evolane`
            typer.echo(f"evolane: error: {where}{error.format_message()}", err=True)
        code = error.exit_code
    except typer.Abort:
        typer.echo("evolane: interrupted", err=True)
        code = 130
    sys.exit(code if isinstance(code, int) else EXIT_OK)


def _register_inspect() -> None:
    from evolane.cli._inspect import report, runs, schema

    app.command(name="report")(report)
    app.command(name="runs")(runs)
    app.command(name="schema")(schema)


_register_inspect()
