"""The configuration file (``evolane.toml`` / ``[tool.evolane]`` / ``--config``): found as ruff
and pytest find theirs, flags win over it, its errors name the file, line and key, its paths
are relative to its folder, and the resolved settings with their sources reach run.json and
``evolane config show``. Also: ``optimize --help`` at 80 columns, and where ``--example``
writes its workspace."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer

from evolane.campaign import RunRecord
from evolane.cli._app import app
from tests.campaign_helpers import write_toy

EVOLANE = [sys.executable, "-m", "evolane"]
PLAN = {"0.0": "fix:2", "default": "noop"}


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVOLANE, *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
        env={**os.environ, **env},
    )


def _toml(settings: dict[str, Any]) -> str:
    """``settings`` as TOML (JSON strings, numbers and arrays are TOML values)."""
    return "".join(f"{key} = {json.dumps(value)}\n" for key, value in settings.items())


def _project(root: Path) -> dict[str, Any]:
    """The toy workload under ``root`` and the config file settings that run it, with its
    paths relative to ``root``."""
    paths = write_toy(root, PLAN)
    replay = (
        'sh -c \'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' replay {candidate} {output_dir}'
    )
    optimizer = f"{sys.executable} -I {paths['script']} {{workdir}} {{prompt_file}} {paths['plan']}"
    return {
        "target": "target",
        "dataset": "dataset.jsonl",
        "store": "store",
        "replay": replay,
        "optimizer": optimizer,
        "protected": ["grader/**"],
        "required-file": "REQUIRED",  # one value of a repeatable flag
        "gate": "strict",
        "iterations": 2,
        "population": 2,
        "kill_grace": 0.3,
        "progress": "none",
        "feedback-split": "val",
    }


def _show(cwd: Path, *flags: str) -> dict[str, dict[str, Any]]:
    done = _run(["config", "show", "--json", *flags], cwd)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["settings"]


def _one_error(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def test_a_file_found_from_a_subfolder_runs_the_campaign_and_run_json_says_why(
    tmp_path: Path,
) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "evolane.toml").write_text(_toml(_project(project)))
    below = project / "sub" / "deeper"
    below.mkdir(parents=True)
    done = _run(["optimize", "--population", "1"], below)
    assert done.returncode == 0, done.stderr[-2000:]
    assert not (below / "store").exists()  # relative to the file's folder, not the cwd
    (run_dir,) = (project / "store" / "runs").iterdir()
    stored = json.loads((run_dir / "run.json").read_text())
    config, settings = stored["config"], stored["settings"]
    assert config["target"] == str(project / "target")
    assert config["iterations"] == 2 and config["population"] == 1
    assert config["required_files"] == ["REQUIRED"] and config["protected"] == ["grader/**"]
    file = str(project / "evolane.toml")
    assert settings["iterations"] == {"value": 2, "source": f"{file}:9"}
    assert settings["target"] == {"value": str(project / "target"), "source": f"{file}:1"}
    assert settings["population"] == {"value": 1, "source": "flag"}
    assert settings["stall"] == {"value": 4, "source": "default"}
    assert settings["gate"]["source"] == f"{file}:8" and config["gate"]["gate"] == "strict"
    older = {key: value for key, value in stored.items() if key != "settings"}
    assert RunRecord.model_validate(older).settings is None  # a run.json from before loads
    report = _run(["report", run_dir.name, "--store", str(project / "store")], tmp_path)
    assert report.returncode == 0, report.stderr
    # the read-only commands find the same store through the file, from the same subfolder
    runs = _run(["runs", "--json"], below)
    assert runs.returncode == 0, runs.stderr
    assert json.loads(runs.stdout)["store"] == str(project / "store")
    assert [row["run_id"] for row in json.loads(runs.stdout)["runs"]] == [run_dir.name]
    for args in (["report", run_dir.name], ["diff", run_dir.name], ["fsck"],
                 ["compare", run_dir.name, run_dir.name], ["drain"],
                 ["optimize", "--drain-pending"]):  # fmt: skip
        done = _run(args, below)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    assert not (below / ".evolane").exists()
    elsewhere = _run(["runs", "--json"], tmp_path)  # no file above: the default store
    assert json.loads(elsewhere.stdout)["store"] == ".evolane"


def test_config_names_a_file_elsewhere_and_flags_win_over_it(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    settings = {**_project(project), "progress": "plain"}
    (project / "other.toml").write_text(_toml(settings))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    config = str(project / "other.toml")
    shown = _show(elsewhere, "--config", config, "--iterations", "5", "--progress", "auto")
    assert shown["iterations"] == {"value": 5, "source": "flag"}
    assert shown["progress"] == {"value": "auto", "source": "flag"}  # the default, given
    assert shown["population"] == {"value": 2, "source": f"{config}:10"}
    assert shown["dataset"]["value"] == str(project / "dataset.jsonl")
    assert shown["store"]["value"] == str(project / "store")
    assert shown["seed"] == {"value": 0, "source": "default"}
    alone = _show(elsewhere, "--example", "sleeper")  # no file here or above: the defaults
    assert alone["store"] == {"value": str(elsewhere / ".evolane"), "source": "default"}
    missing = _run(["estimate", "--config", "nope.toml"], elsewhere)
    _one_error(missing, "--config nope.toml: no such file")


def test_pyproject_tool_evolane_is_read_when_there_is_no_evolane_toml(tmp_path: Path) -> None:
    settings = _project(tmp_path)
    pyproject = '[project]\nname = "x"\niterations = "not ours"\n\n[tool.evolane]\n'
    (tmp_path / "pyproject.toml").write_text(pyproject + _toml(settings) + "\n[tool.other]\n")
    shown = _show(tmp_path)
    assert shown["iterations"] == {"value": 2, "source": f"{tmp_path / 'pyproject.toml'}:14"}
    assert shown["target"]["value"] == str(tmp_path / "target")
    (tmp_path / "pyproject.toml").write_text(pyproject + "iterationz = 3\n")
    _one_error(_run(["optimize"], tmp_path), "pyproject.toml:6: iterationz: not a setting")
    (tmp_path / "evolane.toml").write_text(_toml({**settings, "iterations": 3}))
    assert _show(tmp_path)["iterations"]["value"] == 3  # evolane.toml comes first


def test_a_pyproject_named_by_config_without_tool_evolane_is_refused(tmp_path: Path) -> None:
    """``--config pyproject.toml`` naming one without ``[tool.evolane]`` is one line, exit 2
    (found by review: accepted with no settings read, silently); found by the search, such
    a pyproject is passed over, silently, as before."""
    (tmp_path / ".git").mkdir()  # the search stops here
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    for command in (["estimate"], ["config", "show"], ["optimize", "--dry-run"]):
        done = _run([*command, "--config", "pyproject.toml", "--example", "sleeper"], tmp_path)
        _one_error(done, "--config pyproject.toml: has no [tool.evolane] table")
    assert _show(tmp_path, "--example", "sleeper")["seed"]["source"] == "default"
    (tmp_path / "pyproject.toml").write_text("tool = 3\n")  # was AttributeError, exit 1
    done = _run(["config", "show", "--config", "pyproject.toml", "--example", "sleeper"], tmp_path)
    _one_error(done, "--config pyproject.toml: has no [tool.evolane] table")
    (tmp_path / "pyproject.toml").write_text("[tool.evolane]\n")  # empty, but there
    named = _show(tmp_path, "--config", "pyproject.toml", "--example", "sleeper")
    assert named["seed"]["source"] == "default"


@pytest.mark.parametrize(
    ("line", "needles"),
    [
        ("iterationz = 3", ["evolane.toml:14: iterationz: not a setting"]),
        ('iterations = "ten"', ["evolane.toml:9: iterations: ", "valid integer"]),
        ("iterations = 0", ["evolane.toml:9: iterations: ", "greater than or equal to 1"]),
        ('gate = "nope"', ["evolane.toml:8: gate nope: choose from paired"]),
        ("k-se = -1.0", ["evolane.toml:14: k-se: ", "greater than or equal to 0"]),
        ('resume = "r-1"', ["evolane.toml:14: resume: not a setting", "give it as a flag"]),
        ("[broken", ["evolane.toml:14: not valid TOML (", ", column "]),
        ("iterationz = [", ["evolane.toml:14: not valid TOML (Invalid value, at its end)"]),
        ('network = "yes"', ["evolane.toml:14: network: expected true or false (got 'yes')"]),
        ("seed = true", ["evolane.toml:14: seed: a boolean, where a value belongs (got True)"]),
        ("judge-timeout = false", ["evolane.toml:14: judge-timeout: a boolean, where"]),
        ("max_tokens = 5\nmax-tokens = 6", ["evolane.toml:15: max-tokens: set twice"]),
        ('prices = "none.yaml"', ["evolane.toml:14: prices ", "none.yaml"]),
        ('rubric = "none.md"', ["evolane.toml:14: rubric ", "none.md"]),
        ("[pricez]\nx = 1", ["evolane.toml:14: pricez: not a setting"]),
        ("[prices]\nx = 1", ["evolane.toml:14: prices: a table, where a value belongs"]),
        ('prices.x = "a"', ["evolane.toml:14: prices: a table, where a value belongs"]),
        ("[[expose]]\nx = 1", ["evolane.toml:14: expose: ", "valid string"]),
        ('expose = ["replays=keys"]', ["evolane.toml:14: expose: 'replays' is no command's"]),
        ('pass-env = ["optimizer="]', ["evolane.toml:14: pass-env optimizer=: nothing given"]),
        # an unset "$STORE" in a generated file: the file's folder, unasked (hostile review)
        ('store = ""', ['evolane.toml:3: store: an empty path (write "." for this folder)']),
        ('expose = ["/tmp", " "]', ["evolane.toml:14: expose: an empty path"]),
        ('max-memory = "lots"', ["evolane.toml:14: max-memory: 'lots' is not a size: give"]),
    ],
)
def test_a_bad_key_or_value_is_one_line_naming_the_file_line_and_key(
    tmp_path: Path, line: str, needles: list[str]
) -> None:
    body = _toml(_project(tmp_path))
    name = line.split("=")[0].strip()
    if re.search(rf"(?m)^{re.escape(name)} = ", body):  # the value replaced in place
        body = re.sub(rf"(?m)^{re.escape(name)} = .*$", line, body)
    else:
        body += line + "\n"
    (tmp_path / "evolane.toml").write_text(body)
    _one_error(_run(["optimize"], tmp_path), *needles)
    assert not (tmp_path / "store").exists()  # nothing ran


def test_a_files_exposed_path_given_to_a_role_keeps_it_and_is_relative_to_the_file(
    tmp_path: Path,
) -> None:
    """``expose = ["optimizer=keys/a"]``: the path is the file's folder's, the role kept (it
    was read as a path ``optimizer=keys/a`` beside the file: no such file)."""
    settings = _project(tmp_path)
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "a").write_text("k")
    settings |= {"expose": ["optimizer=keys/a", "keys"], "pass-env": ["optimizer=KEY"]}
    (tmp_path / "evolane.toml").write_text(_toml(settings))
    shown = _show(tmp_path / "keys")  # found from a subfolder: paths are still the file's
    keys = tmp_path / "keys"
    assert shown["expose"]["value"] == [f"optimizer={keys / 'a'}", str(keys)]
    assert shown["pass_env"]["value"] == ["optimizer=KEY"]


def test_a_config_file_over_its_cap_is_refused_unread(tmp_path: Path) -> None:
    body = _toml(_project(tmp_path)) + "# " + "x" * (1 << 20) + "\n"  # review: 100 MB took 14 s
    (tmp_path / "evolane.toml").write_text(body)
    _one_error(_run(["optimize"], tmp_path), "evolane.toml: the config file is over 1 MiB")
    assert not (tmp_path / "store").exists()


def test_a_config_given_through_a_pipe_loads(tmp_path: Path) -> None:
    """``--config <(...)`` (a pipe) loads as a file does (found by review: the 1 MiB cap's
    regular-file read refused it)."""
    settings = {**_project(tmp_path), "population": 3}
    (tmp_path / "flags.toml").write_text(_toml(settings))
    shell = f"exec {sys.executable} -m evolane config show --json --config <(cat flags.toml)"
    done = subprocess.run(
        ["bash", "-c", shell], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["settings"]["population"]["value"] == 3


def test_every_boolean_the_file_sets_true_a_flag_turns_off(tmp_path: Path) -> None:
    """Each boolean a config file may set has a flag that turns it off, and ``config show``
    names the flag as its source (found by review: ``network = true`` in the file could not
    be undone: there was no ``--no-network``, ``--no-fast-verified``, ``--no-llm-cache``, and
    ``--no-regression`` had no opposite)."""
    on = {"network": True, "fast-verified": True, "llm-cache": True, "no-regression": True}
    (tmp_path / "evolane.toml").write_text(_toml({**_project(tmp_path), **on}))
    from_file = _show(tmp_path)
    for key in ("network", "fast_verified", "llm_cache", "no_regression"):
        assert from_file[key]["value"] is True, (key, from_file[key])
    assert from_file["judge_failure_retries"] == {"value": 1, "source": "--fast-verified"}
    offs = ("--no-network", "--no-fast-verified", "--no-llm-cache", "--allow-regression")
    shown = _show(tmp_path, *offs, "--no-sequential")
    for key in ("network", "fast_verified", "llm_cache", "no_regression", "sequential"):
        assert shown[key] == {"value": False, "source": "flag"}, (key, shown[key])
    assert shown["judge_failure_retries"] == {"value": 2, "source": "default"}  # no preset
    assert shown["baseline_replay_repetitions"]["source"] == "default"


def test_config_show_prints_each_value_with_its_source(tmp_path: Path) -> None:
    (tmp_path / "evolane.toml").write_text(_toml(_project(tmp_path)))
    done = _run(["config", "show", "--population", "3"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.search(r"^iterations +=\s2  # evolane\.toml:9$", done.stdout, re.M), lines
    assert re.search(r"^population +=\s3  # flag$", done.stdout, re.M)
    assert re.search(r"^stall +=\s4  # default$", done.stdout, re.M)
    assert re.search(r"^max-tokens +=\s\(not set\)  # default$", done.stdout, re.M)
    assert re.search(r'^test-budget += "campaign"  # default$', done.stdout, re.M)
    assert re.search(r'^required-file += \["REQUIRED"\]  # evolane\.toml:7$', done.stdout, re.M)
    shown = _show(tmp_path, "--example", "sleeper", "--iterations", "1")
    assert shown["replay_concurrency"] == {"value": 8, "source": "example sleeper"}
    assert shown["population"] == {"value": 2, "source": str(tmp_path / "evolane.toml") + ":10"}
    assert shown["iterations"]["source"] == "flag"


def test_optimize_help_at_80_columns_shows_every_flag_whole_in_panels(tmp_path: Path) -> None:
    command = typer.main.get_command(app)
    for name in ("optimize", "estimate"):
        done = _run([name, "--help"], tmp_path, COLUMNS="80", TERM="dumb")
        assert done.returncode == 0, done.stderr
        assert max(len(line) for line in done.stdout.splitlines()) <= 80
        params = command.commands[name].params  # type: ignore[attr-defined]
        flags = [opt for param in params for opt in (*param.opts, *param.secondary_opts)]
        assert "--max-improvement-cycles" in flags and len(flags) > 60
        for flag in flags:
            assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", done.stdout), flag
        for panel in ("Inputs", "Search", "Decision", "Budgets", "Lanes", "Isolation", "Models"):
            assert re.search(rf"─ {panel}\b", done.stdout), panel


def test_the_example_writes_its_workspace_under_the_store_unless_told(tmp_path: Path) -> None:
    done = _run(["optimize", "--example", "sleeper", "--dry-run"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / ".evolane" / "examples" / "sleeper" / "example.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".evolane"]  # nothing else in cwd
    store = tmp_path / "s2"
    done = _run(["estimate", "--example", "sleeper", "--store", str(store)], tmp_path)
    assert done.returncode == 0, done.stderr
    assert (store / "examples" / "sleeper" / "dataset.jsonl").is_file()
    chosen = tmp_path / "mine"
    done = _run(["optimize", "--example", "sleeper", "--example-dir", "mine", "--dry-run"], store)
    assert done.returncode == 0, done.stderr
    assert not chosen.exists() and (store / "mine" / "example.json").is_file()
    (tmp_path / "evolane.toml").write_text('example = "sleeper"\nexample-dir = "ws"\n')
    shown = _show(tmp_path / "s2")  # found in the parent; relative to the file's folder
    assert shown["example_dir"] == {
        "value": str(tmp_path / "ws"),
        "source": f"{tmp_path}/evolane.toml:2",
    }
    assert shown["target"] == {
        "value": str(tmp_path / "ws" / "target"),
        "source": "example sleeper",
    }


def test_optimize_help_names_the_default_of_every_flag_that_has_one() -> None:
    """Every ``optimize`` flag whose value defaults to something says it in its help, as
    DESIGN §10 gives them (found by review: --store [.evolane] and --unknown-price
    [refuse] showed none)."""
    command = typer.main.get_command(app)
    params = command.commands["optimize"].params  # type: ignore[attr-defined]
    for param in params:
        if param.default not in (None, False, [], ()) and param.name != "help":
            assert "default" in (param.help or ""), (param.name, param.help)
    helps = {param.name: param.help or "" for param in params}
    assert "default refuse" in helps["unknown_price"]
    assert "default .evolane" in helps["store"]
