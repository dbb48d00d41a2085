"""One ``optimize``/``estimate`` invocation: flags to config, the run under trio with the
progress view, Ctrl-C handling (first: stop now, kill the units in flight, write the report;
second: cancel at once, no report), the summary."""

from __future__ import annotations

import signal
import sys
import time
import traceback
from functools import partial
from pathlib import Path
from typing import Any

import trio
from pydantic import ValidationError

from evolane.cli._amounts import count, role_spend
from evolane.cli._examples import EXAMPLE_DEFAULTS, EXAMPLES, example_settings
from evolane.cli._exits import (
    EXIT_INTERNAL,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_USAGE,
    error_line,
    flag_problem,
    internal_error,
)
from evolane.cli._grants import grant_values
from evolane.cli._models import model_flags, rejudge_models
from evolane.cli._output import json_stdout_only, own_stdout
from evolane.cli._resumable import ended_outcome, recorded_run
from evolane.cli._signals import SignalWatch, watching_signals

_CHOICES = {
    "apply": ("proposal", "verified_only", "auto_verified"),
    "error_control": ("auto", "confirm", "online", "none"),
    "confirm_split": ("test",),
    "test_budget": ("campaign", "store"),
    "gate": ("paired", "bootstrap", "strict", "threshold"),
    "focus": ("all", "cyclic", "hardest-first"),
    "feedback_split": ("train", "val"),
    "isolation": ("auto", "confined", "process", "namespace"),
    "progress": ("auto", "rich", "plain", "jsonl", "none"),
    "unknown_price": ("refuse", "reserve"),
}
_GATE_FLAGS = (
    "gate", "k_se", "min_effect", "threshold", "confidence", "bootstrap_samples", "sequential",
)  # fmt: skip
_CONFIG_FLAGS = (
    "target", "dataset", "group", "replay", "judge", "optimizer", "validator", "check", "apply",
    "iterations", "population", "max_improvement_cycles", "stall", "replay_concurrency",
    "judge_concurrency", "optimizer_concurrency", "replay_timeout", "judge_timeout",
    "optimizer_timeout", "optimizer_idle", "kill_grace", "wall_clock_budget", "max_tokens",
    "max_cost_usd", "baseline_replay_repetitions", "candidate_replay_repetitions",
    "judge_failure_retries", "focus", "feedback_split", "isolation", "seed", "cluster",
    "error_control", "network", "max_procs", "max_memory", "max_file_size",
    "max_open_files", "judge_samples", "unknown_price", "test_budget",
)  # fmt: skip


class UsageError(ValueError):
    """A bad flag or input: one line, exit code 2."""


def _check_choices(flags: dict[str, Any]) -> None:
    for name, allowed in _CHOICES.items():
        value = flags.get(name)
        if value is not None and value not in allowed:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {value}: choose from {', '.join(allowed)}")


def build_config(flags: dict[str, Any]) -> Any:
    """Merge explicit flags, the config file (`evolane.cli._config`), example presets and
    defaults into a `CampaignConfig`. Fills ``flags`` in place with the file's values and
    the source of each value (`sources`)."""
    from evolane.cli._config import ConfigError, locate, merge_config_file

    try:
        merge_config_file(flags)
    except ConfigError as error:
        raise UsageError(str(error)) from None
    try:
        return _build_config(flags)
    except UsageError as error:
        raise UsageError(locate(str(error), flags)) from None
    except _input_error() as error:  # a path the file gave (--prices, --rubric): its line
        located = locate(str(error), flags)
        if located == str(error):
            raise
        raise _input_error()(located) from None


def _build_config(flags: dict[str, Any]) -> Any:
    from evolane.campaign import CampaignConfig
    from evolane.messages import GateConfig

    _check_choices(flags)
    _confirm_split(flags)
    _cluster(flags)
    values = _presets(flags)
    for key in _CONFIG_FLAGS:
        if flags.get(key) is not None:
            values[key] = flags[key]
    if flags.get("protected"):
        values["protected"] = tuple(flags["protected"])
    if flags.get("required_file"):
        values["required_files"] = tuple(flags["required_file"])
    values.update(grant_values(flags))
    values.update(model_flags(flags))
    if flags.get("from_trajectory"):
        if flags.get("dataset"):
            raise UsageError("--dataset and --from-trajectory: give one of them, not both")
        values["from_trajectory"] = tuple(
            str(Path(path).absolute()) for path in flags["from_trajectory"]
        )
        values["dataset"] = None  # an example's dataset gives way to the trajectories
    for key, flag in (("target", "--target"), ("dataset", "--dataset"), ("replay", "--replay")):
        if not values.get(key) and not (key == "dataset" and values.get("from_trajectory")):
            raise UsageError(f"{flag} is required (or use --example self-evolution)")
    if not values.get("optimizer"):
        raise UsageError("--optimizer is required (or use --example self-evolution)")
    values["target"] = str(Path(values["target"]).absolute())
    if values["dataset"]:
        values["dataset"] = str(Path(values["dataset"]).absolute())
    if not str(flags["store"]).strip():  # an unset "$STORE": the current folder, unasked
        raise UsageError("--store is empty: name the store's folder")
    values["store"] = str(Path(flags["store"]).absolute())
    gate = {k: flags[k] for k in _GATE_FLAGS if flags.get(k) is not None}
    gate["no_regression"] = bool(flags.get("no_regression"))
    gate["seed"] = values.get("seed", 0)
    try:
        values["gate"] = GateConfig(**gate)
        return CampaignConfig(**values)
    except ValidationError as error:
        raise UsageError(flag_problem(error)) from None


def _presets(flags: dict[str, Any]) -> dict[str, Any]:
    """The values an example (``--example``) and ``--fast-verified`` preset; their sources
    join ``flags``'s where no flag or file set them."""
    from evolane.campaign import store_root
    from evolane.cli._config import FAST, SOURCES_KEY

    values: dict[str, Any] = {}
    sources = flags.setdefault(SOURCES_KEY, {})
    example = flags.get("example")
    if example is not None:
        if example not in EXAMPLES:
            raise UsageError(f"--example {example}: choose from {', '.join(EXAMPLES)}")
        store = store_root(Path(flags["store"]))  # the example is written there: one line
        flags["example_dir"] = flags.get("example_dir") or store / "examples" / example
        settings = example_settings(example, Path(flags["example_dir"]))
        values.update(EXAMPLE_DEFAULTS[example])  # presets from this version, not the workspace
        for key in ("target", "dataset", "replay", "judge", "optimizer", "validator", "check"):
            if settings.get(key):
                values[key] = settings[key]
        values["protected"] = tuple(settings.get("protected", ()))
        values["required_files"] = tuple(settings.get("required_files", ()))
        for key in values:
            sources.setdefault(key.replace("required_files", "required_file"), f"example {example}")
        values["example"] = example
    if flags.get("fast_verified"):
        values.update(screening=True, judge_failure_retries=1)
        values.setdefault("baseline_replay_repetitions", 1)
        values.setdefault("candidate_replay_repetitions", 1)
        for key in ("judge_failure_retries", "baseline_replay_repetitions"):
            sources.setdefault(key, FAST)
        sources.setdefault("candidate_replay_repetitions", FAST)
        if sources["judge_failure_retries"].startswith("example "):  # the preset wins over it
            sources["judge_failure_retries"] = FAST
    return values


def _confirm_split(flags: dict[str, Any]) -> None:
    """``--confirm-split test`` (DESIGN §10's name) is ``--error-control confirm``; with a
    mode that confirms on no split it is a contradiction, refused."""
    if flags.get("confirm_split") is None:
        return
    from evolane.cli._config import SOURCES_KEY

    mode = flags.get("error_control")
    if mode not in (None, "auto", "confirm"):
        raise UsageError(
            f"--confirm-split test: --error-control {mode} confirms on no split; give one of them"
        )
    sources = flags.get(SOURCES_KEY)
    if mode is None and sources is not None and "confirm_split" in sources:
        sources["error_control"] = sources["confirm_split"]  # `config show` names the flag
    flags["error_control"] = "confirm"


def _cluster(flags: dict[str, Any]) -> None:
    """Check ``--cluster`` (and that Dask is installed when it is needed); ``local:N`` runs N
    replay lanes unless ``--replay-concurrency`` says otherwise."""
    from evolane.distributed import ClusterError, check_cluster

    cluster = flags.get("cluster") or "local"
    try:
        spec = check_cluster(cluster)
    except ClusterError as error:
        raise UsageError(str(error)) from None
    flags["cluster"] = cluster
    if spec.kind == "local_dask" and flags.get("replay_concurrency") is None:
        flags["replay_concurrency"] = spec.workers


def run_optimize(flags: dict[str, Any], *, estimate_only: bool) -> int:
    """Run ``optimize`` or ``estimate``; returns the exit code (DESIGN §10)."""
    import evolane.cli as package

    from_main = package.LAUNCHED is not None  # the process is ours: a console-script call
    started, package.LAUNCHED = package.LAUNCHED or time.time(), None  # counts starting up
    try:
        early = flags.get("progress") == "jsonl"
        with json_stdout_only(early):  # a plugin's print: stderr
            request = _request(flags, estimate_only)
            # jsonl from the config file or a resumed run's settings is known only now
            with json_stdout_only(not early and flags.get("progress") == "jsonl"):
                observers = _observers(request, flags)
                return trio.run(_main, request, flags, started, observers)
    except BaseException as error:  # every error becomes one line and an exit code
        leaf = _leaf(error)
        if isinstance(leaf, KeyboardInterrupt) and _recorded(flags, started):
            return EXIT_INTERRUPTED
        return _exit_for(leaf, bool(flags.get("debug")), flags.get("store"))
    finally:  # the run is over: a late Ctrl-C must not turn its exit code into a signal death
        if from_main:
            signal.signal(signal.SIGINT, signal.SIG_IGN)


def _recorded(flags: dict[str, Any], started: float) -> bool:
    """After a Ctrl-C that aborted the start of a run: if the run was written (and so left
    resumable), print the summary of a cancelled run with its resume command, and say so."""
    from evolane.cli._summary import print_summary

    if flags.get("summarised") or not flags.get("store"):
        return False
    run_id = recorded_run(Path(flags["store"]).absolute(), started, flags.get("resume"))
    if run_id is None:
        return False
    print_summary(None, {**flags, "run_id": run_id})
    return True


def _leaf(error: BaseException) -> BaseException:
    """The error that decides the exit code: a Ctrl-C, else bad input, else the one error
    inside (nested) exception groups, else the group itself."""
    from evolane.supervisors import leaf_exceptions

    leaves = leaf_exceptions(error)
    for kind in (KeyboardInterrupt, UsageError, _input_error()):
        chosen = next((leaf for leaf in leaves if isinstance(leaf, kind)), None)
        if chosen is not None:
            return chosen
    return leaves[0] if len(leaves) == 1 else error


def _input_error() -> type[Exception]:
    from evolane.inputs import InputError

    return InputError


def _exit_for(error: BaseException, debug: bool, store: str | None = None) -> int:
    from evolane.inputs import InputError
    from evolane.store import describe_failure, storage_failure

    if isinstance(error, UsageError | InputError):
        error_line(str(error))
        return EXIT_USAGE
    failure = storage_failure(error)
    if failure is not None:  # a full disk or store damage (the run ended failed), one line
        if debug:  # found by review: --debug printed no traceback of these either
            traceback.print_exception(error)
        error_line(describe_failure(failure, store or "the store"))
        return EXIT_INTERNAL
    if isinstance(error, KeyboardInterrupt):  # not an error: the line every command prints
        print("evolane: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    if isinstance(error, SystemExit | GeneratorExit):
        raise error
    return internal_error(error, debug)


def _request(flags: dict[str, Any], estimate_only: bool) -> Any:
    """The flags as the public API's `OptimizeRequest`."""
    from evolane.cli._config import (
        ConfigError,
        continue_session,
        locate,
        merge_config_file,
        resolved_settings,
    )

    _check_ids(flags)
    try:  # a continued run takes only the session's keys (store, view) from the file
        merge_config_file(flags, session_only=bool(flags.get("resume") or flags.get("from_run")))
        _check_choices(flags)
    except (ConfigError, UsageError) as error:
        raise UsageError(locate(str(error), flags)) from None
    refuse_continued(flags, estimate_only)
    from evolane.embed import OptimizeRequest  # the runtime loads once the flags checked out

    if flags.get("resume"):
        flags["ignored"] = continue_session(flags)  # said once the run resumes (`_session`)
        return OptimizeRequest(resume=flags["resume"])
    from_run = flags.get("from_run")
    if from_run:
        if not flags.get("rerun_evaluator"):
            raise UsageError("--from-run needs --rerun-evaluator (re-judging is all it does)")
        ceilings = {k: flags[k] for k in ("max_tokens", "max_cost_usd") if flags.get(k) is not None}
        return OptimizeRequest(
            from_run=from_run,
            rerun_evaluator=True,
            judge=flags.get("judge"),
            models=rejudge_models(flags),
            **ceilings,
        )
    dry = estimate_only or bool(flags.get("dry_run"))
    config = build_config(flags)
    return OptimizeRequest(
        config=config,
        settings=resolved_settings(config, flags),
        resume_campaign=flags.get("resume_campaign"),
        dry_run=dry,
    )


_CONTINUED = (
    ("resume", "--resume", "run"),
    ("resume_campaign", "--resume-campaign", "campaign"),
    ("from_run", "--from-run", "run"),
)


def _check_ids(flags: dict[str, Any]) -> None:
    """`UsageError` naming the flag for a continued run's or campaign's id given empty (an
    unset ``"$RUN_ID"``) or not an id (`evolane.campaign.check_id`). Found by hostile
    review: ``--resume ""`` started a new campaign, and an id over 128 characters, or
    ``--resume-campaign ""``, was an internal error (the request's own check), exit 1."""
    for key, flag, what in _CONTINUED:
        value = flags.get(key)
        if value is None:
            continue
        if not value.strip():
            raise UsageError(f"{flag} is empty: name the {what} (`evolane runs` lists them)")
        from evolane.campaign import check_id  # a continued run loads the runtime anyway
        from evolane.inputs import InputError

        try:
            check_id(value, what)
        except InputError as error:
            raise UsageError(f"{flag}: {error}") from None


def refuse_continued(flags: dict[str, Any], estimate_only: bool) -> None:
    """`UsageError` for ``--rerun-evaluator`` alone, and for an estimate (``estimate``,
    ``--dry-run``, ``--probe``) of a continued run: only a new run can be estimated."""
    if flags.get("rerun_evaluator") and not flags.get("from_run"):
        raise UsageError("--rerun-evaluator needs --from-run RUN_ID")
    continued = (
        "--resume" if flags.get("resume") else "--from-run" if flags.get("from_run") else None
    )
    if continued and (estimate_only or flags.get("dry_run")):
        what = "evolane estimate" if estimate_only else "--dry-run"
        raise UsageError(f"{what} with {continued}: only a new run can be estimated")


def print_estimate(estimate: Any, flags: dict[str, Any]) -> int:
    """Print an estimate as ``estimate`` and ``--dry-run`` show it (``--json``: as JSON); a
    reader that went away ends it quietly (`reader_may_leave`)."""
    from evolane.cli._output import reader_may_leave

    with reader_may_leave():
        _print_estimate(estimate, flags)
    return EXIT_OK


def _print_estimate(estimate: Any, flags: dict[str, Any]) -> None:
    if flags.get("as_json"):
        print(estimate.model_dump_json(indent=2), file=own_stdout())
        return
    if flags.get("progress") == "jsonl":  # stdout is JSON lines: the estimate as one
        print(estimate.model_dump_json(), file=own_stdout())
        return
    from evolane.cli._estimates import ceiling_lines, estimate_lines

    for line in estimate_lines(estimate):
        print(line)
    spend = [f"~{count(estimate.tokens)} tokens"] if estimate.tokens is not None else []
    spend += [f"~${estimate.cost_usd:.2f}"] if estimate.cost_usd is not None else []
    if estimate.by_role:
        spend.append(f"by role {role_spend(estimate.by_role)}")
    if spend:
        print(f"spend: {'; '.join(spend)} (from an earlier run in this store)")
    ceilings = ("max_tokens", "max_cost_usd", "wall_clock_budget")
    for line in ceiling_lines(estimate, {name: flags.get(name) for name in ceilings}):
        print(line)
    if estimate.splits:
        print(f"splits: {estimate.splits}")
    for line in estimate.preflight:
        print(f"preflight: {line}")


def _observers(request: Any, flags: dict[str, Any]) -> list[Any]:
    """The ``--observer`` plugins' observers, made before the loop: there Ctrl-C ends one."""
    from evolane import embed

    names = [] if request.dry_run else flags.get("observer") or []
    return [embed.observer_plugin(name) for name in dict.fromkeys(names)]


async def _main(request: Any, flags: dict[str, Any], started: float, observers: list[Any]) -> int:
    """One run through the public embedding API, with the view and Ctrl-C handling."""
    return await watching_signals(lambda watch: _session(request, flags, started, watch, observers))


async def _session(
    request: Any, flags: dict[str, Any], started: float, watch: SignalWatch, observers: list[Any]
) -> int:
    from evolane import embed
    from evolane.cli._summary import print_summary

    store = str(Path(flags["store"]).absolute())
    async with embed.open_runtime(store=store) as runtime:
        watch.handle = await runtime.start_optimize(request, started=started, observers=observers)
        if request.dry_run:
            return print_estimate((await watch.handle.result()).estimate, flags)
        flags["run_id"] = watch.handle.run_id
        if flags.get("ignored"):
            ignored = ", ".join(flags["ignored"])
            warning = (
                f"--resume {flags['run_id']} keeps the run's stored settings; ignored: {ignored}"
            )
            print(f"evolane: warning: {warning}", file=sys.stderr)
        outcome = await _follow(watch.handle, flags) or ended_outcome(flags)  # a late Ctrl-C
        watch.ended = True
        print_summary(outcome, flags)
        flags["summarised"] = True  # a Ctrl-C from now on must not print another
        watch.code = code = _exit_code(outcome)
        _observer_notes(watch.handle, unseen=flags.get("progress") == "none")
    return code


def _exit_code(outcome: Any) -> int:
    """A session's exit code: its run's, or 130 when it ended with no report."""
    if outcome is None or outcome.report is None:
        return EXIT_INTERRUPTED
    return int(outcome.exit_code)


def _observer_notes(handle: Any, unseen: bool) -> None:
    """One line per observer that lost events, or failed unannounced or ``unseen`` (no view)."""
    for report in handle.observers:
        note = report.note()
        if note is not None and (unseen or not report.announced):
            print(f"evolane: {note}", file=sys.stderr)


async def _follow(handle: Any, flags: dict[str, Any]) -> Any:
    """The run's outcome (None when cancelled), shown by the live view while it runs."""
    from evolane import embed

    async with trio.open_nursery() as nursery:
        _start_view(nursery, handle, flags.get("progress") or "auto")
        try:
            return await handle.result()
        except embed.RunCancelled:
            return None  # the view ends by itself: the run closed its feed


def _start_view(nursery: trio.Nursery, handle: Any, mode: str) -> None:
    from evolane.cli._render import render_progress, resolve_mode

    render = partial(render_progress, out=own_stdout())
    nursery.start_soon(render, resolve_mode(mode, own_stdout()), handle.feed, handle.subscription)
