"""A toy campaign workload that runs in seconds: yes/no answers in files, a shell replay, the
built-in exact-match judge, and a scripted optimizer whose every slot does what a plan says.

The target holds one file per case (its JSON answer) plus a protected ``grader/`` folder and
a required ``REQUIRED`` file. The optimizer reads ``{iteration}.{slot}`` from its prompt and
looks up its action in the plan: ``fix:N`` flips the first N failing cases (they all expect
``"yes"``) and, as a real fix would, every failing held-out ``test*`` case too (``fork:N``
also writes a ``FORK`` file, for a replay that forks when it sees one); ``overfit:N``
flips only the first N failing cases (a fix that fits val alone), ``harm:N`` flips N solid
ones, ``noop``, ``same`` (the same edit as slot 0: a duplicate), ``break`` (rewrites
REQUIRED), ``tamper``, ``symlink``, ``oversize``, ``malformed``, ``crash``, ``hang``,
``peek`` (prints whether the context shows answers), ``cure`` (flips every failing case
file of the target, whatever the optimizer was shown: a fix that generalises). A plan with a
``_record`` path gets one JSON line per proposal: the prompt and the context's case folders
(what the optimizer was shown).

The toy's plans name the cases a slot flips by their place among the *failing* cases of its
prompt, and the toy datasets have val and test splits only, so `toy_config` and `toy_flags`
feed back val (``feedback_split="val"``) unless told otherwise: the tests that use them are
about the funnel, gates, budgets and resume, not about which split feeds the optimizer
(tests/test_campaign_splits.py is).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

from evolane.campaign._config import CampaignConfig
from evolane.messages import GateConfig

OPTIMIZER = textwrap.dedent(
    """
    import json, os, sys, time, pathlib
    workdir, prompt_file, plan_file = sys.argv[1:4]
    prompt = json.load(open(prompt_file))
    plan = json.load(open(plan_file))
    key = f"{prompt['iteration']}.{prompt['slot']}"
    action = plan.get(key, plan.get("default", "noop"))
    wd = pathlib.Path(workdir)
    failing = [f["id"] for f in prompt.get("failing", [])]
    solid = list(prompt.get("solid", []))
    def flip(ids):
        for cid in ids:
            path = wd / cid
            path.write_text('"yes"' if path.read_text().strip() == '"no"' else '"no"')
    name, _, count = action.partition(":")
    if name in ("fix", "same", "fork"):
        flip(failing[: int(count or 1)])
        if name == "fork":  # a replay that forks when it sees FORK
            (wd / "FORK").write_text("fork")
        flip(sorted(p.name for p in wd.glob("test*") if p.read_text().strip() == '"no"'))
    elif name == "overfit":
        flip(failing[: int(count or 1)])
    elif name == "harm":
        flip(solid[: int(count or 1)])
    elif name == "break":
        (wd / "REQUIRED").write_text("changed")
    elif name == "tamper":
        (wd / "grader" / "rubric.txt").write_text(f"anything goes {key}")
        flip(failing[:1])
    elif name == "symlink":
        os.symlink("/etc/hostname", wd / "link")
    elif name == "oversize":
        (wd / "big.txt").write_bytes(b"x" * (200 << 10))
    elif name == "malformed":
        (wd / "REQUIRED").unlink()
    elif name == "crash":
        print("boom", file=sys.stderr)
        sys.exit(3)
    elif name == "hang":
        time.sleep(3600)
    elif name == "cure":
        files = [p for p in wd.iterdir() if p.is_file()]
        flip(sorted(p.name for p in files if p.read_text().strip() == '"no"'))
    elif name == "peek":  # what the context folder shows of the failing cases
        seen = [
            json.loads(p.read_text())
            for p in pathlib.Path(os.environ["EVOLANE_CONTEXT_DIR"]).glob("cases/*/case.json")
        ]
        shown = "answers-shown" if any("expected_output" in c for c in seen) else "no-answers"
        print(f"{shown} in {len(seen)} cases")
    if plan.get("_record"):
        context = pathlib.Path(os.environ["EVOLANE_CONTEXT_DIR"])
        shown = {
            "key": key,
            "prompt": open(prompt_file).read(),
            "context": sorted(p.name for p in (context / "cases").glob("*")),
            "context_text": "".join(
                p.read_text(errors="replace") for p in sorted(context.rglob("*")) if p.is_file()
            ),
        }
        with open(plan["_record"], "a") as out:
            out.write(json.dumps(shown) + "\\n")
    print(action)
    """
)

REPLAY = 'sh -c \'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' replay {candidate} {output_dir}'


def usage_replay(root: Path, tokens: int = 100, cost: float = 0.01) -> str:
    """The toy replay command, also writing ``usage.json`` (``tokens``, ``cost``) per unit."""
    script = root / "replay.sh"
    script.write_text(
        'cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\n'
        f'echo \'{{"tokens": {tokens}, "cost_usd": {cost}}}\' > "$2/usage.json"\n'
    )
    return f"sh {script} {{candidate}} {{output_dir}}"


def write_toy(
    root: Path,
    plan: dict[str, str],
    *,
    val: int = 12,
    test: int = 6,
    passing: int = 4,
    test_passing: int = 1,
    train: int = 0,
) -> dict[str, Path]:
    """Write the target, dataset, optimizer script and plan under ``root``: the first
    ``passing`` val cases and the first ``test_passing`` test cases pass at the seed (``train``
    cases, ids ``train00``..., pass from the second on)."""
    target = root / "target"
    (target / "grader").mkdir(parents=True)
    (target / "grader" / "rubric.txt").write_text("exact match\n")
    (target / "REQUIRED").write_text("keep me\n")
    rows = []
    for split, count in (("train", train), ("val", val), ("test", test)):
        for index in range(count):
            case_id = f"{split}{index:02d}"
            rows.append(
                {"id": case_id, "input": {"n": case_id}, "expected_output": "yes", "split": split}
            )
            good = {"val": index < passing, "test": index < test_passing}.get(split, index > 0)
            (target / case_id).write_text('"yes"' if good else '"no"')
    dataset = root / "dataset.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    script = root / "optimizer.py"
    script.write_text(OPTIMIZER)
    plan_file = root / "plan.json"
    plan_file.write_text(json.dumps(plan))
    return {
        "target": target,
        "dataset": dataset,
        "script": script,
        "plan": plan_file,
        "store": root / "store",
    }


def toy_config(paths: dict[str, Path], **overrides: Any) -> CampaignConfig:
    """A campaign over the toy workload: small, fast, deterministic."""
    gate = overrides.pop("gate", GateConfig(gate="strict", min_cases=4))
    settings: dict[str, Any] = {
        "target": str(paths["target"]),
        "dataset": str(paths["dataset"]),
        "store": str(paths["store"]),
        "replay": REPLAY,
        "judge": None,
        "optimizer": (
            f"{sys.executable} -I {paths['script']} {{workdir}} {{prompt_file}} {paths['plan']}"
        ),
        "protected": ("grader/**",),
        "required_files": ("REQUIRED",),
        "max_growth_bytes": 64 << 10,
        "iterations": 3,
        "population": 2,
        "stall": 3,
        "replay_concurrency": 4,
        "judge_concurrency": 2,
        "kill_grace": 0.3,
        "replay_timeout": 20.0,
        "optimizer_timeout": 20.0,
        "optimizer_idle": 10.0,
        "gate": gate,
        "feedback_split": "val",  # the toy's plans are about val cases: see the module docstring
        **overrides,
    }
    return CampaignConfig(**settings)


PASSING_CHECK = "sh -c 'test -f {candidate}/REQUIRED'"
"""A post-publish check the toy's candidates pass (they keep REQUIRED)."""
FAILING_CHECK = "sh -c 'exit 4'"
"""A post-publish check that always fails (the publish is rolled back)."""


def publishing_config(
    paths: dict[str, Path], check: str = PASSING_CHECK, **overrides: Any
) -> CampaignConfig:
    """One iteration, one slot, ``auto_verified`` with ``check`` after the publish."""
    settings = {"iterations": 1, "population": 1, **overrides}
    return toy_config(paths, apply="auto_verified", check=check, **settings)


def with_flag(flags: list[str], name: str, value: str) -> list[str]:
    """A copy of ``flags`` with ``name`` set to ``value`` (replaced where it is, else added)."""
    flags = list(flags)
    if name in flags:
        flags[flags.index(name) + 1] = value
    else:
        flags += [name, value]
    return flags


def toy_flags(
    paths: dict[str, Path],
    store: Path,
    log: Path | None = None,
    lanes: int = 3,
    feedback: str = "val",
) -> list[str]:
    """``evolane optimize`` flags for the toy workload; ``log`` gets a line per replay launched;
    ``feedback`` is ``--feedback-split`` (val: see the module docstring)."""
    record = f'echo "$EVOLANE_UNIT" >> {log}; ' if log is not None else ""
    replay = (
        f'sh -c \'{record}cat "$1/$EVOLANE_CASE_ID" > "$2/output.json"\' '
        "replay {candidate} {output_dir}"
    )
    optimizer = f"{sys.executable} -I {paths['script']} {{workdir}} {{prompt_file}} {paths['plan']}"
    return [
        "--target", str(paths["target"]), "--dataset", str(paths["dataset"]),
        "--store", str(store), "--replay", replay, "--optimizer", optimizer,
        "--protected", "grader/**", "--required-file", "REQUIRED", "--gate", "strict",
        "--iterations", "3", "--population", "2", "--replay-concurrency", str(lanes),
        "--kill-grace", "0.3", "--progress", "none", *_exposed(paths, log),
        "--feedback-split", feedback,
    ]  # fmt: skip


def _exposed(paths: dict[str, Path], log: Path | None) -> list[str]:
    """``--expose-rw`` for the files the toy's commands record to (the replay ``log``, the
    plan's ``_record``): confined, they could write nowhere else."""
    record = json.loads(paths["plan"].read_text()).get("_record")
    folders = {str(Path(name).parent) for name in (log, record) if name}
    return [word for folder in sorted(folders) for word in ("--expose-rw", folder)]


def run_scripted(
    root: Path, paths: dict[str, Path], replay: str, optimizer: str, replay_args: str = ""
) -> subprocess.CompletedProcess[str]:
    """``evolane optimize`` over the toy, one iteration of one slot, whose replay is the
    Python script ``replay`` (run as ``replay.py {candidate} {output_dir} replay_args``) and
    whose optimizer is the script ``optimizer`` (``opt.py {workdir}``); both written to
    ``root``, which is the working folder."""
    (root / "replay.py").write_text(replay)
    (root / "opt.py").write_text(optimizer)
    flags = toy_flags(paths, paths["store"])
    flags = with_flag(
        flags,
        "--replay",
        f"{sys.executable} -I {root / 'replay.py'} {{candidate}} {{output_dir}} {replay_args}",
    )
    flags = with_flag(flags, "--optimizer", f"{sys.executable} -I {root / 'opt.py'} {{workdir}}")
    return run_optimize(with_flag(with_flag(flags, "--iterations", "1"), "--population", "1"), root)


def run_optimize(flags: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``evolane optimize`` with ``flags`` in a subprocess, run to its end (a 600 s guard
    against a hang, not a timing figure)."""
    return subprocess.run(
        [sys.executable, "-m", "evolane", "optimize", *flags],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=cwd,
        check=False,
    )


def start_optimize(flags: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    """``evolane optimize`` with ``flags`` started in a subprocess (its output dropped), for
    a test that stops or kills it midway."""
    return subprocess.Popen(
        [sys.executable, "-m", "evolane", "optimize", *flags],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        cwd=cwd,
    )


def shared_folder(path: Path) -> Path:
    """``path`` made a folder every uid may write: under ``--isolation process`` a root
    evolane runs each command as a uid of its own, which may write nowhere else."""
    path.mkdir()
    path.chmod(0o777)
    return path


def wait_for(path: Path, process: subprocess.Popen[Any], what: str, seconds: float = 120) -> None:
    """Poll until ``path`` exists; fail when ``process`` ends first or after ``seconds``
    (a guard against a hang, not a timing figure)."""
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert process.poll() is None, f"the run ended before {what}"
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.05)


async def apply_layout(layout: Any, host: Any, **arguments: Any) -> Any:
    """`apply_candidate` on a test layout's store, target, parent, candidate and run
    folder (attributes of ``layout``); ``arguments`` (the policy, a check...) win."""
    from evolane.campaign._apply import apply_candidate

    defaults = {
        "store": layout.store,
        "target": layout.target,
        "parent_ref": layout.parent,
        "candidate_ref": layout.candidate,
        "run_dir": layout.run_dir,
    }
    return await apply_candidate(host=host, **(defaults | arguments))


def read_terminal(master: int) -> bytes:
    """Everything written to the pseudo-terminal whose master end is ``master`` until every
    writer has closed it (then it is closed here too)."""
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # the other end closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    return b"".join(chunks)
