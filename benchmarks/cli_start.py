"""What a command of the command line costs to start: CPU seconds (the median of fresh
processes) and the modules it imported (a figure no load changes), per command.

    python benchmarks/cli_start.py [--rounds 7] [--against SRC] [--full]

Each command runs as ``python -c WRAPPER args`` (``evolane``'s own ``main``, as ``python -m
evolane`` runs it), its CPU (user + system) read by ``wait4``, its ``len(sys.modules)``
written at exit to a file. The references run in the same rounds: a bare ``python -c pass``
and ``python -c "import typer, rich"`` (the floor of any typer + rich command line); each
command's CPU is printed as a ratio to the latter. ``--against SRC`` runs every command of
each round a second time with ``PYTHONPATH=SRC`` (another checkout's ``src``, e.g. the
main branch's), interleaved with this one's, and prints this tree's CPU as a ratio to it.
``--full`` adds a tiny whole ``optimize`` (the toy workload of the tests, one iteration).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.campaign_helpers import toy_flags, with_flag, write_toy

SRC = Path(__file__).resolve().parents[1] / "src"
WRAPPER = """
import atexit, os, sys
atexit.register(lambda: open(os.environ["CLI_START_COUNT"], "w").write(str(len(sys.modules))))
sys.argv = ["evolane", *sys.argv[1:]]
from evolane.cli import main
main()
"""
COUNTED = """
import atexit, os, sys
atexit.register(lambda: open(os.environ["CLI_START_COUNT"], "w").write(str(len(sys.modules))))
"""


@dataclass
class Figures:
    """One command's CPU seconds per round and its module count (the last round's)."""

    cpu: list[float] = field(default_factory=list)
    modules: int = 0

    @property
    def median(self) -> float:
        return statistics.median(self.cpu)


def _run(code: str, args: list[str], src: Path, count: Path, cwd: Path) -> tuple[float, int]:
    """CPU seconds and module count of ``python -c code args`` with ``src`` first on the path
    (its exit code is not checked: the bad-input command exits 2 on purpose)."""
    env = {**os.environ, "PYTHONPATH": str(src), "CLI_START_COUNT": str(count)}
    env["EVOLANE_PROGRESS_AFTER"] = "3600"  # no progress line of a store walk
    count.unlink(missing_ok=True)
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    _, _, usage = os.wait4(process.pid, 0)
    process.returncode = 0  # reaped by wait4
    modules = int(count.read_text()) if count.exists() else -1
    return usage.ru_utime + usage.ru_stime, modules


def _commands(root: Path, full: bool) -> dict[str, list[str]]:
    """The commands measured, by label: read-only ones on an empty store and on a store
    holding one finished run of the toy workload (made here by one ``optimize``)."""
    empty = root / "empty"
    empty.mkdir()
    paths = write_toy(root / "toy", {"0.0": "fix:3"})
    store = paths["store"]
    flags = with_flag(toy_flags(paths, store), "--iterations", "1")
    made = subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *flags],
        env={**os.environ, "PYTHONPATH": str(SRC)},
        capture_output=True,
        text=True,
        check=False,
    )
    if made.returncode != 0:
        raise SystemExit(f"the toy run failed: {made.stderr[-400:]}")
    (run_id,) = [path.name for path in (store / "runs").iterdir()]
    commands = {
        "--version": ["--version"],
        "--help": ["--help"],
        "optimize --help": ["optimize", "--help"],
        "optimize bad input": ["optimize", "--iterations", "abc"],
        "runs (empty store)": ["runs", "--store", str(empty)],
        "report (unknown run)": ["report", "r-none", "--store", str(empty)],
        "runs": ["runs", "--store", str(store)],
        "report": ["report", run_id, "--store", str(store)],
        "compare": ["compare", run_id, run_id, "--store", str(store)],
        "fsck": ["fsck", "--store", str(store)],
    }
    if full:
        fresh = with_flag(flags, "--store", str(root / "full-store"))
        commands["optimize (toy, 1 iteration)"] = ["optimize", *fresh]
    return commands


def main() -> None:
    """Measure, then print one row per command."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--against", type=Path, help="another tree's src, run interleaved")
    parser.add_argument("--full", action="store_true", help="add a whole tiny optimize")
    options = parser.parse_args()
    trees = {"this": SRC} | ({"against": options.against.resolve()} if options.against else {})
    with tempfile.TemporaryDirectory(prefix="cli-start-") as tmp:
        root = Path(tmp)
        commands = _commands(root, options.full)
        references = {"python -c pass": "pass", "import typer, rich": "import typer, rich"}
        figures: dict[tuple[str, str], Figures] = {}
        count = root / "modules"
        for _ in range(options.rounds):
            for label, code in references.items():
                cpu, modules = _run(COUNTED + code, [], SRC, count, root)
                figures.setdefault(("ref", label), Figures()).cpu.append(cpu)
                figures[("ref", label)].modules = modules
            for label, args in commands.items():
                for tree, src in trees.items():  # interleaved: the same moment's load
                    shutil.rmtree(root / "full-store", ignore_errors=True)  # a new run each time
                    cpu, modules = _run(WRAPPER, args, src, count, root)
                    figures.setdefault((tree, label), Figures()).cpu.append(cpu)
                    figures[(tree, label)].modules = modules
        _print(figures, commands, references, trees, options.rounds)


def _print(
    figures: dict[tuple[str, str], Figures],
    commands: dict[str, list[str]],
    references: dict[str, str],
    trees: dict[str, Path],
    rounds: int,
) -> None:
    base = figures[("ref", "import typer, rich")].median
    print(f"CPU seconds of start, median of {rounds} fresh processes; modules = len(sys.modules)")
    for label in references:
        ref = figures[("ref", label)]
        print(f"  reference {label:<28} {ref.median:6.3f} s  {ref.modules:4d} modules")
    header = f"{'command':<30} {'modules':>7} {'CPU s':>7} {'x typer+rich':>12}"
    if "against" in trees:
        header += f" | {'against':>7} {'CPU s':>7} {'this/against':>12}"
    print(header)
    for label in commands:
        this = figures[("this", label)]
        row = f"{label:<30} {this.modules:7d} {this.median:7.3f} {this.median / base:12.2f}"
        if "against" in trees:
            other = figures[("against", label)]
            row += f" | {other.modules:7d} {other.median:7.3f} {this.median / other.median:12.2f}"
        print(row)


if __name__ == "__main__":
    main()
