"""The command line starts light: ``evolane --help`` (and the parsing of any command) loads
neither the runtime (measure, lanes, sandbox, distributed) nor the report page's numbers
(views, stats, numpy) nor trio; a command loads what it runs when it runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.campaign_helpers import run_optimize, toy_flags, with_flag, write_toy

HEAVY = (
    "evolane.measure",
    "evolane.lanes",
    "evolane.sandbox",
    "evolane.distributed",
    "evolane.views",
    "evolane.stats",
    "evolane.campaign",
    "evolane.supervisors",  # the CLI's allocator policy is a root module, not the runtime
    "evolane.actors",
    "numpy",
    "trio",  # only the commands that run something (stress, watch, drain, optimize) need it
)
PROBE = """
import sys
from pathlib import Path
sys.argv = ["evolane", *sys.argv[1:]]
from evolane.cli import main
try:
    main()
except SystemExit:
    pass
print("LOADED", *sorted(name for name in sys.modules if name in {heavy!r}))
"""


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["optimize", "--help"],
        ["watch", "--help"],
        ["optimize", "--iterations", "abc"],  # a flag's bad value: one line before any run
    ],
)
def test_help_loads_none_of_the_runtime(args: list[str]) -> None:
    code = PROBE.format(heavy=set(HEAVY))
    done = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    (loaded,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == "LOADED", loaded


def test_a_command_still_loads_what_it_runs() -> None:
    """The probe can see a load: ``runs`` reads the store through the campaign package."""
    code = PROBE.format(heavy=set(HEAVY))
    done = subprocess.run(
        [sys.executable, "-c", code, "runs", "--store", "/nonexistent-evolane-store"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    (loaded,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert "evolane.campaign" in loaded.split(), loaded


READ_ONLY_SPARED = (
    "numpy",
    "trio",
    "psutil",
    "evolane.sandbox",
    "evolane.lanes",
    "evolane.views",
    "evolane.measure",
    "evolane.stats",
    "evolane.actors",
)
"""What a read-only command on an empty store, or on a run it does not find, never needs:
the package facades load their modules on first use (`evolane._lazy`), and the store's
layout (`evolane.campaign.StoreLayout`) reads no record (found by review: ``runs`` imported
all of these, ~0.9 CPU-s, to say that a store holds no run)."""


@pytest.mark.parametrize(
    "args",
    [
        ["runs"],
        ["runs", "--json"],
        ["report", "r-none"],  # an unknown run: one line, exit 2
        ["diff", "r-none"],
    ],
)
def test_a_read_only_command_on_an_empty_store_loads_none_of_the_runtime(
    tmp_path: Path, args: list[str]
) -> None:
    (tmp_path / "store").mkdir()
    code = PROBE.format(heavy=set(READ_ONLY_SPARED))
    done = _script(code, *args, "--store", str(tmp_path / "store"))
    (loaded,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == "LOADED", loaded
    assert "Traceback" not in done.stderr, done.stderr


READ_ONLY_ON_A_RUN_SPARED = (
    "numpy",
    "trio",
    "psutil",
    "evolane.actors",
    "evolane.supervisors",
    "evolane.stats",
)
"""What a read-only command on a store holding a finished run never needs: reading its
records (run.json, report.json) loads their models and the settings' types, not the
statistics, the actors, trio or the process tools (found by review: ~0.8 CPU-s each)."""


@pytest.fixture(scope="module")
def one_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A store holding one finished run of the toy workload, and the run's id."""
    paths = write_toy(tmp_path_factory.mktemp("one-run"), {"0.0": "fix:3"})
    done = run_optimize(with_flag(toy_flags(paths, paths["store"]), "--iterations", "1"))
    assert done.returncode == 0, done.stderr
    (run_dir,) = (paths["store"] / "runs").iterdir()
    return paths["store"], run_dir.name


@pytest.mark.parametrize(
    "command",
    ["runs", "runs --json", "report RUN", "report RUN --format md", "compare RUN RUN", "fsck"],
)
def test_a_read_only_command_on_a_run_loads_no_statistics_nor_trio(
    one_run: tuple[Path, str], command: str
) -> None:
    store, run_id = one_run
    args = [run_id if word == "RUN" else word for word in command.split()]
    code = PROBE.format(heavy=set(READ_ONLY_ON_A_RUN_SPARED))
    done = _script(code, *args, "--store", str(store))
    assert "Traceback" not in done.stderr, done.stderr
    (loaded,) = [line for line in done.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == "LOADED", loaded


def test_a_bad_choice_is_one_line_before_the_runtime_loads(tmp_path: Path) -> None:
    """A flag value outside its choices is refused (one line, exit 2) before the request
    loads the runtime: the campaign, the measurement, the lanes, numpy."""
    flags = ["--target", str(tmp_path), "--dataset", str(tmp_path / "cases.jsonl")]
    flags += ["--replay", "true", "--optimizer", "true", "--isolation", "bogus"]
    flags += ["--store", str(tmp_path / "store")]
    done = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    expected = "evolane: error: --isolation bogus: choose from auto, confined, process, namespace"
    assert done.stderr.strip() == expected, done.stderr
    runtime = {"evolane.campaign", "evolane.measure", "evolane.lanes", "evolane.embed", "numpy"}
    code = PROBE.format(heavy=runtime)
    probed = _script(code, "optimize", *flags)
    (loaded,) = [line for line in probed.stdout.splitlines() if line.startswith("LOADED")]
    assert loaded == "LOADED", loaded
    assert not (tmp_path / "store").exists()


CTRL_C_AT = """
import os, signal, sys

class CtrlC:  # presses Ctrl-C (or sends SIGTERM) the moment {module!r} is first looked up
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.{signum})
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["evolane", *sys.argv[1:]]
from evolane.cli import main
main()
"""


@pytest.mark.parametrize(
    ("module", "args"),
    [
        # while the command line loads (a Ctrl-C inside orjson's initialisation crashed the
        # interpreter: exit -11; elsewhere an import traceback, exit -2)
        ("orjson", ["runs"]),
        ("typer", ["runs"]),
        # inside a command, before it handles Ctrl-C itself (typer made it a silent exit 130)
        ("evolane.cli._session", ["optimize", "--resume", "r-1"]),
        ("evolane.store", ["fsck"]),
        # while optimize reads its request, before the session takes both signals over
        ("evolane.campaign", ["optimize", "--resume", "r-1"]),
    ],
)
# SIGTERM as Ctrl-C: once the modules loaded, it killed the process (exit -15, no message)
@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_ctrl_c_while_starting_is_one_line_and_exit_130(
    tmp_path: Path, module: str, args: list[str], signum: str
) -> None:
    code = CTRL_C_AT.format(module=module, signum=signum)
    done = subprocess.run(
        [sys.executable, "-c", code, *args, "--store", str(tmp_path / "store")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert done.stderr.strip() == "evolane: interrupted", done.stderr
    assert not (tmp_path / "store").exists()


CTRL_C_ONCE_WRITTEN = """
import os, signal, sys
from evolane.campaign import _prepare

written = _prepare.Prepared.persist

def persist(self):  # presses Ctrl-C the moment run.json is written
    written(self)
    os.kill(os.getpid(), signal.SIGINT)

_prepare.Prepared.persist = persist
sys.argv = ["evolane", *sys.argv[1:]]
from evolane.cli import main
main()
"""


def _script(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c code args...`` (the CLI behind a hook of ``code``), its output captured."""
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
    )


def test_a_ctrl_c_once_run_json_is_written_prints_the_resume_command(tmp_path: Path) -> None:
    """The run is left resumable (``interrupted``), so its command is printed (found by
    review: only 'interrupted', no resume command, as if nothing had been written)."""
    paths = write_toy(tmp_path, {"0.0": "fix:3"})
    store = paths["store"]
    flags = with_flag(toy_flags(paths, store), "--iterations", "1")
    done = _script(CTRL_C_ONCE_WRITTEN, "optimize", *flags)
    assert done.returncode == 130, (done.stdout, done.stderr)
    (run_dir,) = (store / "runs").iterdir()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert f"resume: evolane optimize --resume {run_dir.name} --store {store}" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    resumed = run_optimize(["--resume", run_dir.name, "--store", str(store)])
    assert resumed.returncode == 0, resumed.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] == "finished"


CTRL_C_AS_RESUME_STARTS = """
import os, signal, sys
from evolane.campaign import _run

prepare = _run.prepare_run

def prepare_run(*args, **kwargs):  # presses Ctrl-C before the resume rewrites run.json
    os.kill(os.getpid(), signal.SIGINT)
    return prepare(*args, **kwargs)

_run.prepare_run = prepare_run
sys.argv = ["evolane", *sys.argv[1:]]
from evolane.cli import main
main()
"""


def test_a_ctrl_c_as_a_resume_starts_prints_the_resume_command(tmp_path: Path) -> None:
    """A Ctrl-C during ``--resume``'s start, before the session rewrote run.json, printed only
    'evolane: interrupted' (found by review): the run is as resumable as before, so its
    command is printed."""
    paths = write_toy(tmp_path, {"0.0": "fix:3"})
    store = paths["store"]
    flags = with_flag(toy_flags(paths, store), "--iterations", "1")
    first = _script(CTRL_C_ONCE_WRITTEN, "optimize", *flags)
    assert first.returncode == 130, (first.stdout, first.stderr)
    (run_dir,) = (store / "runs").iterdir()
    resume = ["optimize", "--resume", run_dir.name, "--store", str(store)]
    done = _script(CTRL_C_AS_RESUME_STARTS, *resume)
    assert done.returncode == 130, (done.stdout, done.stderr)
    assert f"resume: evolane optimize --resume {run_dir.name} --store {store}" in done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    assert json.loads((run_dir / "run.json").read_text())["status"] in ("interrupted", "running")
