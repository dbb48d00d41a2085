"""``evolane doctor`` (the same flags as ``optimize``): can a campaign run here, as asked?

One line per check, ``ok|warn|FAIL  what  (why / how to fix)``: the host (isolation, kill and
limit mechanisms, free disk under the store), the inputs (dataset, splits, the smallest gain
the gate can accept), the commands (each template's program found and executable; a
relative script path), then the parent's replay and judge on ONE val case through the real
sandbox (`evolane.campaign.probe_run`), with the output, score and times. Exit 0 when a
campaign can run, 1 when a check failed, 2 for bad input. Also ``estimate --probe``.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from evolane.cli._estimates import estimate_lines
from evolane.cli._exits import EXIT_INTERNAL, EXIT_OK

Check = tuple[str, str, str]
"""(level ``ok``/``warn``/``FAIL``, what, why or how to fix)."""
LOW_DISK_BYTES = 1 << 30
"""Free space under the store below which a run may fill the disk (blobs, outputs)."""
UNCAPPED_COUNTS = (
    "not capped: one confined command may take all of this user's inotify instances and "
    "watches and fanotify groups (a kernel before 5.11 keeps none per user namespace, or "
    "this host forbids a nested one: see README, Security model)"
)
"""Doctor's warning where a confined command cannot get a user namespace of its own."""
MIN_RUN_BYTES = 64 << 20
"""Free space under the store below which no run can work (doctor FAILs)."""


def _host_checks(probe: Any, store: str) -> list[Check]:
    from evolane.campaign import host_warnings, network_warning
    from evolane.sandbox import confinement_fix, trees_own_process_limit, user_counts_step

    host = probe.host
    checks: list[Check] = []
    asked = probe.prepared.config.commands.isolation
    if host.problem is not None:  # auto fell back (confined refused: `_confinement_refused`)
        how = f"{confinement_fix()}, or pass --isolation process to accept it"
        checks.append(("warn", f"isolation {host.isolation}", f"{host.problem}; {how}"))
    elif host.isolation == "confined":
        why = "bubblewrap: the system read-only, nothing of the store, target or dataset"
        checks.append(("ok", "isolation confined", why))
        if user_counts_step() is None:
            checks.append(("warn", "per-user counts", UNCAPPED_COUNTS))
        commands = probe.prepared.config.commands
        if (commands.network or commands.network_for) and (said := network_warning()):
            checks.append(("warn", "network", said))
    else:
        can = host.confinable is None
        why = f"as asked (--isolation {asked}); confined is " + (
            "available" if can else f"not: {host.confinable}"
        )
        checks.append(("ok", f"isolation {host.isolation}", why))
    unit_uids = trees_own_process_limit(host.isolation)
    checks.append(cgroup_check(host.cgroups, probe.prepared.config.commands, unit_uids))
    checks += [
        ("warn", "processes", said)
        for said in host_warnings(probe.prepared.config, probe.prepared.dataset)
    ]
    where = Path(store)
    while not where.exists():
        where = where.parent
    checks.append(disk_check(store, shutil.disk_usage(where).free))
    return checks


def disk_check(store: str, free: int) -> Check:
    """The free space under the store: FAIL below `MIN_RUN_BYTES` (a run fails at its first
    writes; doctor said "0.0 GiB" and passed, found by review), warn below `LOW_DISK_BYTES`."""
    shown = f"{free / (1 << 30):.1f} GiB" if free >= 1 << 30 else f"{free >> 20} MiB"
    what = f"disk: {shown} free under {store}"
    if free < MIN_RUN_BYTES:
        return ("FAIL", what, "a run cannot store its snapshot, journal and outputs; free some")
    return ("ok" if free >= LOW_DISK_BYTES else "warn", what, "blobs, outputs")


def cgroup_check(cgroups: tuple[str, ...], limits: Any, unit_uids: bool) -> Check:
    """The cgroups this host gives (``cgroups``: its mechanisms) and which of the commands'
    ``limits`` they enforce: a warning names each limit in force nowhere (a host without a
    writable pids or memory cgroup bounds no command tree's processes or memory; found by
    review: doctor said "memory and process limits" on such hosts, where the report then
    said NOT ENFORCED)."""
    from evolane.measure import describe_limits

    enforced = describe_limits(limits, cgroups, unit_uids)
    kill = "cgroup.kill" if "cgroup_v2" in cgroups else "process group and lease scan"
    what = f"cgroups: {', '.join(cgroups) or 'none writable'}"
    why = f"limits: {enforced}; tree kill by {kill}"
    if "NOT ENFORCED" not in enforced:
        return ("ok", what, why)
    how = "a runaway command's processes or memory are not stopped: run evolane where it can "
    how += "create pids and memory cgroups, or lift the limit (--max-procs 0, --max-memory 0)"
    return ("warn", what, f"{why}; {how}")


def _confinement_refused(asked: str) -> Check | None:
    """The FAIL of ``--isolation confined`` on a host where bubblewrap cannot confine (which
    ``optimize`` refuses, exit 2), or None. Found by review: doctor ended on that one error
    line, exit 2 as for bad input, with none of its checks; its FAIL line was never shown."""
    from evolane.sandbox import confinement_fix, resolve_isolation

    problem = resolve_isolation(asked)[1] if asked == "confined" else None  # type: ignore[arg-type]
    if problem is None:
        return None
    weaker = resolve_isolation("auto")[0]
    how = f"{confinement_fix()}, or pass --isolation auto ({weaker} here) or process to accept it"
    return ("FAIL", "isolation confined: not on this host", f"{problem}; {how}")


def _input_checks(probe: Any) -> list[Check]:
    estimate, prepared = probe.estimate, probe.prepared
    plan = prepared.splits
    splits = f"train {plan.train_cases}, val {plan.val_cases}, test {prepared.test_cases}"
    checks: list[Check] = [
        ("ok", f"dataset {prepared.config.dataset}", f"{len(prepared.dataset)} cases read"),
        ("warn" if plan.optimistic else "ok", f"splits: {splits}", estimate.splits or "as given"),
    ]
    gain = "n/a" if estimate.min_gain is None else f"{estimate.min_gain:.4f}"
    reason = estimate.preflight[0] if estimate.preflight else ""
    checks.append(("ok", f"smallest acceptable mean gain {gain}", reason))
    return checks


def _program_check(flag: str, template: str) -> list[Check]:
    """The program of ``template`` found and executable; its relative script paths."""
    try:
        words = shlex.split(template)
    except ValueError as error:
        return [("FAIL", f"{flag}: cannot split", str(error))]
    if not words or "{" in words[0]:
        return []
    program, checks = words[0], []
    found = program if os.sep in program else shutil.which(program)
    if found is None or not os.path.isfile(found):
        how = "give its absolute path" if os.sep not in program else "no such file"
        return [("FAIL", f"{flag}: program {program} not found", how)]
    if not os.access(found, os.X_OK):
        return [("FAIL", f"{flag}: program {found} is not executable", f"chmod +x {found}")]
    if not os.path.isabs(program) and os.sep in program:
        checks.append(_relative(flag, program))
    elif f"{os.sep}shims{os.sep}" in found:
        why = "a version manager's shim (pyenv, asdf...): a confined command does not see the "
        why += "manager; give the interpreter's absolute path (python3 -c 'import sys; "
        why += "print(sys.executable)')"
        checks.append(("warn", f"{flag}: program {found}", why))
    else:
        checks.append(("ok", f"{flag}: program {found}", "found"))
    for word in words[1:]:
        relative = "{" not in word and not os.path.isabs(word) and os.sep in word
        if relative and os.path.exists(word):
            checks.append(_relative(flag, word))
    return checks


def _relative(flag: str, path: str) -> Check:
    return (
        "warn",
        f"{flag}: relative path {path}",
        f"commands run in a fresh folder of their own: write {os.path.abspath(path)}",
    )


def _command_checks(config: Any) -> list[Check]:
    templates = {
        "--replay": config.measure.replay,
        "--judge": config.measure.judge,
        "--optimizer": config.propose.optimizer,
        "--validator": config.validator,
        "--check": config.check,
    }
    checks: list[Check] = []
    for flag, text in templates.items():
        if text and not _is_spec(text):
            checks += _program_check(flag, text)
    return checks


MAX_VERIFICATION_CHECKS = 8
"""The distinct programs of the cases' verification commands doctor looks up, at most."""


def _verification_checks(dataset: Any) -> list[Check]:
    """The program of each case's ``verification_command`` (each program once): one the host
    lacks stops the run's measurement as a ``--judge`` program missing does (found by
    review: the one-case probe scored a case without one, and doctor said a campaign can
    run); one the replay writes (``{output_dir}/check.sh``) is not looked up."""
    import orjson

    checks: list[Check] = []
    seen: set[str] = set()
    for case_id, row in dataset.rows():
        if b'"verification_command"' not in row:
            continue
        template = orjson.loads(row).get("verification_command") or ""
        program = (template.split() or [""])[0]
        if program in seen or len(seen) >= MAX_VERIFICATION_CHECKS:
            continue
        seen.add(program)
        found = _program_check(f"verification_command (case {case_id})", template)
        checks += [check for check in found if check[0] != "ok"]  # a row of each: too many
    return checks


def _is_spec(text: str) -> bool:
    """``llm:MODEL``, ``agent:NAME`` or a plugin's ``NAME:ARGS``: no program to look up."""
    head = text.split()[0] if text.split() else ""
    return ":" in head and os.sep not in head.split(":", 1)[0]


def _case_checks(case: Any) -> list[Check]:
    replay, judge = case.replay, case.judge
    where = f"one val case ({case.case_id})"
    if replay.status != "succeeded" or judge is None:
        failure = replay.failure
        why = f"{failure.code}: {failure.message}" if failure is not None else replay.status
        if case.stderr and case.stderr not in why:
            why += f"; stderr: {case.stderr}"
        return [("FAIL", f"{where}: the replay {replay.status}", _one_line(why))]
    checks: list[Check] = [
        ("ok", f"{where}: replay {replay.wall_seconds:.2f} s", f"output: {case.output}"[:300])
    ]
    if judge.score is None:
        failure = judge.failure
        why = f"{failure.code}: {failure.message}" if failure is not None else judge.status
        checks.append(("FAIL", f"{where}: the judge {judge.status}", _one_line(why)))
    else:
        checks.append(
            (
                "ok",
                f"{where}: judge {judge.wall_seconds:.2f} s, score {judge.score:.3f} "
                f"({judge.source})",
                f"verdict: {case.verdict}"[:300] if case.verdict else "scored",
            )
        )
    return checks


def _one_line(text: str, limit: int = 400) -> str:
    return " ".join(text.split())[:limit]


def _print(checks: list[Check]) -> None:
    """One line per check, as text: a check quotes the replay's output, its stderr and the
    judge's verdict (found by review: an output ``ESC ]0;...BEL`` set the terminal's title,
    and one with line breaks printed ``ok`` lines of its own)."""
    from evolane.inputs import one_line
    from evolane.messages import printable

    for level, what, why in checks:
        what, why = printable(one_line(what)), printable(one_line(why))
        print(f"{level:<4}  {what}  ({why})" if why else f"{level:<4}  {what}")


def run_probe(config: Any, flags: dict[str, Any]) -> Any:
    """The probe of ``config`` (`evolane.campaign.probe_run`): one real replay and judge call,
    timed; bad input is a `UsageError` or an `InputError`."""
    from evolane.campaign import probe_run

    return trio.run(probe_run, config, flags.get("resume_campaign"))


def _failed(error: BaseException, flags: dict[str, Any]) -> int:
    """One line and the exit code for an error (bad input: 2), as ``optimize`` gives them."""
    from evolane.cli._session import _exit_for, _leaf

    return _exit_for(_leaf(error), bool(flags.get("debug")), flags.get("store"))


def run_doctor(flags: dict[str, Any]) -> int:
    """``evolane doctor``: print the checks; the exit code (0 when a campaign can run)."""
    from evolane.cli._session import build_config

    try:
        config = build_config(flags)
    except BaseException as error:  # every error: one line and an exit code
        return _failed(error, flags)
    commands = _command_checks(config)
    if any(level == "FAIL" for level, _, _ in commands):
        _print(commands)
        print("doctor: a command cannot run; fix it before a campaign")
        return EXIT_INTERNAL
    refused = _confinement_refused(config.run_commands.isolation)
    if refused is not None:  # the host's failing, not the input's: a check that failed
        _print([refused, *commands])
        print("doctor: 1 check(s) failed: a campaign cannot run yet")
        return EXIT_INTERNAL
    try:
        probe = run_probe(config, flags)
    except BaseException as error:  # every error: one line and an exit code
        _print(commands)
        return _failed(error, flags)
    checks = _host_checks(probe, config.store) + _input_checks(probe) + commands
    if not config.measure.judge:  # a --judge scores every case: no verification runs
        checks += _verification_checks(probe.prepared.dataset)
    checks += _case_checks(probe.case)
    _print(checks)
    if probe.case.ok:  # a failed probe times nothing worth drawing a range from
        for line in estimate_lines(probe.estimate):
            print(line)
    failed = [what for level, what, _ in checks if level == "FAIL"]
    if failed:
        print(f"doctor: {len(failed)} check(s) failed: a campaign cannot run yet")
        return EXIT_INTERNAL
    print("doctor: a campaign can run")
    return EXIT_OK


def estimate_probe(flags: dict[str, Any]) -> int:
    """``estimate --probe`` and ``optimize --dry-run --probe``: the estimate with its wall
    range from one timed replay and judge call; exit 1 when the probe could not score its
    case."""
    from evolane.campaign import store_root
    from evolane.cli._session import build_config, print_estimate, refuse_continued

    try:
        refuse_continued(flags, estimate_only=True)
        config = build_config(flags)
        store_root(Path(config.store))  # a store that cannot be is refused first
        with contextlib.ExitStack() as scratch:
            if not Path(config.store).exists():  # an estimate creates no store, as --dry-run
                folder = scratch.enter_context(tempfile.TemporaryDirectory(prefix="evolane-"))
                config = config.model_copy(update={"store": str(Path(folder, "store"))})
            probe = run_probe(config, flags)
    except BaseException as error:  # every error: one line and an exit code
        return _failed(error, flags)
    if probe.case.ok:
        print_estimate(probe.estimate, flags)
        return EXIT_OK
    # A failed probe times nothing worth drawing a range from (as doctor says): the estimate
    # without it; with --json the failure goes to stderr, so stdout stays one JSON document.
    print_estimate(probe.prepared.estimate, flags)
    stream = sys.stderr if flags.get("as_json") or flags.get("progress") == "jsonl" else sys.stdout
    with contextlib.redirect_stdout(stream):
        _print(_case_checks(probe.case))
    return EXIT_INTERNAL
