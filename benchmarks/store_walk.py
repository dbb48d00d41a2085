"""The commands that walk every run of a store: `evolane fsck`, `evolane runs` and
`evolane runs --json` on N runs, each in a fresh process with stdout to a file (not a
terminal), printing wall and peak RSS, and the ratio to a plain directory walk that reads
and parses each run.json (the floor of any listing), measured in the same run.

The store is made as the tests make one: a real toy campaign (tests/campaign_helpers.py)
runs once, then its run folder is copied N times under new ids (a run.json of its own
each; journal, events and report hard-linked: the same bytes, read from the page cache).

    python benchmarks/store_walk.py --runs 1000 10000 100000 --fsck-max 10000
    python benchmarks/store_walk.py --src /path/to/other/checkout/src   # another evolane
"""

from __future__ import annotations

import argparse
import errno
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

LINKED = ("journal.jsonl", "events.jsonl", "report.json")

WALK = """
import os, sys, orjson
runs = os.path.join(sys.argv[1], "runs")
count = 0
for entry in os.scandir(runs):
    with open(os.path.join(entry.path, "run.json"), "rb") as f:
        count += len(orjson.loads(f.read()))
print(count)
"""


def toy_store(root: Path) -> None:
    """Make a store holding one finished toy run under ``root`` (``root/store``). Run in a
    process of its own: a child inherits its parent's peak RSS through the fork, so the
    measuring process stays small (no evolane, no trio)."""
    import trio

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.campaign_helpers import toy_config, write_toy

    from evolane.campaign import RunRequest, run_campaign

    paths = write_toy(root, {"default": "fix:2"})

    async def one() -> None:
        await run_campaign(RunRequest(toy_config(paths, iterations=1, population=1)))

    trio.run(one)


def grow(store: Path, count: int) -> None:
    """Copy the store's first run until it holds ``count`` runs."""
    runs = store / "runs"
    source = min(runs.iterdir())
    record = orjson.loads((source / "run.json").read_bytes())
    have = sum(1 for _ in runs.iterdir())
    linked = {name: source / name for name in LINKED}
    for index in range(have, count):
        run_id = f"r-bench-{index:07d}"
        folder = runs / run_id
        folder.mkdir()
        for name in LINKED:
            try:
                os.link(linked[name], folder / name)
            except OSError as error:  # EMLINK: ext4 keeps at most 65,000 links to a file
                if error.errno != errno.EMLINK:
                    raise
                shutil.copyfile(linked[name], folder / name)
                linked[name] = folder / name
        record.update(run_id=run_id, created=record["created"] + 1)
        (folder / "run.json").write_bytes(orjson.dumps(record))


def measure(command: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """Wall seconds, peak RSS (MiB) and exit code of ``command`` in a fresh process (its
    peak is at least this process's, inherited through the fork: kept small here)."""
    with tempfile.TemporaryFile() as out:
        started = time.perf_counter()
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(process.pid, 0)
        wall = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_maxrss / 1024, process.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--fsck-max", type=int, default=10000, help="skip fsck above N runs")
    parser.add_argument(
        "--commands", nargs="+", default=["fsck", "runs", "runs --json"], help="which to time"
    )
    parser.add_argument("--src", default=str(Path(__file__).resolve().parent.parent / "src"))
    parser.add_argument("--keep", help="make (or reuse) the store here, not in a temp folder")
    parser.add_argument("--make-toy", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_toy:
        toy_store(Path(args.make_toy))
        return
    env = {**os.environ, "PYTHONPATH": args.src, "EVOLANE_PROGRESS_AFTER": "3600"}
    env.pop("COLUMNS", None)
    with tempfile.TemporaryDirectory(prefix="store-walk-") as scratch:
        base = Path(args.keep or scratch)
        store = base / "toy" / "store"
        if not (store / "runs").is_dir():
            make = [sys.executable, __file__, "--make-toy", str(base / "toy")]
            subprocess.run(make, check=True, env=env, stdout=subprocess.DEVNULL)
        print(f"evolane from {args.src}")
        for count in sorted(args.runs):
            grow(store, count)
            walk, walk_rss, _ = measure([sys.executable, "-c", WALK, str(store)], env)
            print(
                f"N = {count:,}: plain walk reading each run.json {walk:.2f} s, {walk_rss:.0f} MiB"
            )
            commands = {"fsck": ["fsck"], "runs": ["runs"], "runs --json": ["runs", "--json"]}
            for name, argv in commands.items():
                if name not in args.commands or (name == "fsck" and count > args.fsck_max):
                    continue
                cli = [sys.executable, "-m", "evolane", *argv, "--store", str(store)]
                wall, rss, code = measure(cli, env)
                print(
                    f"  {name:<12} {wall:8.2f} s  {rss:7.1f} MiB peak  exit {code}  "
                    f"{wall / walk:6.1f}x the walk  {wall / count * 1000:.2f} ms a run"
                )


if __name__ == "__main__":
    main()
