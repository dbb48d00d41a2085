"""The `actors` stress scenario and the `evolane stress` command (small configurations)."""

from __future__ import annotations

import subprocess
import sys

import orjson
import pytest
from pydantic import ValidationError

from evolane.stress import StressConfig, explain, fault_schedule, run_actor_stress, scenario_config


async def test_small_storm_loses_nothing_and_counts_refusals_and_restarts() -> None:
    # Tiny mailboxes and many tell_nowait sends force refusals; 5% crashes force restarts.
    config = StressConfig(
        actors=20, messages=4000, faults=0.05, nowait_ratio=0.5, mailbox_size=2, seed=3
    )
    report = await run_actor_stress(config)
    assert report.ok, report.invariants
    assert report.lost == 0
    assert report.sent == 4000
    assert report.refused > 0
    assert report.restarts > 0
    assert report.delivered + report.dead_lettered + report.refused == report.sent
    planned_crashes = sum(crash for _, crash, _ in fault_schedule(config))
    assert report.restarts <= planned_crashes


def test_the_fault_schedule_is_reproducible_from_the_seed() -> None:
    config = StressConfig(actors=50, messages=500, faults=0.1, seed=11)
    assert fault_schedule(config) == fault_schedule(config)
    assert fault_schedule(config) != fault_schedule(config.model_copy(update={"seed": 12}))
    crashes = sum(crash for _, crash, _ in fault_schedule(config))
    assert 20 <= crashes <= 80


def _evolane(*args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", "from evolane.cli import main; main()", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_stress_quick_json_reports_zero_loss() -> None:
    done = _evolane("stress", "--quick", "--json")
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)
    assert report["scenario"] == "actors"
    assert report["counts"]["lost"] == 0
    assert report["counts"]["sent"] == 20_000
    assert all(report["invariants"].values())


def test_bad_input_is_one_line_and_exit_code_2() -> None:
    for args in (["stress", "--faults", "3"], ["stress", "--actors", "x"], ["stress", "--nope"]):
        done = _evolane(*args)
        assert done.returncode == 2, args
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("evolane: error:"), done.stderr
        assert "Traceback" not in done.stderr


def test_sizes_that_would_not_fit_in_memory_are_refused() -> None:
    """An actor holds ~12 KiB and the plan ~100 bytes a message: found by review, a million
    actors and 100 million messages (~22 GiB) were accepted (checked without running them)."""
    for name, size in (("actors", 1_000_000), ("messages", 100_000_000)):
        with pytest.raises(ValidationError) as caught:
            scenario_config("actors", options={name: size})
        assert explain(caught.value, [name]).startswith(f"--{name}: input should be less than")


def test_schema_prints_every_message_kind() -> None:
    done = _evolane("schema", "messages")
    assert done.returncode == 0
    assert {"ping", "pong", "stress.work"} <= set(orjson.loads(done.stdout)["kinds"])
