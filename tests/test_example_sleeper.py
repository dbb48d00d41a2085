"""The synthetic sleeper workload: determinism, fault rates, the known true effect, real runs."""

from __future__ import annotations

import json
import math
import signal
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from evolane.examples.sleeper import (
    FAULT_MODES,
    NOISE_SD,
    Plan,
    SleeperConfig,
    base_score,
    case_id,
    dataset_rows,
    noise,
    plan,
    score,
    variant_of,
)
from evolane.examples.sleeper.commands import main
from evolane.sandbox import ProcessOutcome, SandboxHost, SandboxSpec, lease_holders, open_sandbox

COMMAND = (sys.executable, "-m", "evolane.examples.sleeper")


# ----- init -------------------------------------------------------------------------------


def _init(directory: Path, *flags: str) -> int:
    return main(["init", str(directory), *flags])


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(path.relative_to(directory)): path.read_bytes()
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def test_init_is_byte_identical_for_the_same_arguments(tmp_path: Path) -> None:
    flags = ("--cases", "40", "--seed", "7", "--fail-rate", "0.1", "--baseline-effect", "0.05")
    assert _init(tmp_path / "a", *flags) == 0
    assert _init(tmp_path / "b", *flags) == 0
    assert _init(tmp_path / "c", *flags[:3], "8", *flags[4:]) == 0
    first, again, other = (_files(tmp_path / name) for name in "abc")
    assert set(first) == {"dataset.jsonl", "target/sleeper.json", "target/effect.json"}
    assert first == again
    assert first["dataset.jsonl"] != other["dataset.jsonl"]
    config = json.loads(first["target/sleeper.json"])
    assert config["fail_rate"] == 0.1 and config["median_seconds"] == 0.2
    assert json.loads(first["target/effect.json"]) == {"effect": 0.05}


def test_init_writes_valid_rows_with_all_three_splits(tmp_path: Path) -> None:
    assert _init(tmp_path, "--cases", "64") == 0
    rows = [json.loads(line) for line in (tmp_path / "dataset.jsonl").read_text().splitlines()]
    assert [row["id"] for row in rows] == [case_id(i) for i in range(1, 65)]
    assert rows[0]["id"] == "case-0001"
    assert Counter(row["split"] for row in rows) == {"train": 16, "val": 32, "test": 16}
    for row in rows:
        assert set(row) == {"id", "input", "split", "metadata"}
        assert isinstance(row["input"], dict) and isinstance(row["metadata"], dict)
    assert dataset_rows(64, 0) == rows


def test_init_rejects_bad_settings(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert _init(tmp_path, "--fail-rate", "0.6", "--hang-rate", "0.5") == 2
    assert "add up to" in capsys.readouterr().err
    assert _init(tmp_path, "--spread", "-1") == 2
    assert _init(tmp_path, "--cases", "0") == 2
    with pytest.raises(SystemExit) as exit_info:
        _init(tmp_path, "--tokens-rate", "often")
    assert exit_info.value.code == 2


# ----- pure planning ----------------------------------------------------------------------

RATES = {"fail": 0.1, "hang": 0.05, "ignore_term": 0.05, "escape": 0.1, "flood": 0.1}


def _plans(config: SleeperConfig, cases: int = 200, seeds: int = 20) -> list[Plan]:
    return [plan(case_id(i), seed, config) for i in range(1, cases + 1) for seed in range(seeds)]


def test_each_fault_mode_happens_at_its_configured_rate() -> None:
    config = SleeperConfig(
        **{f"{mode}_rate": rate for mode, rate in RATES.items()}, tokens_rate=0.3
    )
    plans = _plans(config)
    assert len(plans) == 4000
    counts = Counter(step.mode for step in plans)
    for mode in FAULT_MODES:
        assert abs(counts[mode] / 4000 - RATES[mode]) < 0.02, (mode, counts)
    assert abs(counts["normal"] / 4000 - (1 - sum(RATES.values()))) < 0.03
    assert abs(sum(step.report_usage for step in plans) / 4000 - 0.3) < 0.03
    assert all(100 <= step.tokens <= 4000 for step in plans)
    assert all(math.isclose(step.cost_usd, step.tokens * 2e-6) for step in plans)


def test_rates_of_zero_and_one_are_exact() -> None:
    assert {step.mode for step in _plans(SleeperConfig(tokens_rate=0.0), 50, 4)} == {"normal"}
    assert not any(step.report_usage for step in _plans(SleeperConfig(tokens_rate=0.0), 50, 4))
    for mode in FAULT_MODES:
        config = SleeperConfig(**{f"{mode}_rate": 1.0})
        assert {step.mode for step in _plans(config, 50, 4)} == {mode}
        assert all(step.report_usage for step in _plans(config, 50, 4))


def test_durations_are_log_normal_with_the_configured_median() -> None:
    for median, spread in ((0.2, 0.25), (0.05, 0.6)):
        config = SleeperConfig(median_seconds=median, spread=spread)
        durations = [step.duration for step in _plans(config)]
        assert abs(statistics.median(durations) / median - 1) < 0.05
        logs = [math.log(value) for value in durations]
        assert abs(statistics.stdev(logs) / spread - 1) < 0.1
    assert {step.duration for step in _plans(SleeperConfig(median_seconds=0), 10, 2)} == {0.0}


def test_plans_depend_on_case_seed_and_config_only() -> None:
    config = SleeperConfig(fail_rate=0.3)
    assert plan("case-0003", 5, config) == plan("case-0003", 5, SleeperConfig(fail_rate=0.3))
    assert plan("case-0003", 5, config) != plan("case-0003", 6, config)
    assert plan("case-0003", 5, config) != plan("case-0004", 5, config)
    with pytest.raises(ValueError, match="unknown"):
        SleeperConfig.from_dict({"fail_rat": 0.1})
    with pytest.raises(ValueError, match="<= 1"):
        SleeperConfig(hang_rate=1.5)
    assert SleeperConfig.from_dict(SleeperConfig(flood_rate=0.2).to_dict()) == SleeperConfig(
        flood_rate=0.2
    )


# ----- the judge's known truth ------------------------------------------------------------


def test_score_is_the_clipped_sum_of_base_effect_and_noise() -> None:
    for index in range(1, 200):
        for effect in (-1.0, -0.1, 0.0, 0.1, 1.0):
            verdict = score(case_id(index), 3, effect, "v")
            total = verdict["base"] + verdict["effect"] + verdict["noise"]
            assert verdict["score"] == min(1.0, max(0.0, total))
            assert verdict["base"] == base_score(case_id(index))
            assert verdict["noise"] == noise(case_id(index), 3, "v")
    assert score("case-0001", 0, 1.0)["score"] == 1.0
    assert score("case-0001", 0, -1.0)["score"] == 0.0
    bases = [base_score(case_id(i)) for i in range(1, 2001)]
    assert min(bases) >= 0.2 and max(bases) <= 0.8
    jitter = [noise(case_id(i), 0) for i in range(1, 2001)]
    assert abs(statistics.mean(jitter)) < 0.005
    assert abs(statistics.stdev(jitter) / NOISE_SD - 1) < 0.1


def test_paired_deltas_recover_the_true_effect() -> None:
    deltas, bases_agree = [], True
    for index in range(1, 2001):
        case = case_id(index)
        baseline = score(case, 0, 0.0, variant_of(0.0))
        candidate = score(case, 0, 0.1, variant_of(0.1))
        bases_agree &= baseline["base"] == candidate["base"]  # the paired design
        deltas.append(candidate["score"] - baseline["score"])
    assert bases_agree
    assert abs(statistics.mean(deltas) - 0.1) < 0.01
    # baseline and candidate draw independent noise: the delta's spread is sqrt(2) * NOISE_SD
    assert abs(statistics.stdev(deltas) / (NOISE_SD * math.sqrt(2)) - 1) < 0.15
    same = [score(case_id(i), 0, 0.0, "x")["score"] for i in range(1, 50)]
    assert same == [score(case_id(i), 0, 0.0, "x")["score"] for i in range(1, 50)]


# ----- the commands, in process -----------------------------------------------------------


def _workload(tmp_path: Path, *flags: str) -> tuple[Path, Path]:
    """A workload under ``tmp_path``; returns its target folder and the first case's file."""
    root = tmp_path / "workload"
    assert _init(root, "--cases", "8", "--median-seconds", "0.05", *flags) == 0
    case_file = tmp_path / "case.json"
    case_file.write_text((root / "dataset.jsonl").read_text().splitlines()[0])
    return root / "target", case_file


def _judge(case_file: Path, output_dir: Path, seed: int) -> int:
    argv = ["judge", "--case-file", str(case_file), "--output-dir", str(output_dir)]
    return main([*argv, "--seed", str(seed)])


def test_judge_prints_the_score_and_rejects_a_missing_or_bad_output(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, case_file = _workload(tmp_path)
    out = tmp_path / "out"
    assert _judge(case_file, out, 1) == 2
    assert "not found" in capsys.readouterr().err
    out.mkdir()
    (out / "output.json").write_text("{half")
    assert _judge(case_file, out, 1) == 2
    assert "not valid JSON" in capsys.readouterr().err
    (out / "output.json").write_text(json.dumps({"case_id": "case-0001", "effect": "big"}))
    assert _judge(case_file, out, 1) == 2
    (out / "output.json").write_text(json.dumps({"case_id": "case-0002", "effect": 0.1}))
    assert _judge(case_file, out, 1) == 2
    assert "belongs to case" in capsys.readouterr().err
    (out / "output.json").write_text(json.dumps({"case_id": "case-0001", "effect": 0.1}))
    assert _judge(case_file, out, 1) == 0
    printed = capsys.readouterr().out
    assert printed.count("\n") == 1
    assert json.loads(printed) == score("case-0001", 1, 0.1, variant_of(0.1))


def test_replay_rejects_unreadable_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, case_file = _workload(tmp_path)
    argv = ["replay", "--case-file", str(case_file), "--candidate", str(target)]
    argv += ["--output-dir", str(tmp_path / "out"), "--seed", "0"]
    (target / "effect.json").write_text('{"effect": null}')
    assert main(argv) == 2
    (target / "sleeper.json").write_text('{"fail_rate": 2}')
    assert main(argv) == 2
    (target / "sleeper.json").unlink()
    assert main(argv) == 2
    case_file.write_text("[]")
    assert main(argv) == 2
    assert "case file has no string 'id'" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def _optimize(workdir: Path, prompt: Path, seed: int, *flags: str) -> float:
    argv = ["optimize", "--workdir", str(workdir), "--prompt-file", str(prompt)]
    assert main([*argv, "--seed", str(seed), *flags]) == 0
    return json.loads((workdir / "effect.json").read_text())["effect"]


def test_optimizer_picks_effects_by_seed_and_iteration(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target, _ = _workload(tmp_path)
    prompt = tmp_path / "prompt.json"
    assert [_optimize(target, prompt, seed) for seed in range(4)] == [0.15, 0.0, -0.1, 0.15]
    prompt.write_text("")
    assert _optimize(target, prompt, 0) == 0.15
    prompt.write_text("failing cases: case-0001")
    assert _optimize(target, prompt, 0) == 0.15
    prompt.write_text(json.dumps({"iteration": 2, "failures": []}))
    assert _optimize(target, prompt, 0) == -0.1
    assert _optimize(target, prompt, 0, "--effects", "0.3,0.2") == 0.3
    document = json.loads((target / "effect.json").read_text())
    assert document == {"effect": 0.3, "variant": "opt-seed0-iter2"}
    prompt.write_text(json.dumps({"iteration": 1}))
    assert _optimize(target, prompt, 0, "--relative") == 0.3  # 0.3 + 0.0
    assert _optimize(target, prompt, 1, "--relative") == 0.2  # 0.3 - 0.1
    capsys.readouterr()
    argv = ["optimize", "--workdir", str(target), "--prompt-file", str(prompt), "--seed", "0"]
    assert main([*argv, "--effects", "a,b"]) == 2
    assert main([*argv, "--effects", ""]) == 2


def test_commands_import_only_the_standard_library() -> None:
    probe = (
        "import sys, evolane.examples.sleeper.commands\n"
        "outside = {m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)\n"
        "ours = {m for m in sys.modules if m.startswith('evolane.')}\n"
        "print(sorted(outside - {'__main__', '_distutils_hack', 'evolane'}), sorted(ours))"
    )
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    ours = ["evolane._version", "evolane.examples", "evolane.examples.sleeper"]  # one constant
    ours += ["evolane.examples.sleeper.commands", "evolane.examples.sleeper.workload"]
    assert result.stdout.strip() == f"[] {ours}"


def test_replay_and_judge_calls_parse_like_argparse_without_importing_it() -> None:
    from evolane.examples.sleeper.commands import _hot_call, build_parser

    calls = [
        ["replay", "--case-file", "c.json", "--candidate", "t", "--output-dir", "o", "--seed", "7"],
        ["judge", "--seed", "3", "--output-dir", "o", "--case-file", "c.json"],
    ]
    for argv in calls:
        fast, full = _hot_call(argv), build_parser().parse_args(argv)
        assert fast is not None
        assert {k: v for k, v in vars(fast).items() if k != "handler"} == {
            k: v for k, v in vars(full).items() if k != "handler"
        }
        assert fast.handler is full.handler
    for odd in (  # left to argparse: its errors, its help, its negative numbers
        ["judge", "--case-file", "c.json", "--output-dir", "o"],
        ["judge", "--case-file", "c.json", "--output-dir", "o", "--seed", "x"],
        ["judge", "--case-file", "c.json", "--output-dir", "o", "--seed", "-1"],
        ["judge", "--case-file", "c.json", "--output-dir", "o", "--seed", "\u00b3"],
        ["judge", "--case-file", "c.json", "--case-file", "d", "--seed", "1"],
        ["replay", "--help"],
        ["init", "dir"],
    ):
        assert _hot_call(odd) is None
    probe = "import sys; from evolane.examples.sleeper.commands import main; " + (
        "main(sys.argv[1:]); print('argparse' in sys.modules)"
    )
    argv = ["judge", "--case-file", "/nonexistent", "--output-dir", "/nonexistent", "--seed", "1"]
    result = subprocess.run([sys.executable, "-c", probe, *argv], capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr


# ----- real subprocesses in the sandbox ---------------------------------------------------


@pytest.fixture
async def host(tmp_path: Path) -> AsyncIterator[SandboxHost]:
    async with open_sandbox(tmp_path / "sb") as opened:
        yield opened


async def _replay(
    host: SandboxHost, tmp_path: Path, *flags: str, timeout: float = 10.0, seed: int = 0
) -> tuple[ProcessOutcome, Path, Path]:
    target, case_file = _workload(tmp_path, *flags)
    out = tmp_path / "sb" / "out"
    argv = (*COMMAND, "replay", "--case-file", str(case_file), "--candidate", str(target))
    spec = SandboxSpec(argv=(*argv, "--output-dir", str(out), "--seed", str(seed)), kill_grace=0.2)
    with trio.fail_after(timeout + 10):
        outcome = await host.run(spec, timeout=timeout)
    assert outcome.survivors == 0, outcome
    assert lease_holders(host.lease) == set()
    return outcome, out, case_file


async def test_a_normal_replay_writes_output_and_usage_and_is_judged(
    host: SandboxHost, tmp_path: Path
) -> None:
    outcome, out, case_file = await _replay(host, tmp_path, "--baseline-effect", "0.1", seed=4)
    assert outcome.ok, outcome
    step = plan("case-0001", 4, SleeperConfig(median_seconds=0.05))
    output = json.loads((out / "output.json").read_text())
    assert output["case_id"] == "case-0001" and output["seed"] == 4
    assert output["effect"] == 0.1 and output["duration"] == step.duration
    usage = json.loads((out / "usage.json").read_text())
    assert usage == {"tokens": step.tokens, "cost_usd": step.cost_usd}
    argv = (*COMMAND, "judge", "--case-file", str(case_file), "--output-dir", str(out))
    with trio.fail_after(20):
        judged = await host.run(SandboxSpec(argv=(*argv, "--seed", "4")), timeout=10)
    assert judged.ok, judged
    assert json.loads(judged.stdout.head) == score("case-0001", 4, 0.1, variant_of(0.1))


async def test_a_failing_replay_exits_1_without_output(host: SandboxHost, tmp_path: Path) -> None:
    outcome, out, _ = await _replay(host, tmp_path, "--fail-rate", "1", "--tokens-rate", "0")
    assert outcome.status == "exited" and outcome.exit_code == 1
    assert b"planned failure of case-0001" in outcome.stderr.head
    assert not (out / "output.json").exists()


async def test_a_hanging_replay_times_out(host: SandboxHost, tmp_path: Path) -> None:
    outcome, out, _ = await _replay(host, tmp_path, "--hang-rate", "1", timeout=1.0)
    assert outcome.status == "timed_out"
    assert outcome.signal == signal.SIGTERM
    assert not out.exists()


async def test_a_replay_ignoring_sigterm_is_killed(host: SandboxHost, tmp_path: Path) -> None:
    outcome, out, _ = await _replay(host, tmp_path, "--ignore-term-rate", "1", timeout=2.0)
    assert outcome.status == "timed_out"
    assert outcome.signal == signal.SIGKILL  # the ladder escalated past the ignored SIGTERM
    assert outcome.kill_latency_seconds is not None  # its figure: benchmarks/kill.py
    assert not out.exists()


async def test_an_escaping_replay_leaves_no_survivor(host: SandboxHost, tmp_path: Path) -> None:
    outcome, out, _ = await _replay(host, tmp_path, "--escape-rate", "1")
    assert outcome.ok, outcome
    assert outcome.escaped_found >= 1
    assert json.loads((out / "output.json").read_text())["mode"] == "escape"


async def test_a_flooding_replay_is_captured(host: SandboxHost, tmp_path: Path) -> None:
    size = 3 << 20
    outcome, out, _ = await _replay(host, tmp_path, "--flood-rate", "1", "--flood-bytes", str(size))
    assert outcome.ok, outcome
    assert outcome.stdout.total_bytes == size and outcome.stdout.truncated
    assert json.loads((out / "output.json").read_text())["mode"] == "flood"
