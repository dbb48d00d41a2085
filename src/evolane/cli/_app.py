"""The `evolane` command line: a thin typer client of the runtime's public API."""

from __future__ import annotations

import functools
import inspect
import math
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any

import orjson
import typer
from rich.console import Console
from rich.table import Table
from typer.exceptions import TyperException

from evolane._allocator import fix_mmap_threshold
from evolane.cli._exits import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    broken_entry_points,
    error_words,
    fail_usage,
    name_too_long,
)

if TYPE_CHECKING:
    from evolane.stress import ScenarioReport

app = typer.Typer(
    name="evolane",
    help="Run self-evolve optimisation campaigns fast, within hard budgets, leaving nothing.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _show_version(value: bool) -> None:
    """``--version``: print the installed evolane's version and exit 0."""
    if value:
        from evolane._version import __version__

        typer.echo(f"evolane {__version__}")
        raise typer.Exit(EXIT_OK)


@app.callback()
def _options(
    version: Annotated[
        bool,
        typer.Option(
            "--version",
            callback=_show_version,
            is_eager=True,
            help="Print the version and exit.",
        ),
    ] = False,
) -> None:
    """Run self-evolve optimisation campaigns fast, within hard budgets, leaving nothing."""


@app.command()
def stress(
    scenario: Annotated[
        str,
        typer.Option(
            help="actors | ask | cascade | processes | budget | slow-observer | crash-resume."
        ),
    ] = "actors",
    seed: Annotated[int, typer.Option(help="Seed of the fault schedule.")] = 0,
    duration: Annotated[
        float | None, typer.Option(help="Soak: repeat rounds (seed, seed+1, ...) for S seconds.")
    ] = None,
    actors: Annotated[int | None, typer.Option(help="actors: actors in the tree [2000].")] = None,
    messages: Annotated[int | None, typer.Option(help="actors: messages in all [200000].")] = None,
    faults: Annotated[
        float | None, typer.Option(help="actors: fraction of handlers that crash [0.01].")
    ] = None,
    trees: Annotated[int | None, typer.Option(help="processes: trees to run [500].")] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", help="KEY=VALUE for any field of the scenario's config."),
    ] = None,
    quick: Annotated[
        bool, typer.Option("--quick", help="A small case that runs in seconds.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Run a stress scenario with seeded faults; print the invariants it checked and its figures."""
    import trio

    from evolane.stress import run_scenario

    given = {"actors": actors, "messages": messages, "faults": faults, "trees": trees}
    options = _stress_options(scenario, seed, duration, quick, settings or [], given)
    report = trio.run(
        lambda: run_scenario(scenario, seed=seed, duration=duration, quick=quick, options=options)
    )
    if as_json:
        sys.stdout.write(
            orjson.dumps(report.model_dump(mode="json"), option=orjson.OPT_INDENT_2).decode()
        )
        sys.stdout.write("\n")
    else:
        _print_stress(report)
    raise typer.Exit(EXIT_OK if report.ok else EXIT_INTERNAL)


_MAX_SEED = 2**63 - 1
"""The largest ``--seed`` (the JSON report holds 64-bit integers at most)."""
_STRESS_FLAGS = {"actors": "actors", "messages": "actors", "faults": "actors", "trees": "processes"}


def _stress_options(
    scenario: str,
    seed: int,
    duration: float | None,
    quick: bool,
    settings: list[str],
    given: dict[str, float | None],
) -> dict[str, object]:
    """The scenario's config options from the flags; a usage error (exit 2) for a bad one."""
    from pydantic import ValidationError

    from evolane.stress import SCENARIOS, SettingError, explain, parse_settings, scenario_config

    if scenario not in SCENARIOS:
        fail_usage(f"unknown scenario {scenario!r}; one of: {', '.join(SCENARIOS)}")
    try:
        options: dict[str, object] = dict(parse_settings(settings))
    except SettingError as error:
        fail_usage(str(error))
    if "seed" in options:  # the scenario's seed is --seed's (it was silently ignored)
        fail_usage("--set seed: the seed is a flag of its own; use --seed")
    for flag, value in given.items():
        if value is not None:
            owner = _STRESS_FLAGS[flag]
            if scenario != owner:
                fail_usage(f"--{flag} applies to --scenario {owner}; use --set for {scenario}")
            options[flag] = value
    if not 0 <= seed <= _MAX_SEED:  # found by review: a larger one ran, then a traceback
        fail_usage(f"--seed must be from 0 to {_MAX_SEED}, got {seed}")
    if duration is not None and not 0 < duration < math.inf:  # review: inf soaked forever
        fail_usage(f"--duration must be a positive number of seconds, got {duration}")
    try:
        scenario_config(scenario, seed=seed, quick=quick, options=options)
    except ValidationError as error:
        fail_usage(explain(error, given, SCENARIOS[scenario].config.model_fields))
    return options


def _print_stress(report: ScenarioReport) -> None:
    from evolane.stress import report_rows

    console = Console()
    rounds = f"{report.rounds} rounds" if report.rounds > 1 else "1 round"
    title = (
        f"evolane stress {report.scenario}: seed {report.seed}, {rounds}, {report.seconds:.1f} s"
    )
    table = Table(show_header=False)
    for name, value in report_rows(report.counts, report.measures):
        table.add_row(name, value)
    console.print(title, highlight=False)
    console.print(table)
    for name, held in report.invariants.items():
        mark = "[green]ok[/green]  " if held else "[red]FAIL[/red]"
        console.print(f"{mark} {name}", highlight=False)
    if report.failed_round is not None:
        console.print(
            f"failed in round {report.failed_round} (seed {report.seed + report.failed_round})"
        )
    for detail in report.details:
        console.print(f"  {detail}", highlight=False, markup=False)


def _register() -> None:
    from evolane.cli._optimize import estimate, optimize

    app.command(name="optimize")(optimize)
    app.command(name="estimate")(estimate)
    from evolane.cli._config_show import config_app

    app.add_typer(config_app, name="config")
    from evolane.cli._dataset import dataset_app

    app.add_typer(dataset_app, name="dataset")
    _register_starter()


def _register_starter() -> None:
    from evolane.cli._init import init
    from evolane.cli._optimize import doctor

    app.command(name="init")(init)
    app.command(name="doctor")(doctor)


_register()


def main() -> None:
    """Console-script entry point: usage errors become one line and exit code 2."""
    import evolane.cli as package
    from evolane.cli._loading import answer_sigterm_as_ctrl_c, exit_on_late_signal, take_held

    answer_sigterm_as_ctrl_c()  # a SIGTERM from now on (the session takes it over) is a Ctrl-C
    if take_held():  # Ctrl-C or SIGTERM while the modules loaded: nothing has started
        typer.echo("evolane: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    fix_mmap_threshold()  # this process is ours: freed large buffers go back to the kernel
    package.LAUNCHED = package.STARTED
    try:
        code = app(standalone_mode=False)  # a run takes LAUNCHED as its start (and clears it)
    except TyperException as error:
        ctx = getattr(error, "ctx", None)
        where = f"{ctx.command_path}: " if ctx is not None else ""
        if error.format_message():  # empty when the help was shown for a bare `evolane`
            typer.echo(error_words(f"{where}{error.format_message()}"), err=True)
        code = error.exit_code
    except (typer.Abort, KeyboardInterrupt):  # a Ctrl-C before a command took it over
        typer.echo("evolane: interrupted", err=True)
        code = EXIT_INTERRUPTED
    except Exception:  # a broken distribution's entry points (pydantic's plugin loader): 1 line
        broken = broken_entry_points()
        if broken is None:
            raise
        typer.echo(error_words(broken), err=True)
        code = EXIT_USAGE
    finally:  # a command that ran no run (doctor, drain, a probe) leaves no start behind
        package.LAUNCHED = None
    code = code if isinstance(code, int) else EXIT_OK
    exit_on_late_signal(code)  # a thread left running must not make the process unkillable
    sys.exit(code)


def _register_inspect() -> None:
    from evolane.cli._compare import compare
    from evolane.cli._diff import diff
    from evolane.cli._fsck import fsck
    from evolane.cli._inspect import report, schema
    from evolane.cli._plugins import plugins
    from evolane.cli._runs import runs
    from evolane.cli._watch import watch

    app.command(name="report")(report)
    app.command(name="runs")(runs)
    app.command(name="schema")(schema)
    app.command(name="fsck")(fsck)
    app.command(name="plugins")(plugins)
    app.command(name="watch")(watch)
    app.command(name="diff")(diff)
    app.command(name="compare")(compare)


_register_inspect()


def _register_drain() -> None:
    from evolane.cli._drain import drain

    app.command(name="drain")(drain)


_register_drain()


def _one_line_summaries(commands: typer.Typer) -> None:
    """Give every command of ``commands`` (and of its groups) its docstring's first paragraph
    on one line as the summary ``evolane --help`` lists: the listing kept the docstring's
    line breaks ("nothing runs (with" on a line of its own)."""
    for info in commands.registered_commands:
        doc = inspect.getdoc(info.callback) if info.callback is not None else None
        if info.short_help is None and info.help is None and doc:
            info.short_help = " ".join(doc.split("\n\n")[0].split())
    for group in commands.registered_groups:
        if group.typer_instance is not None:
            _one_line_summaries(group.typer_instance)


def _answer_ctrl_c(commands: typer.Typer) -> None:
    """Make every command of ``commands`` (and of its groups) answer a Ctrl-C it does not
    handle itself with one line and exit 130: typer turns one into exit 130 silently."""
    for info in commands.registered_commands:
        if info.callback is not None:
            info.callback = _interruptible(info.callback)
    for group in commands.registered_groups:
        if group.typer_instance is not None:
            _answer_ctrl_c(group.typer_instance)


def _interruptible(callback: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(callback)
    def answered(*args: Any, **kwargs: Any) -> Any:
        try:
            return callback(*args, **kwargs)
        except KeyboardInterrupt:
            typer.echo("evolane: interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        except OSError as error:
            too_long = name_too_long(error)  # a path given: one line, exit 2
            if too_long is None:
                raise
            fail_usage(too_long)
        except BaseExceptionGroup as group:
            # A Ctrl-C trio raised in a task of a nursery (found by review: `evolane stress`
            # interrupted mid-scenario printed a traceback and exited 1).
            if group.subgroup(KeyboardInterrupt) is None:
                raise
            typer.echo("evolane: interrupted", err=True)
            raise typer.Exit(EXIT_INTERRUPTED) from None

    return answered


_one_line_summaries(app)
_answer_ctrl_c(app)
