"""``evolane init``, ``evolane doctor`` and ``evolane estimate --probe`` as a new user runs
them: the starter project passes doctor, its campaign completes and accepts, the probed
estimate's range holds the real run's own wall time, and doctor names what cannot run."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import tomllib
from functools import cache
from pathlib import Path

import pytest

import evolane.sandbox
from evolane.sandbox import trees_run_as_unit_uids, user_counts_step

EVOLANE = [sys.executable, "-m", "evolane"]
PATH_KEYS = ("target", "dataset", "store")
"""The evolane.toml keys that are paths, relative to the file's folder."""


def _run(args: list[str], cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EVOLANE, *args], capture_output=True, text=True, timeout=timeout, cwd=cwd
    )


@cache
def _config_flag_exists() -> bool:
    """Whether ``optimize`` reads ``--config`` (the config file's support may merge later)."""
    done = subprocess.run([*EVOLANE, "optimize", "--help"], capture_output=True, text=True)
    return "--config" in done.stdout


def _config_args(root: Path) -> list[str]:
    """``--config DIR/evolane.toml`` where supported, else the file's values as flags."""
    if _config_flag_exists():
        return ["--config", str(root / "evolane.toml")]
    args = []
    for key, value in tomllib.loads((root / "evolane.toml").read_text()).items():
        text = str(root / value) if key in PATH_KEYS else str(value)
        args += [f"--{key.replace('_', '-')}", text]
    return args


def _init(tmp_path: Path) -> Path:
    done = _run(["init", "proj"], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    root = tmp_path / "proj"
    assert "evolane optimize" in done.stdout and "evolane doctor" in done.stdout
    config = tomllib.loads((root / "evolane.toml").read_text())
    assert {"target", "dataset", "replay", "judge", "optimizer"} <= set(config)
    rows = [json.loads(line) for line in (root / "dataset.jsonl").read_text().splitlines()]
    assert {row["split"] for row in rows} == {"train", "val", "test"}
    return root


def test_init_then_doctor_then_optimize_completes_and_accepts(tmp_path: Path) -> None:
    root = _init(tmp_path)
    args = _config_args(root)

    probed = _run(["estimate", "--probe", "--json", *args], cwd=tmp_path)
    assert probed.returncode == 0, probed.stderr
    estimate = json.loads(probed.stdout)
    assert estimate["probe"]["replay_seconds"] > 0 and estimate["probe"]["judge_seconds"] > 0
    low, high = estimate["wall_low_seconds"], estimate["wall_high_seconds"]
    assert 0 < low < high < estimate["wall_worst_seconds"]
    assert estimate["judge_calls_max"] == estimate["replays_max"]  # retries are not certain
    text = _run(["estimate", "--probe", *args], cwd=tmp_path)
    assert text.returncode == 0, text.stderr
    assert "probe: one replay" in text.stdout and "worst case" in text.stdout
    dry = _run(["optimize", "--dry-run", "--probe", *args], cwd=tmp_path)  # the same, as a flag
    assert dry.returncode == 0, dry.stderr
    assert "probe: one replay" in dry.stdout and "worst case" in dry.stdout
    # an estimate creates no store (found by review: the probe made .evolane/ and wrote to it)
    assert not (root / ".evolane").exists()

    doctor = _run(["doctor", *args], cwd=tmp_path)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    lines = doctor.stdout.splitlines()
    assert not [line for line in lines if line.startswith("FAIL")], doctor.stdout
    judged = [line for line in lines if "one val case" in line and "score" in line]
    assert judged and "score 1.000" in judged[0], doctor.stdout  # the seed greets in English
    assert any(line.split()[1:2] == ["isolation"] for line in lines), doctor.stdout
    assert "doctor: a campaign can run" in doctor.stdout

    if _config_flag_exists():
        # The config file is found as ruff and pytest find theirs: no flags at all, in DIR.
        run = _run(["optimize"], cwd=root)
    else:  # until evolane.toml support merges: the same values as flags
        run = _run(["optimize", "--progress", "none", *args], cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    reports = list((root / ".evolane" / "runs").glob("*/report.json"))
    assert len(reports) == 1
    report = json.loads(reports[0].read_text())
    assert report["status"] == "finished"
    assert any(d["decision"] == "accept" for d in report["decisions"]), report["decisions"]
    assert report["best"] != report["seed"]


def test_the_starter_dataset_repeats_no_input_across_its_splits(tmp_path: Path) -> None:
    """The starter is the model a user copies: its own preflight must not warn that val or
    test cases are train cases under other ids (it did: 12 such cases, 'Ada' greeted in
    English in train and val)."""
    root = _init(tmp_path)
    done = _run(["estimate", *_config_args(root)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "same input" not in done.stdout + done.stderr, done.stdout
    rows = [json.loads(line) for line in (root / "dataset.jsonl").read_text().splitlines()]
    inputs = [json.dumps(row["input"], sort_keys=True) for row in rows]
    assert len(set(inputs)) == len(rows) == 42


def test_the_starter_case_ids_do_not_name_their_split(tmp_path: Path) -> None:
    """A replay sees its case's id (``EVOLANE_CASE_ID``, ``{case_file}``): the starter a user
    copies named each case by its split (``test-en-12``), so a tree could tell val and test
    cases from train (found by review)."""
    root = _init(tmp_path)
    rows = [json.loads(line) for line in (root / "dataset.jsonl").read_text().splitlines()]
    for row in rows:
        words = set(re.split(r"[^a-z]+", row["id"].lower()))
        assert not words & {"train", "val", "test"}, row["id"]


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["optimize", "--probe", "--target", "nowhere"], "--dry-run"),
        (["optimize", "--dry-run", "--probe", "--resume", "r-none"], "--resume"),
        (["estimate", "--probe", "--resume", "r-none"], "--resume"),
        (["estimate", "--probe", "--from-run", "r-none", "--rerun-evaluator"], "--from-run"),
        (["optimize", "--drain-pending", "--dry-run"], "--drain-pending"),
        (["optimize", "--drain-pending", "--probe"], "--drain-pending"),
        (["config", "show", "--probe"], "--probe"),
    ],
)
def test_a_probe_or_estimate_that_cannot_be_is_refused_with_one_line(
    tmp_path: Path, args: list[str], named: str
) -> None:
    """Only a new run can be estimated or probed; ``config show`` has no ``--probe``."""
    done = _run(args, cwd=tmp_path)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.count("\n") == 1 and named in done.stderr, done.stderr
    assert not (tmp_path / ".evolane").exists()  # refused before anything was written


def test_init_refuses_a_folder_that_holds_a_project_or_its_files(tmp_path: Path) -> None:
    _init(tmp_path)
    again = _run(["init", "proj"], cwd=tmp_path)
    assert again.returncode == 2
    assert again.stderr.startswith("evolane: error:") and "evolane.toml" in again.stderr
    busy = tmp_path / "busy"
    (busy / "skill").mkdir(parents=True)
    refused = _run(["init", str(busy)], cwd=tmp_path)
    assert refused.returncode == 2 and "skill" in refused.stderr, refused.stderr
    assert not (busy / "evolane.toml").exists()  # nothing written
    here = _run(["init"], cwd=busy)  # the default: the current folder
    assert here.returncode == 2 and "skill" in here.stderr


def test_init_refuses_an_empty_folder_name(tmp_path: Path) -> None:
    """``init ""`` (an unset ``"$DIR"``) is one line, exit 2, and writes nothing (found by
    review: it wrote the project into the current folder); no DIR still means this one."""
    for empty in ("", " "):
        done = _run(["init", empty], cwd=tmp_path)
        assert done.returncode == 2, done.stdout + done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("evolane: error:"), done.stderr
        assert "'DIR': empty: name the folder" in lines[0]
    assert list(tmp_path.iterdir()) == []
    here = _run(["init"], cwd=tmp_path)
    assert here.returncode == 0 and (tmp_path / "evolane.toml").is_file(), here.stderr


def test_doctor_fails_on_a_missing_program_and_warns_on_a_relative_path(tmp_path: Path) -> None:
    root = _init(tmp_path)
    config = tomllib.loads((root / "evolane.toml").read_text())
    python, judge = config["judge"].split()[:2]
    relative = str(Path(judge).relative_to(tmp_path))
    flags = ["--target", str(root / "skill"), "--dataset", str(root / "dataset.jsonl"),
             "--store", str(root / ".evolane"), "--optimizer", config["optimizer"],
             "--judge", f"{python} {relative} {{case_file}} {{output_dir}}"]  # fmt: skip
    missing = _run(["doctor", *flags, "--replay", "no-such-agent {case_file}"], cwd=tmp_path)
    assert missing.returncode == 1, missing.stdout + missing.stderr
    failed = [line for line in missing.stdout.splitlines() if line.startswith("FAIL")]
    assert failed and "--replay" in failed[0] and "no-such-agent" in failed[0]
    warned = [line for line in missing.stdout.splitlines() if line.startswith("warn")]
    assert any("relative path" in line and relative in line for line in warned), missing.stdout

    # With the replay fixed, the relative judge script cannot be found in the judge's own
    # folder: the one-case probe fails, and doctor says so (exit 1).
    broken = _run(["doctor", *flags, "--replay", config["replay"]], cwd=tmp_path)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert any(
        line.startswith("FAIL") and "judge" in line for line in broken.stdout.splitlines()
    ), broken.stdout


def test_doctor_fails_on_a_cases_verification_program_the_host_lacks(tmp_path: Path) -> None:
    """Such a program stops the run (as a --judge program missing does): doctor's one-case
    probe took a val case without one, and said a campaign can run (found by review)."""
    root = _init(tmp_path)
    dataset = root / "dataset.jsonl"
    rows = [json.loads(line) for line in dataset.read_text().splitlines()]
    last = next(row for row in reversed(rows) if row["split"] == "val")
    last["verification_command"] = "no-such-checker {output_dir}"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    judged = _run(["doctor", *_config_args(root)], cwd=tmp_path)  # --judge: no verification
    assert judged.returncode == 0, judged.stdout + judged.stderr
    toml = root / "evolane.toml"
    toml.write_text(re.sub(r"(?m)^judge = .*$", "", toml.read_text()))
    done = _run(["doctor", *_config_args(root)], cwd=tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    failed = [line for line in done.stdout.splitlines() if line.startswith("FAIL")]
    assert len(failed) == 1, done.stdout
    assert f"verification_command (case {last['id']}): program no-such-checker" in failed[0]


def test_doctor_refuses_bad_input_with_one_line(tmp_path: Path) -> None:
    root = _init(tmp_path)
    args = _config_args(root)
    bad = _run(["doctor", *args, "--dataset", str(tmp_path / "none.jsonl")], cwd=tmp_path)
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "none.jsonl" in bad.stderr and "Traceback" not in bad.stderr


def test_the_estimate_range_scales_with_its_timing_and_keeps_retries_apart(
    tmp_path: Path,
) -> None:
    from evolane.campaign._estimate import ProbeTiming, UnitHistory, estimate_run
    from tests.campaign_helpers import toy_config, write_toy

    config = toy_config(write_toy(tmp_path, {}), judge="true", judge_failure_retries=2)
    worst = estimate_run(config, val_cases=12, test_cases=6)
    assert worst.wall_low_seconds is None and worst.wall_worst_seconds is None  # no timing
    assert worst.judge_calls_max == worst.replays_max and worst.judge_retries_max == 2 * (
        worst.replays_max
    )
    fast = estimate_run(config, 12, 6, probe=ProbeTiming(replay_seconds=0.1, judge_seconds=0.1))
    slow = estimate_run(config, 12, 6, probe=ProbeTiming(replay_seconds=1.0, judge_seconds=1.0))
    for probed in (fast, slow):
        assert probed.wall_worst_seconds == worst.wall_high_seconds
        assert 0 < probed.wall_low_seconds < probed.wall_high_seconds < worst.wall_high_seconds
    assert slow.wall_low_seconds > fast.wall_low_seconds
    assert slow.wall_high_seconds > fast.wall_high_seconds
    # An earlier run's unit time paces the upper end too (the worst case kept apart).
    seen = estimate_run(config, 12, 6, UnitHistory(seconds=0.5))
    assert seen.wall_worst_seconds == worst.wall_high_seconds
    assert seen.wall_low_seconds <= seen.wall_high_seconds < worst.wall_high_seconds
    # A run stops at its wall-clock budget: no lower end past it (found by estimate review:
    # "wall 8.0s..8.0s" for --wall-clock-budget 5, the run ending budget limited at 5.0 s).
    budgeted = config.model_copy(update={"wall_clock_budget": 5.0})
    timing = ProbeTiming(replay_seconds=1.0, judge_seconds=1.0)
    for timed in (estimate_run(budgeted, 12, 6, probe=timing), estimate_run(
        budgeted, 12, 6, UnitHistory(seconds=10.0)
    )):  # fmt: skip
        assert timed.wall_low_seconds == 5.0 < timed.wall_high_seconds


def _host_lines(
    tmp_path: Path, cgroups: tuple[str, ...], isolation: str = "confined", **limits: object
) -> list[str]:
    """Doctor's host checks for a host giving ``cgroups`` at ``isolation`` and commands with
    ``limits``."""
    from types import SimpleNamespace

    from evolane.campaign._probe import HostReport
    from evolane.cli._doctor import _host_checks
    from evolane.inputs import Case, Dataset
    from evolane.measure import CommandSettings

    host = HostReport(isolation, None, (), cgroups, None)
    config = SimpleNamespace(commands=CommandSettings(**limits))
    dataset = Dataset([Case(id="c1", input="x", expected_output="yes")])
    probe = SimpleNamespace(host=host, prepared=SimpleNamespace(config=config, dataset=dataset))
    return [f"{level} {what} ({why})" for level, what, why in _host_checks(probe, str(tmp_path))]


def test_doctor_says_which_limits_this_host_cannot_enforce(tmp_path: Path) -> None:
    """A host whose cgroup v2 is writable but has no writable pids or memory cgroup (a
    non-root evolane, a cgroup v2-only host, a read-only v1 mount) bounds no command
    tree's processes or memory: doctor warns and names both, as the report does (found by
    review: it said "ok cgroups: cgroup_v2 (memory and process limits, tree kill)")."""
    line = next(line for line in _host_lines(tmp_path, ("cgroup_v2",)) if "cgroups" in line)
    assert line.startswith("warn"), line
    assert "processes 512 NOT ENFORCED" in line and "memory 4 GiB NOT ENFORCED" in line, line
    bare = next(line for line in _host_lines(tmp_path, ()) if "cgroups" in line)
    assert bare.startswith("warn") and "NOT ENFORCED" in bare, bare
    lifted = _host_lines(tmp_path, ("cgroup_v2",), max_procs=None, max_memory=None)
    assert next(line for line in lifted if "cgroups" in line).startswith("ok")
    full = ("cgroup_v2", "pids_cgroup", "memory_cgroup")
    line = next(line for line in _host_lines(tmp_path, full) if "cgroups" in line)
    assert line.startswith("ok") and "processes 512 (pids_cgroup)" in line, line
    if trees_run_as_unit_uids("process"):  # a root evolane: each unit uid's RLIMIT_NPROC
        line = next(
            line for line in _host_lines(tmp_path, ("cgroup_v2",), "process") if "cgroups" in line
        )
        assert "processes 512 (rlimit_nproc)" in line, line
        assert line.startswith("warn") and "memory 4 GiB NOT ENFORCED" in line, line


def test_doctor_warns_where_a_confined_command_could_take_all_per_user_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where a confined command cannot have a user namespace of its own (a kernel before
    5.11, a host forbidding the nested one), one command may take all of the user's inotify
    instances: doctor says so rather than let it pass unseen."""
    if user_counts_step() is not None:  # this host caps them: nothing to warn of
        assert not [line for line in _host_lines(tmp_path, ()) if "per-user counts" in line]
    monkeypatch.setattr(evolane.sandbox, "user_counts_step", lambda: None)
    (line,) = [line for line in _host_lines(tmp_path, ()) if "per-user counts" in line]
    assert line.startswith("warn per-user counts (not capped:") and "inotify" in line, line
    process = _host_lines(tmp_path, (), "process")
    assert not [line for line in process if "per-user counts" in line]


def test_doctor_warns_where_a_command_given_the_network_shares_the_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where slirp4netns is missing, a confined command given the network shares the host's
    network namespace (its loopback services, abstract unix sockets, 169.254.169.254):
    doctor says so for a run that gives a role the network, and nothing for one that gives
    none."""
    import evolane.campaign._containment as containment

    missing = "slirp4netns or ip is not installed (apt-get install -y slirp4netns iproute2)"
    monkeypatch.setattr(containment, "own_network_problem", lambda: missing)
    lines = _host_lines(tmp_path, (), network_for=("replay",))
    (line,) = [line for line in lines if line.startswith("warn network")]
    assert "share the host's" in line and "loopback" in line and missing in line, line
    assert not [line for line in _host_lines(tmp_path, ()) if "warn network" in line]
    monkeypatch.setattr(containment, "own_network_problem", lambda: None)
    assert not [line for line in _host_lines(tmp_path, (), network=True) if "network" in line]


def test_init_that_cannot_write_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    """A folder init cannot make, or a write that fails midway (here the dataset, past a
    2 KiB RLIMIT_FSIZE: the skill file before it was written), is one error line naming the
    path, exit 2, and leaves nothing, so the next ``init`` there works (found by review: a
    traceback, and a partial project the next ``init`` refused)."""
    import resource

    (tmp_path / "a-file").write_text("")
    blocked = _run(["init", "a-file/proj"], cwd=tmp_path)
    assert blocked.returncode == 2, blocked.stderr
    assert blocked.stderr.startswith("evolane: error: init:") and "a-file" in blocked.stderr
    assert blocked.stderr.count("\n") == 1 and "Traceback" not in blocked.stderr

    def small_files() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (2048, 2048))

    done = subprocess.run(
        [*EVOLANE, "init", "deep/proj"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        preexec_fn=small_files,
    )
    assert done.returncode == 2, done.stdout + done.stderr
    assert "dataset.jsonl" in done.stderr and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "deep").exists()  # the folders it made went too
    (tmp_path / "deep").mkdir()
    assert _run(["init", "deep"], cwd=tmp_path).returncode == 0
    assert (tmp_path / "deep" / "evolane.toml").is_file()


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        (b"proj\xff", "its folder's name is not UTF-8 text"),  # evolane.toml names it
        (b"p" * 300, "File name too long"),
    ],
)
def test_init_into_a_name_it_cannot_use_is_one_line_and_leaves_nothing(
    tmp_path: Path, name: bytes, needle: str
) -> None:
    """Found by hostile review: a folder named by bytes not UTF-8 failed writing evolane.toml
    with a traceback (exit 1) and left a partial project that the next ``init`` refused; a
    name over 255 bytes failed its first check with a traceback."""
    done = subprocess.run(
        [*EVOLANE, "init", name], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("evolane: error: init: "), done.stderr
    assert needle in lines[0]
    assert list(tmp_path.iterdir()) == []


def test_the_estimate_sets_each_ceiling_against_what_the_run_may_spend(tmp_path: Path) -> None:
    """``estimate`` shows each ceiling given against the spend and wall it predicts (found
    by review: the README promised spend "against each ceiling", and a --max-tokens below
    the predicted spend or a wall budget below even a lucky run passed without a word)."""
    from evolane.campaign._estimate import Estimate
    from evolane.cli._session import print_estimate

    estimate = Estimate(
        val_cases=18, test_cases=12, baseline_repetitions=1, candidate_repetitions=1,
        replays_max=240, judge_calls_max=240, optimizer_calls_max=4, wall_low_seconds=14.0,
        wall_high_seconds=300.0, tokens=24_000.0, cost_usd=None, basis="earlier run",
    )  # fmt: skip
    flags = {"max_tokens": 20_000, "max_cost_usd": 5.0, "wall_clock_budget": 10.0}
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        print_estimate(estimate, flags)
    ceilings = [line for line in shown.getvalue().splitlines() if "--max-" in line]
    ceilings += [line for line in shown.getvalue().splitlines() if "--wall-clock" in line]
    assert any("--max-tokens 20.0k is below the ~24.0k" in line for line in ceilings), ceilings
    assert any("--max-cost-usd $5.00" in line and "unknown" in line for line in ceilings)
    assert any("--wall-clock-budget 10 s is below even a lucky run" in line for line in ceilings)


def test_doctor_fails_confined_on_a_host_without_bubblewrap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--isolation confined`` where bubblewrap cannot confine is a FAIL check of the
    host, exit 1, with the other checks shown (found by review: doctor ended on optimize's
    one refusal line, exit 2 as for bad input, and its FAIL line was never reached)."""
    from evolane.cli._doctor import run_doctor
    from evolane.sandbox import _confine

    root = _init(tmp_path)
    monkeypatch.setattr(_confine, "confinement_problem", lambda: "bwrap is gone (test)")
    flags = {"config": str(root / "evolane.toml"), "isolation": "confined"}
    code = run_doctor(flags)
    out = capsys.readouterr().out
    assert code == 1, out
    lines = out.splitlines()
    assert lines[0].startswith("FAIL") and "confined" in lines[0], out
    assert "bwrap is gone (test)" in lines[0] and "--isolation auto" in lines[0]
    assert "let bubblewrap create namespaces" in lines[0]  # it is installed here
    assert any(line.startswith("ok") and "--replay" in line for line in lines), out
    assert not (root / ".evolane").exists()  # nothing ran
    monkeypatch.setattr(_confine, "bwrap_path", lambda: None)
    assert run_doctor(flags) == 1
    assert "; install bubblewrap, or pass" in capsys.readouterr().out.splitlines()[0]


@pytest.mark.parametrize(
    ("free", "level", "shown"),
    [(400 << 10, "FAIL", "0 MiB"), (63 << 20, "FAIL", "63 MiB"), (64 << 20, "warn", "64 MiB"),
     (1 << 30, "ok", "1.0 GiB"), (5 << 30, "ok", "5.0 GiB")],
)  # fmt: skip
def test_doctor_fails_a_store_whose_disk_no_run_can_work_on(
    free: int, level: str, shown: str
) -> None:
    """Found by review: with 400 KiB free doctor said "warn disk: 0.0 GiB" and passed, and
    the run then failed at its first write."""
    from evolane.cli._doctor import disk_check

    assert disk_check("st", free)[:2] == (level, f"disk: {shown} free under st")
