"""Coding-agent CLIs as optimizer presets (``--optimizer agent:NAME``): the command line each
preset expands to, the usage each one reads from its CLI's output, the not-installed error,
plugins, the optimizer lane running a preset, and ``evolane optimize`` end to end, all
against fake CLIs of the same names (`tests.agent_fakes`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from importlib.metadata import EntryPoint
from pathlib import Path
from typing import Any

import pytest
import trio

from evolane.campaign import CampaignConfig
from evolane.campaign._containment import containment
from evolane.lanes import (
    AGENT_PROMPT_BYTES,
    BUILTIN_AGENTS,
    AgentCall,
    AgentCommand,
    AgentNotInstalledError,
    AgentPreset,
    AgentSpecError,
    OptimizerLane,
    OptimizerSettings,
    agent_presets,
    agent_prompt,
    is_agent_spec,
    optimizer_command,
    resolve_agent,
    usage_document,
)
from evolane.measure import CommandSettings, optimizer_settings
from evolane.messages import ProposeJob, ProposeResult
from evolane.sandbox import SandboxHost
from evolane.sandbox._confine import confinement_problem
from evolane.store import BlobStore, snapshot_tree
from tests.agent_fakes import (
    AIDER_SESSION_COST,
    CLAUDE_COST,
    OPENCODE_COSTS,
    install_fakes,
    path_with,
)
from tests.campaign_helpers import toy_flags, with_flag, write_toy

PROGRAMS = {
    "claude-code": "claude",
    "codex": "codex",
    "gemini-cli": "gemini",
    "aider": "aider",
    "opencode": "opencode",
}
EXPECTED_USAGE: dict[str, dict[str, Any]] = {
    "claude-code": {
        "tokens": 470,
        "input_tokens": 420,
        "output_tokens": 50,
        "cached_input_tokens": 300,
        "cost_usd": CLAUDE_COST,
        "model": "claude-sonnet-4-5",
    },
    "codex": {
        "tokens": 1200,
        "input_tokens": 1000,
        "output_tokens": 200,
        "cached_input_tokens": 400,
    },
    "gemini-cli": {
        "tokens": 1120,
        "input_tokens": 1000,
        "output_tokens": 120,
        "cached_input_tokens": 500,
        "model": "gemini-2.5-pro",
    },
    "aider": {
        "tokens": 4000,
        "input_tokens": 3800,
        "output_tokens": 200,
        "cached_input_tokens": 1200,
        "cost_usd": AIDER_SESSION_COST,
        "model": "gpt-4.1",
    },
    "opencode": {
        "tokens": 1220,
        "input_tokens": 1150,
        "output_tokens": 70,
        "cached_input_tokens": 300,
        "cost_usd": pytest.approx(sum(OPENCODE_COSTS)),
    },
}
SUMMARIES = {
    "claude-code": "Added a note to NOTES.md",
    "codex": "Noted the iteration in NOTES.md",
    "gemini-cli": "Wrote NOTES.md",
    "aider": "Applied edit to NOTES.md",
    "opencode": "Updated NOTES.md",
}
PROMPT = {"instructions": "Make the notes better.", "iteration": 3, "focus": "all"}


@pytest.fixture
def fakes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The fake CLIs, first on PATH."""
    folder = install_fakes(tmp_path / "fake-bin")
    monkeypatch.setenv("PATH", path_with(folder))
    return folder


def job_layout(root: Path) -> tuple[Path, Path, Path]:
    """A job directory like the lane's: prompt.json, workdir/ (one file), context/."""
    (root / "workdir" / "sub").mkdir(parents=True)
    (root / "workdir" / "README.md").write_text("seed\n")
    (root / "workdir" / "sub" / "data.txt").write_text("x\n")
    (root / "context").mkdir()
    (root / "context" / "index.json").write_text('{"cases": 2}')
    (root / "prompt.json").write_text(json.dumps(PROMPT))
    return root / "prompt.json", root / "workdir", root / "context"


def run_preset(agent: AgentCommand, root: Path) -> tuple[subprocess.CompletedProcess[bytes], Path]:
    prompt_json, workdir, context = job_layout(root)
    call = agent.call(prompt_json, root / "prompt.md", workdir, context)
    done = subprocess.run(agent.argv(call), cwd=workdir, capture_output=True, timeout=60)
    return done, workdir


# -- expansion --------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_preset_expands_to_an_absolute_executable_and_its_cli_flags(
    name: str, fakes: Path, tmp_path: Path
) -> None:
    agent = resolve_agent(f"agent:{name}")
    assert agent.path == str(fakes / PROGRAMS[name]) and agent.spec == f"agent:{name}"
    prompt_json, workdir, context = job_layout(tmp_path / "job")
    call = agent.call(prompt_json, tmp_path / "job" / "prompt.md", workdir, context)
    argv = agent.argv(call)
    assert argv[0] == agent.path and os.path.isabs(argv[0])
    assert argv == agent.argv(call)  # deterministic: a resumed run runs the same
    text = (tmp_path / "job" / "prompt.md").read_text()
    assert "Make the notes better." in text and "Iteration 3" in text
    assert str(workdir) in text and str(context) in text
    assert call.prompt_text == text
    expected = {
        "claude-code": ["-p", text, "--output-format", "stream-json", "--verbose", "--max-turns"],
        "codex": ["exec", "--json", "--sandbox", "workspace-write", "--cd", str(workdir), text],
        "gemini-cli": ["-p", text, "--output-format", "json", "--approval-mode", "auto_edit"],
        "aider": ["--message-file", str(call.prompt_file), "--yes-always", "--no-git"],
        "opencode": ["run", "--format", "json", text],
    }[name]
    assert all(word in argv for word in expected), argv
    if name == "claude-code":
        assert argv[1:3] == ("-p", text)  # before the flags that take several values
        assert argv[argv.index("--permission-mode") + 1] == "acceptEdits"
    if name == "aider":
        assert argv[-2:] == ("--file=README.md", "--file=sub/data.txt")


def test_the_prompt_text_is_bounded(fakes: Path, tmp_path: Path) -> None:
    big = {"instructions": "x" * (200 << 10), "iteration": 0}
    text = agent_prompt(big, None, workdir=tmp_path, prompt_file=tmp_path / "prompt.md")
    assert len(text.encode()) <= AGENT_PROMPT_BYTES < 64 << 10
    assert text.startswith("You are the optimizer of an evolane campaign.")


# -- the fakes, run as the real CLIs would be --------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_preset_runs_its_cli_and_reads_usage_and_summary(
    name: str, fakes: Path, tmp_path: Path
) -> None:
    agent = resolve_agent(f"agent:{name}")
    done, workdir = run_preset(agent, tmp_path / "job")
    assert done.returncode == 0, done.stderr
    assert (
        workdir / "NOTES.md"
    ).read_text() == f"{PROGRAMS[name]}: Iteration 3, convergence None, focus all.\n"
    assert agent.preset.usage(done.stdout) == EXPECTED_USAGE[name]
    assert agent.summary(done.stdout) == SUMMARIES[name]
    usage_file = tmp_path / "usage.json"
    assert agent.record_usage(usage_file, done.stdout) == EXPECTED_USAGE[name]
    assert json.loads(usage_file.read_text()) == EXPECTED_USAGE[name]


def test_the_fakes_refuse_flags_their_cli_does_not_have(fakes: Path, tmp_path: Path) -> None:
    """The fakes are strict, so the expansion tests above mean something."""
    for argv in (
        [str(fakes / "claude"), "-p", "x", "--output-format", "stream-json", "--bogus"],
        [str(fakes / "claude"), "-p", "x", "--output-format", "stream-json", "--max-turns", "3",
         "--permission-mode", "acceptEdits", "--allowedTools", "Read"],  # no --verbose
        [str(fakes / "codex"), "exec", "--json", "x"],
        [str(fakes / "aider"), "--message", "x"],
    ):  # fmt: skip
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, timeout=60)
        assert done.returncode != 0, argv
    assert not (tmp_path / "NOTES.md").exists()


def test_the_clis_own_usage_file_wins(fakes: Path, tmp_path: Path) -> None:
    agent = resolve_agent("agent:claude-code")
    done, _ = run_preset(agent, tmp_path / "job")
    usage_file = tmp_path / "usage.json"
    usage_file.write_text('{"tokens": 1, "cost_usd": 9.0}')
    assert agent.record_usage(usage_file, done.stdout) is None
    assert json.loads(usage_file.read_text()) == {"tokens": 1, "cost_usd": 9.0}


GARBAGE = [
    b"",
    b"not json at all\n",
    b"{",
    b"[1, 2, 3]",
    b"\xff\xfe\x00garbage\x00",
    b'{"type": "result", "usage": "lots", "total_cost_usd": "free"}',
    b'{"type": "result", "usage": {"input_tokens": -5, "output_tokens": 1e400}}',
    b'{"type": "turn.completed", "usage": [1, 2]}\n{"type": "step_finish", "part": 7}',
    b'{"response": 3, "stats": {"models": {"m": {"tokens": {"prompt": "many"}}}}}',
    b'{"type": "step_finish", "part": {"tokens": {"input": true}, "cost": -1}}',
    b"Tokens: lots sent, none received. Cost: $free message",
    b'{"a": ' * 10_000,
]


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_garbage_output_is_unknown_usage_never_a_crash(name: str) -> None:
    preset = BUILTIN_AGENTS[name]
    for data in GARBAGE:
        usage = preset.usage(data)
        assert usage is None or "cost_usd" not in usage or usage["cost_usd"] >= 0, (data, usage)
        if usage is not None:  # whatever was read is well-formed
            assert all(isinstance(v, int) and v >= 0 for k, v in usage.items() if "tokens" in k)
        assert isinstance(preset.summary(data), str)
    assert preset.usage(b"") is None and preset.usage(b"not json at all\n") is None


def test_usage_document_leaves_out_what_is_unknown() -> None:
    assert usage_document(None, None) is None
    assert usage_document(10, None) == {"tokens": 10, "input_tokens": 10}
    assert usage_document(None, None, cost_usd=0.5) == {"cost_usd": 0.5}


# -- resolution -------------------------------------------------------------------------------


def test_a_cli_that_is_not_installed_is_one_clear_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    for name, program in PROGRAMS.items():
        with pytest.raises(AgentNotInstalledError) as caught:
            resolve_agent(f"agent:{name}")
        assert isinstance(caught.value, ValueError)
        assert str(caught.value) == (
            f"--optimizer agent:{name}: `{program}` is not installed (not found on PATH)"
        )
    with pytest.raises(AgentNotInstalledError):
        optimizer_settings("agent:claude-code", CommandSettings())
    with pytest.raises(AgentSpecError, match=r"agent:nope: unknown coding agent \(known: aider"):
        resolve_agent("agent:nope")
    assert is_agent_spec(" agent:codex") and not is_agent_spec("python agent:codex")


MY_PRESET = AgentPreset(
    name="mine",
    program="claude",  # the fake, for a plugin that wraps it differently
    argv=lambda call: (call.executable, "-p", "x"),
    usage=lambda stdout: None,
    summary=lambda stdout: "mine",
)
NOT_A_PRESET = object()


def test_plugins_add_presets_through_entry_points(
    fakes: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    points = [
        EntryPoint("mine", f"{__name__}:MY_PRESET", "evolane.agents"),
        EntryPoint("broken", f"{__name__}:NOT_A_PRESET", "evolane.agents"),
        EntryPoint("missing", "tests.no_such_module:X", "evolane.agents"),
        EntryPoint("codex", f"{__name__}:MY_PRESET", "evolane.agents"),  # a built-in wins
    ]
    monkeypatch.setattr(
        "evolane.lanes._agents.entry_points", lambda group: [p for p in points if p.group == group]
    )
    assert resolve_agent("agent:mine").preset is MY_PRESET
    assert resolve_agent("agent:codex").preset is BUILTIN_AGENTS["codex"]
    assert set(agent_presets()) == {*BUILTIN_AGENTS, "mine"}
    with pytest.raises(AgentSpecError, match="is not an AgentPreset"):
        resolve_agent("agent:broken")
    with pytest.raises(AgentSpecError, match="failed to load: ModuleNotFoundError"):
        resolve_agent("agent:missing")


# -- settings and containment ------------------------------------------------------------------


def test_optimizer_settings_show_a_confined_agent_its_executable(
    fakes: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link_dir = tmp_path / "links"
    link_dir.mkdir()
    (link_dir / "claude").symlink_to(fakes / "claude")
    monkeypatch.setenv("PATH", path_with(link_dir))
    settings = optimizer_settings("agent:claude-code", CommandSettings())
    assert settings.agent is not None and settings.agent.path == str(link_dir / "claude")
    assert {str(link_dir), str(fakes)} <= set(settings.view.read_only)
    assert optimizer_command("agent:claude-code").split() == [
        str(link_dir / "claude"),
        str(fakes / "claude"),
    ]
    assert optimizer_command("python opt.py {workdir}") == "python opt.py {workdir}"


@pytest.mark.skipif(confinement_problem() is not None, reason="no confinement here")
def test_containment_refuses_an_agent_installed_where_commands_may_not_look(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "target"
    install_fakes(target / "bin", ("claude",))
    monkeypatch.setenv("PATH", path_with(target / "bin"))
    (tmp_path / "cases.jsonl").write_text('{"id": "a", "input": 1}\n')
    config = CampaignConfig(
        target=str(target),
        dataset=str(tmp_path / "cases.jsonl"),
        replay="true",
        optimizer="agent:claude-code",
        store=str(tmp_path / "store"),
        isolation="confined",
    )
    with pytest.raises(ValueError, match=r"--optimizer names .*claude, inside .*target"):
        containment(config)


# -- the optimizer lane --------------------------------------------------------------------------


def lane_job(store: BlobStore, root: Path, slot: str, prompt: dict[str, Any]) -> ProposeJob:
    (root / "parent").mkdir(exist_ok=True)
    (root / "parent" / "README.md").write_text("seed\n")
    return ProposeJob(
        slot_id=slot,
        parent_ref=snapshot_tree(store, root / "parent"),
        prompt_ref=store.put_bytes(json.dumps(prompt).encode()),
        seed=0,
        timeout_seconds=60.0,
        idle_seconds=30.0,
    )


async def propose(
    host: SandboxHost, store: BlobStore, agent: AgentCommand, job: ProposeJob
) -> ProposeResult:
    settings = OptimizerSettings(template=agent.template(), agent=agent, kill_grace=0.2)
    with trio.fail_after(90):
        return await OptimizerLane(host, store, settings).receive(job)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
async def test_the_lane_runs_a_preset_and_meters_what_it_reports(
    name: str, fakes: Path, host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    agent = resolve_agent(f"agent:{name}")
    result = await propose(host, store, agent, lane_job(store, tmp_path, f"slot-{name}", PROMPT))
    assert result.status == "succeeded", result
    assert result.summary == SUMMARIES[name]
    expected = EXPECTED_USAGE[name]
    if "cost_usd" in expected:
        assert result.usage.tokens == expected["tokens"]
        assert result.usage.cost_usd == pytest.approx(expected["cost_usd"])
    else:  # tokens without a cost: the spend is unknown (fail-closed)
        assert result.usage.cost_usd is None
    assert result.tree_ref is not None


# -- end to end ------------------------------------------------------------------------------------


ISOLATIONS = [
    "process",
    pytest.param(
        "confined",
        marks=pytest.mark.skipif(confinement_problem() is not None, reason="no confinement"),
    ),
]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_evolane_optimize_with_a_claude_code_preset(isolation: str, tmp_path: Path) -> None:
    fakes = install_fakes(tmp_path / "fake-bin", ("claude",))
    # The toy campaign (sh replays), not the self-evolution example (80 cases, a python
    # process per replay and judge: ~17 CPU-s per isolation): the preset is what is tested.
    flags = toy_flags(write_toy(tmp_path / "toy", {}), tmp_path / "st")
    for name, value in (("--optimizer", "agent:claude-code"), ("--iterations", "1")):
        flags = with_flag(flags, name, value)
    args = ["optimize", *flags, "--isolation", isolation]  # the toy runs 2 slots
    env = {**os.environ, "PATH": path_with(fakes)}
    done = subprocess.run(
        [sys.executable, "-m", "evolane", *args], capture_output=True, text=True, env=env,
        timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    (path,) = (tmp_path / "st" / "runs").glob("*/report.json")
    report = json.loads(path.read_text())
    assert report["config"]["optimizer"] == "agent:claude-code"
    spent = report["budget"]["spent_by_stage"]["optimizer"]
    calls = round(spent["cost_usd"] / CLAUDE_COST)
    assert calls >= 1 and spent["cost_usd"] == pytest.approx(calls * CLAUDE_COST)
    assert spent["tokens"] == calls * EXPECTED_USAGE["claude-code"]["tokens"]
    proposed = [f for f in report["funnel"] if f["optimizer"] == SUMMARIES["claude-code"]]
    assert proposed and all(f["digest"] for f in proposed), report["funnel"]
    assert any("paired_replay" in f["stages"] for f in proposed)  # measured, not only made


def test_evolane_optimize_says_when_the_agent_is_not_installed(tmp_path: Path) -> None:
    args = ["optimize", "--example", "self-evolution", "--example-dir", str(tmp_path / "ex"),
            "--store", str(tmp_path / "st"), "--optimizer", "agent:gemini-cli",
            "--progress", "none", "--isolation", "process"]  # fmt: skip
    env = {**os.environ, "PATH": str(tmp_path / "empty") + os.pathsep + os.path.dirname(
        sys.executable)}  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-m", "evolane", *args], capture_output=True, text=True, env=env,
        timeout=120,
    )  # fmt: skip
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().splitlines()
    assert lines == [
        "evolane: error: --optimizer agent:gemini-cli: `gemini` is not installed "
        "(not found on PATH)"
    ], done.stderr


async def test_a_failing_cli_or_a_broken_plugin_costs_the_slot_only(
    fakes: Path, host: SandboxHost, store: BlobStore, tmp_path: Path
) -> None:
    agent = resolve_agent("agent:claude-code")
    failing = {**PROMPT, "instructions": "FAKE_FAIL"}  # the fake exits 5 after its edit
    result = await propose(host, store, agent, lane_job(store, tmp_path, "s-fail", failing))
    assert result.status == "failed" and result.failure is not None
    assert result.failure.code == "exit_5" and result.usage.cost_usd is None

    def broken(call: AgentCall) -> tuple[str, ...]:
        raise RuntimeError("bug")

    plugin = AgentCommand(replace(MY_PRESET, argv=broken), agent.path)
    result = await propose(host, store, plugin, lane_job(store, tmp_path, "s-bug", PROMPT))
    assert result.status == "failed" and result.failure is not None
    assert result.failure.code == "prepare_failed" and "no command line" in result.failure.message
    wrong = AgentCommand(
        replace(MY_PRESET, argv=lambda call: ("/bin/sh", "-c", "true")), agent.path
    )
    result = await propose(host, store, wrong, lane_job(store, tmp_path, "s-wrong", PROMPT))
    assert result.failure is not None and "must start with" in result.failure.message
