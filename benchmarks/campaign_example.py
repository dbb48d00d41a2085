"""The self-evolution example with default settings: wall, val lift, gates, harm rejected.

Runs ``evolane optimize --example self-evolution`` in a fresh directory (as a user would),
then reads the report: wall time (target <= 90 s on 2 cores), val baseline -> best (target
~0.3 -> >= 0.7), every local gate exercised, every harmful candidate (by the example's ground
truth) rejected, and zero replays spent on locally rejected candidates.

    python benchmarks/campaign_example.py [--seed N] [--isolation auto|confined|process]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from evolane.examples.selfevolve._optimizer import EDITS

GATES = ("disallowed_entries", "no_op", "duplicate", "protected_paths", "size_limit", "malformed")


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=None, help="default: the example's preset")
    parser.add_argument("--isolation", default=None, help="default: evolane's (auto)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        command = [sys.executable, "-m", "evolane", "optimize", "--example", "self-evolution",
                   "--example-dir", str(root / "ex"), "--store", str(root / "store"),
                   "--progress", "none"]  # fmt: skip
        if args.seed is not None:
            command += ["--seed", str(args.seed)]
        if args.isolation is not None:
            command += ["--isolation", args.isolation]
        started = time.monotonic()
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        wall = time.monotonic() - started
        if done.returncode != 0:
            print(done.stdout, done.stderr)
            return 1
        (report_path,) = (root / "store" / "runs").glob("*/report.json")
        report = json.loads(report_path.read_text())
    effect = {edit.name: edit.effect for edit in EDITS}
    gates_hit = {g["gate"] for f in report["funnel"] for g in f["gates"] if g["outcome"] != "pass"}

    def effects(slot: dict) -> set[str]:
        kind, _, names = slot["optimizer"].partition(": ")
        return {effect.get(name, "?") for name in names.split(" + ")} if kind == "edit" else set()

    # harmful: made of harmful edits only (a combined edit with a helpful part may be a net gain)
    harmful = [f for f in report["funnel"] if "harm" in effects(f) and "help" not in effects(f)]
    harmful_accepted = [f["slot_id"] for f in harmful if f["terminal"] == "selected"]
    paired = {m["measurement_id"] for m in report["measurements"] if m["purpose"] == "paired"}
    local = [f["slot_id"] for f in report["funnel"] if "paired_replay" not in f["stages"]]
    wasted = sorted(paired & set(local))
    scores = report["scores"]
    base, best = scores["baseline_val"]["mean"], scores["best_val"]["mean"]
    test_base, test_best = scores["baseline_test"]["mean"], scores["best_test"]["mean"]
    print(f"wall {wall:.1f} s (target <= 90 s); {report['status']} / {report['campaign_status']}")
    print(f"isolation: {report['isolation']}")
    print(f"val {base:.3f} -> {best:.3f} (target >= 0.7); test {test_base:.3f} -> {test_best:.3f}")
    print(f"gates exercised: {sorted(gates_hit)}; missing: {sorted(set(GATES) - gates_hit)}")
    print(f"harmful candidates: {len(harmful)}, accepted: {harmful_accepted}")
    print(f"replays on locally rejected candidates: {len(wasted)}")
    print(f"candidates {len(report['funnel'])}, replays run "
          f"{sum(m['units_run'] for m in report['measurements'])}")  # fmt: skip
    ok = (wall <= 90 and scores["best_val"]["mean"] >= 0.7 and not harmful_accepted
          and not wasted and gates_hit >= set(GATES))  # fmt: skip
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
