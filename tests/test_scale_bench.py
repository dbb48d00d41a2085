"""benchmarks/scale.py keeps running: its rows have every figure and its counters count."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "benchmarks" / "scale.py"


def _rows(*cases: int) -> list[dict[str, object]]:
    command = [sys.executable, str(SCRIPT), "--json", "--cases", *map(str, cases)]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=3600)
    assert done.returncode == 0, done.stderr[-4000:]
    return orjson.loads(done.stdout.strip().splitlines()[-1])


def test_scale_bench_prints_every_figure_with_live_counters() -> None:
    (row,) = _rows(12)
    assert row["cases"] == 12 and row["units"] == 24
    for key in ("cpu_ms_per_unit", "hand_cpu_ms_per_unit", "ratio", "hops_per_unit"):
        assert isinstance(row[key], float) and row[key] > 0, key
    assert row["fsyncs_per_unit"] > 0  # the journal is on: units are durable before they count
    assert row["peak_rss_mib"] > 0 and row["hand_peak_rss_mib"] > 0


@pytest.mark.slow
def test_scale_bench_runs_a_thousand_cases() -> None:
    (row,) = _rows(1000)
    assert row["units"] > 1000 and row["hops_per_unit"] > 0


def test_rss_phases_tags_every_phase_of_a_measurement() -> None:
    script = SCRIPT.parent / "rss_phases.py"
    command = [sys.executable, str(script), "--cases", "12"]
    done = subprocess.run(command, capture_output=True, text=True, check=False, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    phases = {line.split()[0] for line in done.stdout.splitlines()[2:-1]}
    assert {"load", "store", "plan", "running", "units", "decision"} <= phases, done.stdout
    assert float(done.stdout.splitlines()[-1].split()[1]) > 0
