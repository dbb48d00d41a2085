"""``python -m evolane.examples.selfevolve``: init, replay, judge, optimize, validate.

Command templates for a campaign (DESIGN §8):
  replay    python -m evolane.examples.selfevolve replay --case-file {case_file}
            --candidate {candidate} --output-dir {output_dir}
  judge     python -m evolane.examples.selfevolve judge --case-file {case_file}
            --output-dir {output_dir}
  optimizer python -m evolane.examples.selfevolve optimize --workdir {workdir}
            --prompt-file {prompt_file} --seed {seed}
Each subcommand imports only what it needs, so a call starts in a few tens of milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path


def _read_json(path: Path, what: str) -> object:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SystemExit(f"selfevolve: cannot read {what} {path}: {error}") from None


def _replay(args: argparse.Namespace) -> int:
    from evolane.examples.selfevolve._agent import decide
    from evolane.examples.selfevolve._skill import SkillError, parse_skill

    case = _read_json(Path(args.case_file), "case")
    skill_file = Path(args.candidate) / "skill" / "SKILL.md"
    try:
        skill = parse_skill(skill_file.read_text())
    except (OSError, SkillError) as error:
        print(f"selfevolve: {error}", file=sys.stderr)
        return 2
    answer = decide(skill, case["input"]["trace"])  # type: ignore[index]
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "output.json").write_text(json.dumps(answer, sort_keys=True) + "\n")
    return 0


def _judge(args: argparse.Namespace) -> int:
    from evolane.examples.selfevolve._reward import score

    case = _read_json(Path(args.case_file), "case")
    answer = _read_json(Path(args.output_dir) / "output.json", "replay output")
    verdict = score(answer, case["expected_output"], case["input"]["trace"])  # type: ignore[index]
    usage_file = os.environ.get("EVOLANE_USAGE_FILE")
    if usage_file:  # a rule, not a model: it costs nothing, and says so
        Path(usage_file).write_text('{"tokens": 0, "cost_usd": 0}\n')
    print(json.dumps(verdict, sort_keys=True))
    return 0


def _optimize(args: argparse.Namespace) -> int:
    from evolane.examples.selfevolve._defaults import FAULT_RATES
    from evolane.examples.selfevolve._optimizer import optimize

    rates = {kind: getattr(args, f"{kind}_rate") for kind in FAULT_RATES}
    print(optimize(Path(args.workdir), Path(args.prompt_file), args.seed, rates))
    return 0


def _validate(args: argparse.Namespace) -> int:
    from evolane.examples.selfevolve._skill import SkillError, parse_skill

    path = Path(args.directory) / "skill" / "SKILL.md"
    try:
        parse_skill(path.read_text())
    except SkillError as error:
        print(error, file=sys.stderr)  # "SKILL.md:<line>: why"
        return 1
    except OSError as error:
        print(f"skill/SKILL.md: {error.strerror}", file=sys.stderr)
        return 1
    return 0


def _init(args: argparse.Namespace) -> int:
    from evolane.examples.selfevolve._workspace import write_workspace

    print(write_workspace(Path(args.directory)))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse the subcommand and run it; returns the exit code."""
    from evolane.examples.selfevolve._defaults import FAULT_RATES

    parser = argparse.ArgumentParser(prog="python -m evolane.examples.selfevolve")
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser("init", help="write the example workspace and dataset")
    init.add_argument("directory")
    init.set_defaults(run=_init)
    replay = commands.add_parser("replay", help="the decision agent: answer one case")
    replay.add_argument("--case-file", required=True)
    replay.add_argument("--candidate", required=True)
    replay.add_argument("--output-dir", required=True)
    replay.add_argument("--seed", type=int, default=0, help="accepted; the agent is deterministic")
    replay.set_defaults(run=_replay)
    judge = commands.add_parser("judge", help="score one replay output")
    judge.add_argument("--case-file", required=True)
    judge.add_argument("--output-dir", required=True)
    judge.add_argument("--seed", type=int, default=0, help="accepted; the reward is exact")
    judge.set_defaults(run=_judge)
    opt = commands.add_parser("optimize", help="propose one edit of the skill in place")
    opt.add_argument("--workdir", required=True)
    opt.add_argument("--prompt-file", required=True)
    opt.add_argument("--seed", type=int, default=0)
    for kind, rate in FAULT_RATES.items():
        opt.add_argument(f"--{kind}-rate", type=float, default=rate, dest=f"{kind}_rate")
    opt.set_defaults(run=_optimize)
    validate = commands.add_parser("validate", help="check a candidate's SKILL.md")
    validate.add_argument("directory")
    validate.set_defaults(run=_validate)
    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
