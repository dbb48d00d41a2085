"""Plugin and observer code that raises a `BaseException` that is not an `Exception`
(``sys.exit``, as ``argparse`` does on bad args; a bare ``BaseException``) is that code's
failure, as an exception is: a factory's is one error line naming the plugin (exit 2), an
observer's disables it with one warning and the run goes on. A ``KeyboardInterrupt`` still
goes on as the user's stop. (Found by review: a factory's ``sys.exit`` was an "internal
error" (exit 1), an observer's ended the embedding process.)"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from evolane.embed import observer_plugin
from evolane.lanes import PluginError, plugin_backend, plugin_spec
from tests.campaign_helpers import toy_flags, write_toy
from tests.plugin_helpers import install, write_distribution

PLUGIN = textwrap.dedent(
    """
    import argparse, sys

    def parsing_factory(args):
        parser = argparse.ArgumentParser(prog="exitjudge")
        parser.add_argument("--mode", choices=["a", "b"], required=True)
        parser.parse_args(args.split())  # bad args: sys.exit(2)

    def bare_factory(args):
        raise BaseException("bare " + args)

    def interrupted_factory(args):
        raise KeyboardInterrupt

    def exiting_observer():
        sys.exit(9)
    """
)
ENTRY_POINTS = """\
[evolane.judges]
exitjudge = evolane_exitplug:parsing_factory
barejudge = evolane_exitplug:bare_factory
ctrlcjudge = evolane_exitplug:interrupted_factory

[evolane.observers]
exitobs = evolane_exitplug:exiting_observer
"""


@pytest.fixture
def plugin_dir(tmp_path: Path) -> Path:
    """A folder holding the test distribution ``evolane-exitplug`` 1.0."""
    return write_distribution(tmp_path / "site", "evolane_exitplug", PLUGIN, ENTRY_POINTS)


@pytest.fixture
def installed(plugin_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test distribution on this process's path (importlib caches cleared)."""
    return install(plugin_dir, "evolane_exitplug", monkeypatch)


@pytest.mark.parametrize(
    ("value", "said"),
    [("exitjudge:--mode c", "the factory raised SystemExit: 2"),
     ("barejudge:x", "the factory raised BaseException: bare x")],
)  # fmt: skip
def test_a_factory_that_exits_is_a_plugin_error(installed: Path, value: str, said: str) -> None:
    spec = plugin_spec(value, "judge")
    assert spec is not None
    with pytest.raises(PluginError, match=said):
        plugin_backend(spec)


def test_a_factory_interrupted_by_ctrl_c_is_no_plugin_error(installed: Path) -> None:
    spec = plugin_spec("ctrlcjudge:x", "judge")
    assert spec is not None
    with pytest.raises(KeyboardInterrupt):
        plugin_backend(spec)


def test_an_observer_factory_that_exits_is_a_plugin_error(installed: Path) -> None:
    with pytest.raises(PluginError, match=r"--observer exitobs .*SystemExit: 9"):
        observer_plugin("exitobs")


def test_the_cli_says_a_factorys_exit_in_one_line(plugin_dir: Path, tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"0.0": "noop"})
    store = tmp_path / "store"
    pythonpath = os.pathsep.join([str(plugin_dir), *filter(None, [os.environ.get("PYTHONPATH")])])
    done = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *toy_flags(paths, store),
         "--judge", "exitjudge:--mode c"],
        capture_output=True, text=True, timeout=240, env={**os.environ, "PYTHONPATH": pythonpath},
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    (line,) = done.stderr.strip().splitlines()[-1:]
    assert line.startswith("evolane: error: --judge exitjudge:--mode c (plugin "), done.stderr
    assert "SystemExit: 2" in line
    assert not (store / "runs").exists() or not any((store / "runs").iterdir())
