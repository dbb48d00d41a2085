"""The CLI contract of DESIGN §10: every command and ``optimize`` flag it names exists under
that name (found by review: ``--confirm-split`` did not), and ``--confirm-split test`` means
confirmation on the test split, through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import typer

from evolane.cli import app
from tests.campaign_helpers import toy_flags, write_toy

COMMANDS = [
    "optimize",
    "estimate",
    "report",
    "runs",
    "stress",
    "schema",
    "init",
    "doctor",
    "config",
    "watch",
    "diff",
    "compare",
    "drain",
    "fsck",
    "dataset",
    "plugins",
]
SUBCOMMANDS = {"config": ("show",), "dataset": ("from-trajectory",)}
OPTIMIZE_FLAGS = [
    "--example",
    "--target",
    "--dataset",
    "--replay",
    "--judge",
    "--optimizer",
    "--store",
    "--apply",
    "--iterations",
    "--population",
    "--max-improvement-cycles",
    "--stall",
    "--replay-concurrency",
    "--judge-concurrency",
    "--optimizer-concurrency",
    "--replay-timeout",
    "--judge-timeout",
    "--optimizer-timeout",
    "--kill-grace",
    "--wall-clock-budget",
    "--max-tokens",
    "--max-cost-usd",
    "--baseline-replay-repetitions",
    "--candidate-replay-repetitions",
    "--judge-failure-retries",
    "--fast-verified",
    "--gate",
    "--k-se",
    "--min-effect",
    "--confidence",
    "--bootstrap-samples",
    "--no-regression",
    "--sequential",
    "--no-sequential",
    "--focus",
    "--protected",
    "--cluster",
    "--seed",
    "--progress",
    "--dry-run",
    "--resume",
    "--resume-campaign",
    "--from-run",
    "--rerun-evaluator",
    "--isolation",
    "--network",
    "--expose",
    "--expose-rw",
    "--max-procs",
    "--max-memory",
    "--max-file-size",
    "--feedback-split",
    "--confirm-split",
    "--error-control",
    "--test-budget",
    "--rubric",
    "--llm-base-url",
    "--llm-api-key-env",
    "--prices",
    "--unknown-price",
    "--llm-cache",
    "--config",
    "--from-trajectory",
    "--group",
    "--drain-pending",
]
EVOLANE = [sys.executable, "-m", "evolane"]


def _options(command: Any) -> set[str]:
    names: set[str] = set()
    for param in command.params:
        names.update(getattr(param, "opts", ()))
        names.update(getattr(param, "secondary_opts", ()))
    return names


def test_every_command_and_flag_the_contract_names_exists() -> None:
    root: Any = typer.main.get_command(app)  # typer may run its own copy of click
    missing = [name for name in COMMANDS if name not in root.commands]
    for group, names in SUBCOMMANDS.items():
        sub = root.commands[group]
        missing += [f"{group} {name}" for name in names if name not in sub.commands]
    flags = _options(root.commands["optimize"])
    missing += [flag for flag in OPTIMIZE_FLAGS if flag not in flags]
    assert not missing


def _estimate(folder: Path, *extra: str, test: int = 6) -> subprocess.CompletedProcess[str]:
    paths = write_toy(folder, {"0.0": "noop"}, test=test)
    flags = toy_flags(paths, folder / "store")
    return subprocess.run(
        [*EVOLANE, "estimate", *flags, *extra], capture_output=True, text=True, timeout=60
    )


def test_confirm_split_test_confirms_on_the_test_split(tmp_path: Path) -> None:
    done = _estimate(tmp_path, "--confirm-split", "test")
    assert done.returncode == 0, done.stderr
    assert "test 6 confirms" in done.stdout
    assert "online error control" not in done.stdout


def test_confirm_split_needs_a_test_split_as_confirmation_does(tmp_path: Path) -> None:
    done = _estimate(tmp_path, "--confirm-split", "test", test=0)
    assert done.returncode == 2
    assert "no test cases to confirm the best on" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_confirm_split_with_a_mode_that_confirms_nothing_is_refused(tmp_path: Path) -> None:
    for mode in ("online", "none"):
        done = _estimate(tmp_path / mode, "--confirm-split", "test", "--error-control", mode)
        assert done.returncode == 2
        line = done.stderr.strip()
        assert line == (
            f"evolane: error: --confirm-split test: --error-control {mode} confirms on no "
            "split; give one of them"
        )
    done = _estimate(tmp_path / "val", "--confirm-split", "val")
    assert done.returncode == 2
    assert "--confirm-split val: choose from test" in done.stderr


def test_no_help_text_shows_docstring_markup() -> None:
    """Typer turns each command's docstring into its --help: double backticks showed there
    raw (``optimize``, ``--probe``; found by review)."""
    from typer.testing import CliRunner

    runner = CliRunner()
    for name in COMMANDS:
        for words in [[name, *[s]] for s in SUBCOMMANDS[name]] if name in SUBCOMMANDS else [[name]]:
            done = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "200"})
            assert done.exit_code == 0, (words, done.output)
            assert "``" not in done.output, (words, done.output)


def test_the_command_list_gives_each_command_one_summary_line() -> None:
    """``evolane --help`` lists each command with its docstring's first paragraph, which kept
    its line breaks there: ``estimate`` read "nothing runs (with" on a line of its own and
    ``schema`` "report.json or a" (found by review). The summary is one line, wrapped by rich
    to the terminal's width, the same words as the command's own help."""
    from typer.testing import CliRunner

    listing = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "250"}).output
    assert "nothing runs (with `--probe`: one replay" in listing
    assert "report.json or a trajectory record" in listing


def test_no_help_text_loses_brackets_to_rich_markup() -> None:
    """Typer renders help as rich markup, where ``[default: ...]`` or ``[judge=|...]`` is a
    style tag and vanishes: every command's ``--store`` help read "The store directory ."
    and ``--llm-base-url``'s lost its ``[judge=|optimizer=]`` (found by review)."""
    from rich.text import Text

    def check(command: Any, path: str) -> list[str]:
        texts = [(path, command.help or "")]
        texts += [
            (f"{path} {param.name}", getattr(param, "help", None) or "") for param in command.params
        ]
        lost = [
            where
            for where, text in texts
            if Text.from_markup(text).plain != text.replace("\\[", "[")
        ]
        for name, sub in getattr(command, "commands", {}).items():
            lost += check(sub, f"{path} {name}")
        return lost

    assert check(typer.main.get_command(app), "evolane") == []


def test_no_help_line_names_its_default_twice() -> None:
    """A help text that says its default in words is not followed by typer's own
    ``[default: ...]`` (``drain --progress``: "(default auto). [default: auto]"; ``init``:
    "(default: this one). [default: .]"), and ``drain --debug`` is a flag as ``optimize``'s
    is, with no ``--no-debug`` (found by review)."""
    from typer.testing import CliRunner

    runner = CliRunner()
    for name in COMMANDS:
        for words in [[name, *[s]] for s in SUBCOMMANDS[name]] if name in SUBCOMMANDS else [[name]]:
            done = runner.invoke(app, [*words, "--help"], env={"COLUMNS": "250"})
            twice = [line for line in done.output.splitlines() if line.count("default") > 1]
            assert twice == [], words
            assert "--no-debug" not in done.output, words


def test_every_campaign_ceiling_says_it_spans_the_campaign() -> None:
    """The three ceilings count every session of every run of a campaign (README: budgets);
    ``--wall-clock-budget``'s help said "the whole run" (found by review)."""
    params = typer.main.get_command(app).commands["optimize"].params  # type: ignore[attr-defined]
    helps = {param.name: param.help or "" for param in params}
    for name in ("wall_clock_budget", "max_tokens", "max_cost_usd"):
        assert "whole campaign" in helps[name], (name, helps[name])


def test_a_dry_run_under_progress_jsonl_prints_json_lines(tmp_path: Path) -> None:
    """``--progress jsonl`` makes stdout JSON lines; ``optimize --dry-run`` printed its
    estimate as text there, which a ``| jq`` could not read (found by review): the estimate
    is one JSON line, the document ``estimate --json`` prints."""
    paths = write_toy(tmp_path, {"0.0": "noop"}, test=6)
    flags = toy_flags(paths, tmp_path / "store")
    flags[flags.index("--progress") + 1] = "jsonl"
    done = subprocess.run(
        [*EVOLANE, "optimize", *flags, "--dry-run"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.splitlines()
    assert json.loads(line)["replays_max"] > 0
