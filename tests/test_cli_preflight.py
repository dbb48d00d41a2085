"""Preflight through the real CLI (issue 16): ``optimize`` and ``estimate`` say the smallest
gain the gate can accept before anything runs, and refuse (exit 2, one line, nothing
written) a configuration in which no candidate can ever be accepted; the estimate's
ceilings, worst case, probe and spend per unit as a user plans from them."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.campaign_helpers import toy_flags, usage_replay, write_toy

EVOLANE = [sys.executable, "-m", "evolane"]
SIXTEEN = (
    "with 16 val cases, pass/fail scores (1/1 repetitions) and k = 1, a candidate must fix "
    "at least 2 case(s) while breaking none"
)


def _run(args: list[str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*EVOLANE, *args], capture_output=True, text=True, timeout=timeout)


def _paired(flags: list[str]) -> list[str]:
    flags = list(flags)
    flags[flags.index("--gate") + 1] = "paired"
    return flags


def test_estimate_prints_the_smallest_acceptable_gain(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "noop"}, val=16, test=16)
    flags = _paired(toy_flags(paths, tmp_path / "store"))
    done = _run(["estimate", *flags])
    assert done.returncode == 0, done.stderr
    assert f"preflight: {SIXTEEN}" in done.stdout and "mean gain >= 0.125" in done.stdout
    as_json = json.loads(_run(["estimate", *flags, "--json"]).stdout)
    assert as_json["min_gain"] == 0.125 and as_json["preflight"][0].startswith(SIXTEEN)


def test_optimize_shows_the_preflight_before_the_run(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "noop"}, val=16, test=16)
    flags = _paired(toy_flags(paths, tmp_path / "store"))
    flags[flags.index("--progress") + 1] = "plain"
    done = _run(["optimize", *flags, "--iterations", "1", "--population", "1"])
    assert done.returncode == 0, done.stderr
    unwrapped = re.sub(r"\n\[ *\d+\.\ds\]     ", " ", done.stdout)  # plain lines fit 80 columns
    lines = unwrapped.splitlines()
    (at,) = [i for i, line in enumerate(lines) if f"] preflight: {SIXTEEN}" in line]
    assert not any("decision" in line.lower() for line in lines[:at])


def test_a_configuration_that_can_never_accept_is_refused(tmp_path: Path) -> None:
    paths = write_toy(tmp_path, {"default": "fix:2"}, val=6, test=6)
    store = tmp_path / "store"
    flags = _paired(toy_flags(paths, store))
    for command in (["optimize"], ["estimate"], ["optimize", "--dry-run"]):
        done = _run([*command, *flags])
        assert done.returncode == 2, (done.stdout, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("evolane: error: --dataset"), lines
        assert "with 6 val cases the paired gate can never accept" in lines[0]
        assert "at least 8 comparable cases" in lines[0]
        assert not store.exists()  # no run directory, no spend


def test_a_later_cycles_estimate_sets_each_ceiling_against_what_is_left(tmp_path: Path) -> None:
    """A ceiling counts the whole campaign: ``estimate --resume-campaign`` compares the next
    cycle's spend with what the earlier cycles left of ``--max-tokens`` (found by estimate
    review: "--max-tokens 9.0k covers this run's ~7.2k" with 4.2k spent already, and the
    cycle then stopped budget limited, exit 3)."""
    paths = write_toy(tmp_path, {"default": "fix:1"}, val=10, test=6)
    flags = toy_flags(paths, tmp_path / "store")
    flags[flags.index("--replay") + 1] = usage_replay(tmp_path, tokens=100)
    flags += ["--iterations", "2", "--population", "1", "--max-improvement-cycles", "3"]
    first = _run(["optimize", *flags, "--max-tokens", "100000"], timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    report = json.loads(next((tmp_path / "store").glob("runs/*/report.json")).read_text())
    spent = report["budget"]["campaign_spent"]["tokens"]
    again = [*flags, "--resume-campaign", report["campaign_id"]]
    tokens = json.loads(_run(["estimate", *again, "--json"]).stdout)["tokens"]
    ceiling = int(tokens + spent / 2)  # this cycle's spend alone fits, not with what was spent
    done = _run(["estimate", *again, "--max-tokens", str(ceiling)])
    assert done.returncode == 0, done.stderr
    line = next(line for line in done.stdout.splitlines() if "ceiling: --max-tokens" in line)
    assert "is below the" in line and "the campaign spent" in line, line


def test_the_worst_case_wall_counts_each_units_kill_grace(tmp_path: Path) -> None:
    """A unit into its timeout is killed only after ``--kill-grace`` when it ignores
    SIGTERM: the ceiling-based wall counts it for every replay (found by estimate review:
    6 candidates whose replays ignore SIGTERM ran 112 s under a worst case of 57 s)."""
    paths = write_toy(tmp_path, {"default": "noop"}, val=8, test=0)
    flags = toy_flags(paths, tmp_path / "store")
    for flag, value in (
        ("--iterations", "1"), ("--population", "6"), ("--replay-timeout", "1"),
        ("--kill-grace", "5"), ("--judge-timeout", "1"), ("--judge-failure-retries", "0"),
        ("--optimizer-timeout", "3"), ("--replay-concurrency", "3"),
    ):  # fmt: skip
        if flag in flags:
            flags[flags.index(flag) + 1] = value
        else:
            flags += [flag, value]
    done = _run(["estimate", "--json", *flags])
    assert done.returncode == 0, done.stderr
    estimate = json.loads(done.stdout)
    lanes = -(-estimate["replays_max"] // 3)
    assert estimate["wall_high_seconds"] >= lanes * (1 + 5) + 6 * (3 + 5)


def test_a_probed_estimate_keeps_the_spend_an_earlier_run_reported(tmp_path: Path) -> None:
    """``estimate --probe`` draws the wall from the probe and keeps the rest of the dry run's
    estimate (found by estimate review: it said "this run's spend is unknown (no earlier run
    in this store reported it)" beside a run that reported 4.2k tokens)."""
    paths = write_toy(tmp_path, {"default": "fix:1"}, val=10, test=6)
    flags = toy_flags(paths, tmp_path / "store")
    flags[flags.index("--replay") + 1] = usage_replay(tmp_path, tokens=100)
    flags += ["--iterations", "1", "--population", "1"]
    first = _run(["optimize", *flags], timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    dry = json.loads(_run(["estimate", "--json", *flags]).stdout)
    probed = _run(["estimate", "--probe", "--json", *flags])
    assert probed.returncode == 0, probed.stderr
    estimate = json.loads(probed.stdout)
    assert estimate["probe"] is not None and dry["tokens"] is not None
    assert estimate["tokens"] == dry["tokens"] and estimate["by_role"] == dry["by_role"]


def test_an_estimate_takes_no_spend_from_a_run_with_another_judge(tmp_path: Path) -> None:
    """Found by README review: after runs with a free judge, the estimate for a model judge
    under ``--max-cost-usd 20`` said "covers this run's ~$0.00": an earlier run's spend
    paces a role only when the role runs the same command (here the judge)."""
    paths = write_toy(tmp_path, {"default": "fix:1"}, val=10, test=6)
    flags = toy_flags(paths, tmp_path / "store")
    flags[flags.index("--replay") + 1] = usage_replay(tmp_path, tokens=100)
    flags += ["--iterations", "1", "--population", "1", "--max-tokens", "10000000"]
    first = _run(["optimize", *flags], timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr
    same = _run(["estimate", "--json", *flags])
    assert json.loads(same.stdout)["tokens"] is not None, same.stderr  # its own commands
    judge = tmp_path / "judge.py"
    judge.write_text("print('{\"score\": 1.0}')\n")
    other = [*flags, "--judge", f"{sys.executable} -I {judge} {{case_file}}"]
    done = _run(["estimate", "--json", *other])
    assert done.returncode == 0, done.stderr
    estimate = json.loads(done.stdout)
    assert estimate["tokens"] is None and "judge" not in estimate["by_role"]
    assert estimate["by_role"]["replay"]["tokens"] > 0  # the replay is the same: it paces
    text = _run(["estimate", *other]).stdout
    assert "--max-tokens" in text and "spend is unknown" in text and "covers" not in text


def test_a_failed_probe_draws_no_range_and_keeps_json_whole(tmp_path: Path) -> None:
    """A probe whose replay fails times nothing worth a range (as doctor says): the estimate
    is the dry run's, exit 1, and under ``--json`` the failure goes to stderr (found by
    estimate review: "wall 0 s .. 21 s" drawn from a failed replay, and a FAIL line after
    the JSON document on stdout)."""
    paths = write_toy(tmp_path, {"default": "noop"}, val=8, test=5)
    flags = toy_flags(paths, tmp_path / "store")
    flags[flags.index("--replay") + 1] = "false"
    done = _run(["estimate", "--probe", "--json", *flags])
    assert done.returncode == 1, done.stdout + done.stderr
    estimate = json.loads(done.stdout)
    assert estimate["probe"] is None and estimate["wall_low_seconds"] is None
    assert done.stderr.startswith("FAIL") and "the replay failed" in done.stderr


def test_the_spend_per_unit_of_a_resumed_run_counts_every_session(tmp_path: Path) -> None:
    """A resumed run's report holds the whole run's spend but only its last session's units
    run: the next estimate divides by the units of every session (found by estimate review:
    100 tokens a replay estimated at 617 after a Ctrl-C and a resume, a 6x spend)."""
    paths = write_toy(tmp_path, {"default": "harm:1"}, val=8, test=5)
    log = tmp_path / "replays.log"
    script = tmp_path / "replay.sh"
    script.write_text(
        f'echo x >> {log}; sleep 0.3; cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
        'echo \'{"tokens": 100}\' > "$2/usage.json"\n'
    )
    flags = toy_flags(paths, tmp_path / "store")
    flags[flags.index("--replay") + 1] = f"sh {script} {{candidate}} {{output_dir}}"
    flags += ["--iterations", "1", "--population", "1", "--expose-rw", str(tmp_path)]
    first = subprocess.Popen([*EVOLANE, "optimize", *flags], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or len(log.read_text()) < 20):
        time.sleep(0.05)  # ten replays started: some are journaled, some in flight
    first.send_signal(signal.SIGINT)
    assert first.wait(timeout=120) == 130
    run_id = next((tmp_path / "store" / "runs").iterdir()).name
    resumed = _run(["optimize", "--resume", run_id, "--store", str(tmp_path / "store")])
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    estimate = json.loads(_run(["estimate", "--json", *flags]).stdout)
    assert estimate["tokens"] == pytest.approx(100 * estimate["replays_max"])


def test_a_lucky_run_stalls_after_stall_iterations(tmp_path: Path) -> None:
    """A run that accepts nothing ends after ``--stall`` iterations: the wall's lower end
    counts no more (found by estimate review: a 12-iteration campaign with --stall 2 that
    accepted nothing ran 9.2 s under a lucky low of 29.9 s)."""
    paths = write_toy(tmp_path, {"default": "harm:1"}, val=10, test=5)
    flags = toy_flags(paths, tmp_path / "store")
    first = _run(["optimize", *flags, "--iterations", "1", "--population", "1"], timeout=300)
    assert first.returncode == 0, first.stdout + first.stderr  # an earlier run paces the range

    def low(iterations: int) -> float:
        more = ["--iterations", str(iterations), "--stall", "2"]
        return json.loads(_run(["estimate", "--json", *flags, *more]).stdout)["wall_low_seconds"]

    assert low(12) == pytest.approx(low(2))
