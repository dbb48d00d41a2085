"""The sleeper's command line: ``init``, ``replay``, ``judge`` and ``optimize``.

Run as ``python -m evolane.examples.sleeper SUBCOMMAND ...``. Exit codes: 0 done, 1 a planned
``fail`` fault, 2 bad usage or unreadable input (an infrastructure failure, never a score).
Standard library only (orjson alone would cost a call ~15 ms of start-up); a call starts
in about 20 ms of CPU.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from types import SimpleNamespace

from evolane.examples.sleeper.workload import (
    FAULT_MODES,
    SleeperConfig,
    choose_effect,
    dataset_rows,
    plan,
    score,
    variant_of,
)

TYPE_CHECKING = False  # not from typing: importing it costs a replay ~2 ms of start-up
if TYPE_CHECKING:
    import argparse

PROG = "python -m evolane.examples.sleeper"
"""How the commands are invoked."""
IGNORE_TERM_SECONDS = 3600.0
"""How long an ``ignore_term`` replay sleeps before it carries on as normal."""
ESCAPE_SECONDS = 1000.0
"""How long the escaped grandchild of an ``escape`` replay sleeps."""
DEFAULT_EFFECTS = "0.15,0.0,-0.1"
"""The optimizer's default effect list."""


class InputError(Exception):
    """An unreadable or invalid input file; the command exits 2 with this message."""


# ----- small I/O helpers ----------------------------------------------------------------


def _read_json(path: str, what: str) -> object:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        raise InputError(f"{what} not found: {path}") from None
    except (OSError, UnicodeDecodeError, ValueError) as error:
        raise InputError(f"{what} is not valid JSON: {path}: {error}") from None


def _write_text(path: str, text: str) -> None:
    """Write ``text`` atomically (temporary file, then rename), so readers never see half."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8", newline="\n") as handle:
        handle.write(text)
    os.replace(temporary, path)


def _line(document: object) -> str:
    return json.dumps(document, sort_keys=True)


def _dump(document: object) -> str:
    return json.dumps(document, sort_keys=True, indent=2) + "\n"


def _read_case_id(path: str) -> str:
    row = _read_json(path, "case file")
    if not isinstance(row, dict) or not isinstance(row.get("id"), str) or not row["id"]:
        raise InputError(f"case file has no string 'id': {path}")
    return row["id"]


def _read_effect(candidate: str) -> tuple[float, str]:
    """The candidate's effect and noise variant from ``effect.json``."""
    path = os.path.join(candidate, "effect.json")
    document = _read_json(path, "effect file")
    effect = document.get("effect") if isinstance(document, dict) else None
    if isinstance(effect, bool) or not isinstance(effect, int | float) or not math.isfinite(effect):
        raise InputError(f"effect file has no finite number 'effect': {path}")
    return float(effect), variant_of(effect, document.get("variant"))


# ----- init -------------------------------------------------------------------------------


def run_init(args: argparse.Namespace) -> int:
    """Write ``DIR/dataset.jsonl`` and the target folder ``DIR/target`` (byte-deterministic)."""
    settings = {
        "median_seconds": args.median_seconds,
        "spread": args.spread,
        "flood_bytes": args.flood_bytes,
        "tokens_rate": args.tokens_rate,
        **{f"{mode}_rate": getattr(args, f"{mode}_rate") for mode in FAULT_MODES},
    }
    try:
        config = SleeperConfig(**settings)
        rows = dataset_rows(args.cases, args.seed)
        baseline = float(args.baseline_effect)
        if not math.isfinite(baseline):
            raise ValueError("--baseline-effect must be finite")
    except ValueError as error:
        raise InputError(str(error)) from None
    target = os.path.join(args.dir, "target")
    os.makedirs(target, exist_ok=True)
    lines = "".join(_line(row) + "\n" for row in rows)
    _write_text(os.path.join(args.dir, "dataset.jsonl"), lines)
    _write_text(os.path.join(target, "sleeper.json"), _dump(config.to_dict()))
    _write_text(os.path.join(target, "effect.json"), _dump({"effect": baseline}))
    return 0


# ----- replay -----------------------------------------------------------------------------


def _sleep(seconds: float) -> None:
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(left)


def _hang() -> None:
    while True:
        time.sleep(3600)


def _spawn_escaper() -> None:
    """Double-fork a grandchild in its own session (out of our process group) that sleeps."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if os.fork() == 0:
                time.sleep(ESCAPE_SECONDS)
        finally:
            os._exit(0)
    os.waitpid(child, 0)


def _flood(size: int) -> None:
    chunk = b"sleeper flood " * 4681 + b"\n"  # 65,535 bytes
    out = sys.stdout.buffer
    while size > 0:
        piece = chunk[:size]
        out.write(piece)
        size -= len(piece)
    out.flush()


def run_replay(args: argparse.Namespace) -> int:
    """Replay one case: sleep its planned duration, act out its fault mode, write output.json."""
    case_id = _read_case_id(args.case_file)
    try:
        config = SleeperConfig.from_dict(
            _read_json(os.path.join(args.candidate, "sleeper.json"), "sleeper config")
        )
    except ValueError as error:
        raise InputError(f"bad sleeper config in {args.candidate}: {error}") from None
    effect, variant = _read_effect(args.candidate)
    step = plan(case_id, args.seed, config)
    if step.mode == "hang":
        _hang()
    if step.mode == "ignore_term":
        import signal

        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        _sleep(IGNORE_TERM_SECONDS)
    elif step.mode == "escape":
        _spawn_escaper()
    elif step.mode == "flood":
        _flood(config.flood_bytes)
    _sleep(step.duration)
    if step.mode == "fail":
        print(f"sleeper replay: planned failure of {case_id} (seed {args.seed})", file=sys.stderr)
        return 1
    os.makedirs(args.output_dir, exist_ok=True)
    output = {
        "case_id": case_id,
        "seed": args.seed,
        "effect": effect,
        "variant": variant,
        "duration": step.duration,
        "mode": step.mode,
    }
    _write_text(os.path.join(args.output_dir, "output.json"), _dump(output))
    if step.report_usage:
        usage = {"tokens": step.tokens, "cost_usd": step.cost_usd}
        _write_text(os.path.join(args.output_dir, "usage.json"), _dump(usage))
    return 0


# ----- judge ------------------------------------------------------------------------------


def run_judge(args: argparse.Namespace) -> int:
    """Score a replay's output.json: print ``{"score", "base", "effect", "noise"}`` as one line."""
    case_id = _read_case_id(args.case_file)
    path = os.path.join(args.output_dir, "output.json")
    output = _read_json(path, "replay output")
    if not isinstance(output, dict):
        raise InputError(f"replay output is not a JSON object: {path}")
    effect = output.get("effect")
    if isinstance(effect, bool) or not isinstance(effect, int | float) or not math.isfinite(effect):
        raise InputError(f"replay output has no finite number 'effect': {path}")
    if output.get("case_id", case_id) != case_id:
        raise InputError(f"replay output belongs to case {output['case_id']!r}, not {case_id!r}")
    verdict = score(case_id, args.seed, float(effect), variant_of(effect, output.get("variant")))
    print(_line(verdict))
    return 0


# ----- optimize ---------------------------------------------------------------------------


def _parse_effects(text: str) -> list[float]:
    try:
        effects = [float(item) for item in text.split(",") if item.strip()]
    except ValueError:
        raise InputError(f"--effects must be comma-separated numbers, got {text!r}") from None
    if not effects or not all(math.isfinite(value) for value in effects):
        raise InputError(f"--effects must list at least one finite number, got {text!r}")
    return effects


def _iteration_of(prompt_file: str) -> int:
    """The ``iteration`` of a JSON prompt file; 0 when the file is missing, empty or not JSON."""
    try:
        with open(prompt_file, encoding="utf-8") as handle:
            prompt = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError):
        return 0
    iteration = prompt.get("iteration") if isinstance(prompt, dict) else None
    return iteration if isinstance(iteration, int) and not isinstance(iteration, bool) else 0


def run_optimize(args: argparse.Namespace) -> int:
    """Write the candidate's ``effect.json``: an effect picked from the list by seed and iteration.

    With ``--relative`` the pick is added to the parent's effect (an edit that helps, hurts or
    does nothing); otherwise it replaces it.
    """
    effects = _parse_effects(args.effects)
    iteration = _iteration_of(args.prompt_file)
    index, delta = choose_effect(effects, args.seed, iteration)
    parent = 0.0
    if args.relative and os.path.exists(os.path.join(args.workdir, "effect.json")):
        parent = _read_effect(args.workdir)[0]
    effect = round(parent + delta, 12) if args.relative else delta
    os.makedirs(args.workdir, exist_ok=True)
    document = {"effect": effect, "variant": f"opt-seed{args.seed}-iter{iteration}"}
    _write_text(os.path.join(args.workdir, "effect.json"), _dump(document))
    print(_line({"index": index, "delta": delta, "effect": effect}))
    return 0


# ----- argument parsing -------------------------------------------------------------------


def _add_init(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    init = commands.add_parser("init", help="write a dataset and a target folder")
    init.add_argument("dir", help="output directory")
    init.add_argument("--cases", type=int, default=64)
    init.add_argument("--seed", type=int, default=0)
    init.add_argument("--median-seconds", type=float, default=0.2)
    init.add_argument("--spread", type=float, default=0.25, help="log-normal sigma")
    for mode in FAULT_MODES:
        init.add_argument(f"--{mode.replace('_', '-')}-rate", type=float, default=0.0)
    init.add_argument("--flood-bytes", type=int, default=1 << 20)
    init.add_argument("--tokens-rate", type=float, default=1.0)
    init.add_argument("--baseline-effect", type=float, default=0.0)
    init.set_defaults(handler=run_init)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser for all four subcommands."""
    import argparse

    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    _add_init(commands)
    replay = commands.add_parser("replay", help="replay one case against a candidate")
    replay.add_argument("--case-file", required=True)
    replay.add_argument("--candidate", required=True, help="folder with sleeper.json, effect.json")
    replay.add_argument("--output-dir", required=True)
    replay.add_argument("--seed", type=int, required=True)
    replay.set_defaults(handler=run_replay)
    judge = commands.add_parser("judge", help="score one replay's output.json")
    judge.add_argument("--case-file", required=True)
    judge.add_argument("--output-dir", required=True)
    judge.add_argument("--seed", type=int, required=True)
    judge.set_defaults(handler=run_judge)
    optimize = commands.add_parser("optimize", help="write a candidate's effect.json")
    optimize.add_argument("--workdir", required=True)
    optimize.add_argument("--prompt-file", required=True)
    optimize.add_argument("--seed", type=int, required=True)
    optimize.add_argument("--effects", default=DEFAULT_EFFECTS, help="comma-separated effects")
    optimize.add_argument(
        "--relative", action="store_true", help="add the pick to the parent's effect"
    )
    optimize.set_defaults(handler=run_optimize)
    return parser


_HOT_FLAGS = {
    "replay": ("--case-file", "--candidate", "--output-dir", "--seed"),
    "judge": ("--case-file", "--output-dir", "--seed"),
}
_HANDLERS = {"replay": run_replay, "judge": run_judge}


def _hot_call(argv: list[str]) -> SimpleNamespace | None:
    """A well-formed replay or judge call (``--flag value`` pairs, each flag once), parsed
    without importing argparse (~4 ms of such a call's ~20 ms of CPU); None otherwise."""
    if not argv or argv[0] not in _HOT_FLAGS or len(argv) % 2 == 0:
        return None
    flags = dict(zip(argv[1::2], argv[2::2], strict=True))
    if sorted(flags) != sorted(_HOT_FLAGS[argv[0]]) or len(flags) * 2 != len(argv) - 1:
        return None
    seed = flags["--seed"]
    if not (seed.isascii() and seed.isdigit()) or any(v.startswith("-") for v in flags.values()):
        return None  # argparse reports bad values (and takes "-1" as a seed)
    values = {flag[2:].replace("-", "_"): value for flag, value in flags.items()}
    values["seed"] = int(values["seed"])
    return SimpleNamespace(command=argv[0], handler=_HANDLERS[argv[0]], **values)


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the subcommand; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    args = _hot_call(argv) or build_parser().parse_args(argv)
    try:
        return int(args.handler(args))
    except InputError as error:
        print(f"sleeper {args.command}: {error}", file=sys.stderr)
        return 2
