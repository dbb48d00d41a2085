"""Start-up cost of the example commands as subprocesses (issue 4: each <= 80 ms median).

Reference in the same run: a bare `python -c pass`, so the ratio shows what the command
itself costs on top of the interpreter.

    python benchmarks/example_commands.py [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolane.examples.selfevolve._workspace import write_workspace


def median_ms(argv: list[str], runs: int) -> float:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, check=True, capture_output=True, timeout=60)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    runs = parser.parse_args().runs
    with tempfile.TemporaryDirectory() as root:
        work = Path(root)
        write_workspace(work)
        case = work / "case.json"
        case.write_text(
            json.dumps(json.loads((work / "dataset.jsonl").read_text().splitlines()[30]))
        )
        module = [sys.executable, "-m", "evolane.examples.selfevolve"]
        out = str(work / "out")
        cases = {
            "python -c pass (reference)": [sys.executable, "-c", "pass"],
            "selfevolve replay": [
                *module,
                "replay",
                "--case-file",
                str(case),
                "--candidate",
                str(work / "target"),
                "--output-dir",
                out,
            ],
            "selfevolve judge": [*module, "judge", "--case-file", str(case), "--output-dir", out],
        }
        sleeper = [sys.executable, "-m", "evolane.examples.sleeper"]
        subprocess.run(
            [*sleeper, "init", str(work / "sl"), "--median-seconds", "0"],
            check=True,
            capture_output=True,
        )
        row = (work / "sl" / "dataset.jsonl").read_text().splitlines()[0]
        (work / "sl_case.json").write_text(row)
        sl_args = [
            "--case-file",
            str(work / "sl_case.json"),
            "--output-dir",
            str(work / "sl_out"),
            "--seed",
            "1",
        ]
        cases["sleeper replay (0 s sleep)"] = [
            *sleeper,
            "replay",
            *sl_args,
            "--candidate",
            str(work / "sl" / "target"),
        ]
        cases["sleeper judge"] = [*sleeper, "judge", *sl_args]
        results = {name: median_ms(argv, runs) for name, argv in cases.items()}
    reference = results["python -c pass (reference)"]
    for name, ms in results.items():
        print(f"{name:28} {ms:7.1f} ms median  ({ms / reference:.2f}x the bare interpreter)")
    print("target: the decision agent's replay and judge each <= 80 ms median")


if __name__ == "__main__":
    main()
