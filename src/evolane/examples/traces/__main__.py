"""``python -m evolane.examples.traces``: init, agent, replay, judge.

init DIR                      the workspace: target/ (the seed skill) and evolane.toml
agent DIR --tasks N --out F   run N live tasks, append their trajectory records to F
agent DIR --tasks N --evolve shadow|online [--every K]
                              the same agent with an EvolveService: each task is recorded,
                              every K records become a background job; waits for the jobs
replay / judge                the command templates a campaign from the records runs
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path


def _init(args: argparse.Namespace) -> int:
    from evolane.examples.traces._workspace import write_traces_workspace

    print(write_traces_workspace(Path(args.directory)))
    return 0


def _agent(args: argparse.Namespace) -> int:
    from evolane.examples.traces._agent import run_tasks

    target = Path(args.directory) / "target"
    if args.evolve is not None:
        import trio

        from evolane.examples.traces._service import run_with_service

        return trio.run(run_with_service, Path(args.directory), args)
    failures = 0
    (target / "skill" / "SKILL.md").stat()  # no workspace: said before --out is made
    with open(args.out, "a") as out:
        for record in run_tasks(target, args.first, args.tasks):
            failures += record["outcome"]["status"] == "failure"
            out.write(json.dumps(record, sort_keys=True) + "\n")
    print(f"{args.tasks} tasks, {failures} failures: records appended to {args.out}")
    return 0


def _replay(args: argparse.Namespace) -> int:
    from evolane.examples.selfevolve._agent import decide
    from evolane.examples.selfevolve._skill import SkillError, parse_skill

    case = json.loads(Path(args.case_file).read_text())
    try:
        skill = parse_skill((Path(args.candidate) / "skill" / "SKILL.md").read_text())
    except (OSError, SkillError) as error:
        print(f"traces: {error}", file=sys.stderr)
        return 2
    answer = decide(skill, case["input"]["input"]["trace"])
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "output.json").write_text(json.dumps(answer, sort_keys=True) + "\n")
    return 0


def _judge(args: argparse.Namespace) -> int:
    from evolane.examples.selfevolve._reward import score
    from evolane.examples.traces._agent import expected_for

    case = json.loads(Path(args.case_file).read_text())
    answer = json.loads((Path(args.output_dir) / "output.json").read_text())
    verdict = score(answer, expected_for(case), case["input"]["input"]["trace"])
    print(json.dumps(verdict, sort_keys=True))
    return 0


def _count(least: int) -> Callable[[str], int]:
    """An argparse type: a whole number of at least ``least`` (found by review: ``--tasks
    -5`` ran no task and said "-5 tasks")."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < least:
            raise argparse.ArgumentTypeError(f"{value} is below {least}")
        return value

    return parse


def main(argv: list[str] | None = None) -> int:
    """Parse the subcommand and run it; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m evolane.examples.traces")
    commands = parser.add_subparsers(dest="command", required=True)
    init = commands.add_parser("init", help="write the example workspace")
    init.add_argument("directory")
    init.set_defaults(run=_init)
    agent = commands.add_parser("agent", help="run live tasks, recording each")
    agent.add_argument("directory")
    agent.add_argument("--tasks", type=_count(1), default=40)
    agent.add_argument("--first", type=_count(0), default=0, help="index of the first task")
    agent.add_argument("--out", default="traces.jsonl", help="the trajectory JSONL file")
    agent.add_argument("--evolve", choices=("shadow", "online"), default=None)
    agent.add_argument("--every", type=_count(1), default=20, help="records per background job")
    agent.add_argument("--iterations", type=_count(1), default=None, help="of each background job")
    agent.set_defaults(run=_agent)
    for name, run in (("replay", _replay), ("judge", _judge)):
        sub = commands.add_parser(name, help=f"the {name} command of a campaign from traces")
        sub.add_argument("--case-file", required=True)
        sub.add_argument("--output-dir", required=True)
        sub.add_argument("--seed", type=int, default=0, help="accepted; deterministic")
        if name == "replay":
            sub.add_argument("--candidate", required=True)
        sub.set_defaults(run=run)
    args = parser.parse_args(argv)
    try:
        return int(args.run(args))
    except OSError as error:  # a workspace or --out that cannot be used: one line, not a trace
        where = f": {error.filename}" if error.filename else ""
        print(f"{parser.prog}: error: {error.strerror or error}{where}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
