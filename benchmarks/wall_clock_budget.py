"""``--wall-clock-budget 10`` on a workload whose replays hang: the run must return
``budget_limited`` (exit 3) within 10 s + kill grace + 1 s, with no process left behind.

    python benchmarks/wall_clock_budget.py [--budget 10] [--kill-grace 2]

Every replay is ``sleep 3600`` (and ignores nothing: the kill ladder still has to reach it
through the sandbox). The run carries a lease marker in its environment, so after it exits
any process of its tree that survived is found by scanning /proc.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolane.sandbox import LEASE_VARIABLE, lease_holders


def _workspace(root: Path) -> list[str]:
    target = root / "target"
    target.mkdir()
    (target / "skill.md").write_text("be careful\n")
    rows = [{"id": f"c{i}", "input": {"i": i}, "expected_output": "yes", "split": "val"}
            for i in range(16)]  # fmt: skip
    (root / "dataset.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return ["--target", str(target), "--dataset", str(root / "dataset.jsonl"),
            "--store", str(root / "store"), "--replay", "sleep 3600",
            "--optimizer", "sh -c 'echo more >> {workdir}/skill.md'",
            "--replay-concurrency", "8", "--progress", "none"]  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--budget", type=float, default=10.0)
    parser.add_argument("--kill-grace", type=float, default=2.0)
    args = parser.parse_args()
    lease = f"bench-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory() as tmp:
        flags = _workspace(Path(tmp))
        limits = ["--wall-clock-budget", str(args.budget), "--kill-grace", str(args.kill_grace)]
        command = [sys.executable, "-m", "evolane", "optimize", *flags, *limits]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False,
                              env={**os.environ, LEASE_VARIABLE: lease})  # fmt: skip
        wall = time.monotonic() - started
        survivors = lease_holders(lease)
        (report_path,) = Path(tmp, "store", "runs").glob("*/report.json")
        report = json.loads(report_path.read_text())
    bound = args.budget + args.kill_grace + 1.0
    print(f"exit code {done.returncode} (want 3); status {report['status']}")
    print(f"wall {wall:.2f} s, bound {bound:.1f} s (budget + kill grace + 1 s), ratio "
          f"{wall / bound:.2f}")  # fmt: skip
    print(f"processes left: {len(survivors)}")
    ok = done.returncode == 3 and report["status"] == "budget_limited" and wall <= bound
    return 0 if ok and not survivors else 1


if __name__ == "__main__":
    sys.exit(main())
