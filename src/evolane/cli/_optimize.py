"""``evolane optimize`` and ``evolane estimate``: flags -> `CampaignConfig` -> a run.

Flag names, defaults and exit codes are the contract of DESIGN §10. Explicit flags win over
an example's presets, which win over the defaults.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from evolane.cli._config import use_flags
from evolane.cli._exits import fail_usage

_OPT = typer.Option


_PANELS = {
    "Inputs": "example example-dir config target dataset from-trajectory group replay judge "
    "optimizer validator check required-file rubric",
    "Search": "iterations population max-improvement-cycles stall focus feedback-split "
    "protected seed",
    "Decision": "apply gate k-se min-effect threshold confidence bootstrap-samples "
    "no-regression sequential error-control confirm-split test-budget fast-verified",
    "Measurement": "baseline-replay-repetitions candidate-replay-repetitions judge-failure-retries",
    "Budgets and deadlines": "wall-clock-budget max-tokens max-cost-usd replay-timeout "
    "judge-timeout optimizer-timeout optimizer-idle kill-grace",
    "Lanes": "replay-concurrency judge-concurrency optimizer-concurrency cluster",
    "Isolation": "isolation network network-for host-network-for expose expose-rw pass-env "
    "max-procs max-memory max-file-size max-open-files",
    "Models": "judge-samples llm-base-url llm-api-key-env llm-temperature llm-max-tokens "
    "llm-timeout llm-retries llm-cache prices unknown-price",
    "Output, store and continuing": "store progress observer dry-run json probe resume "
    "resume-campaign from-run rerun-evaluator drain-pending debug",
}
_PANEL_OF = {f"--{flag}": panel for panel, flags in _PANELS.items() for flag in flags.split()}
"""The help panel of each flag (``optimize --help`` groups its flags by purpose)."""


def _o(help_text: str, *names: str) -> Any:
    panel = _PANEL_OF[names[0].split("/")[0]]
    return _OPT(*names, help=help_text, show_default=False, rich_help_panel=panel)


Flags = dict[str, Any]


def optimize(
    example: Annotated[
        str | None, _o("Built-in workload: self-evolution or sleeper.", "--example")
    ] = None,
    example_dir: Annotated[
        Path | None,
        _o("Where --example writes its workspace (default STORE/examples/NAME).", "--example-dir"),
    ] = None,
    config: Annotated[
        Path | None,
        _o(
            "Config file (default: evolane.toml, else the tool.evolane table of "
            "pyproject.toml, here or in a parent folder).",
            "--config",
        ),
    ] = None,
    target: Annotated[str | None, _o("The directory (or file) to improve.", "--target")] = None,
    dataset: Annotated[str | None, _o("JSONL cases.", "--dataset")] = None,
    from_trajectory: Annotated[
        list[str] | None,
        _o(
            "Agent trajectory JSONL file or folder to derive the cases from (repeatable; "
            "instead of --dataset).",
            "--from-trajectory",
        ),
    ] = None,
    group: Annotated[
        str | None,
        _o(
            "With --from-trajectory: the task family to run on (default: the largest with "
            "failures).",
            "--group",
        ),
    ] = None,
    replay: Annotated[str | None, _o("Replay command template.", "--replay")] = None,
    judge: Annotated[str | None, _o("Judge command template, or llm:MODEL.", "--judge")] = None,
    optimizer: Annotated[
        str | None, _o("Optimizer command template, llm:MODEL or agent:NAME.", "--optimizer")
    ] = None,
    validator: Annotated[
        str | None, _o("Command that checks a candidate is well formed.", "--validator")
    ] = None,
    check: Annotated[str | None, _o("Post-apply check for auto_verified.", "--check")] = None,
    required_file: Annotated[
        list[str] | None, _o("A file every candidate must keep.", "--required-file")
    ] = None,
    iterations: Annotated[
        int | None, _o("Iterations per cycle (default 8).", "--iterations")
    ] = None,
    population: Annotated[
        int | None, _o("Candidate slots per iteration (default 2).", "--population")
    ] = None,
    max_improvement_cycles: Annotated[
        int | None, _o("Cycles per campaign (default 1).", "--max-improvement-cycles")
    ] = None,
    stall: Annotated[
        int | None,
        _o("Iterations without an accepted candidate before exhausted (default 4).", "--stall"),
    ] = None,
    replay_concurrency: Annotated[
        int | None, _o("Replay lanes (default 4).", "--replay-concurrency")
    ] = None,
    judge_concurrency: Annotated[
        int | None, _o("Judge lanes (default 2).", "--judge-concurrency")
    ] = None,
    optimizer_concurrency: Annotated[
        int | None, _o("Optimizer lanes (default 2).", "--optimizer-concurrency")
    ] = None,
    replay_timeout: Annotated[
        float | None, _o("Seconds per replay (default 600).", "--replay-timeout")
    ] = None,
    judge_timeout: Annotated[
        float | None, _o("Seconds per judge call (default 120).", "--judge-timeout")
    ] = None,
    optimizer_timeout: Annotated[
        float | None, _o("Seconds per optimizer call (default 600).", "--optimizer-timeout")
    ] = None,
    optimizer_idle: Annotated[
        float | None, _o("Kill a silent, idle optimizer after S (default 120).", "--optimizer-idle")
    ] = None,
    kill_grace: Annotated[
        float | None, _o("SIGTERM-to-SIGKILL grace (default 2).", "--kill-grace")
    ] = None,
    wall_clock_budget: Annotated[
        float | None,
        _o("Seconds for the whole campaign (every session of every run).", "--wall-clock-budget"),
    ] = None,
    max_tokens: Annotated[int | None, _o("Token ceiling (whole campaign).", "--max-tokens")] = None,
    max_cost_usd: Annotated[
        float | None, _o("Cost ceiling in USD (whole campaign).", "--max-cost-usd")
    ] = None,
    baseline_replay_repetitions: Annotated[
        int | None,
        _o("Baseline repetitions (adaptive when unset).", "--baseline-replay-repetitions"),
    ] = None,
    candidate_replay_repetitions: Annotated[
        int | None,
        _o("Candidate repetitions (adaptive when unset).", "--candidate-replay-repetitions"),
    ] = None,
    judge_failure_retries: Annotated[
        int | None, _o("Retries of a failed judge call (default 2).", "--judge-failure-retries")
    ] = None,
    fast_verified: Annotated[
        bool,
        _o(
            "Fast preset: screening, one repetition, one judge retry.",
            "--fast-verified/--no-fast-verified",
        ),
    ] = False,
    apply: Annotated[
        str | None, _o("proposal | verified_only | auto_verified (default proposal).", "--apply")
    ] = None,
    gate: Annotated[
        str | None, _o("paired | bootstrap | strict | threshold (default paired).", "--gate")
    ] = None,
    k_se: Annotated[
        float | None, _o("Accept when mean delta > k x SE (default 1).", "--k-se")
    ] = None,
    min_effect: Annotated[
        float | None, _o("Smallest effect worth accepting (default 0).", "--min-effect")
    ] = None,
    threshold: Annotated[
        float | None,
        _o("The threshold gate's bar on the candidate's mean score (default 0).", "--threshold"),
    ] = None,
    confidence: Annotated[float | None, _o("CI level (default 0.95).", "--confidence")] = None,
    bootstrap_samples: Annotated[
        int | None, _o("Bootstrap resamples (default 10000).", "--bootstrap-samples")
    ] = None,
    no_regression: Annotated[
        bool,
        _o(
            "Veto a candidate that fails a case the parent passed (--allow-regression: no veto).",
            "--no-regression/--allow-regression",
        ),
    ] = False,
    sequential: Annotated[
        bool | None,
        _o("Stop a measurement early once decided (default on).", "--sequential/--no-sequential"),
    ] = None,
    error_control: Annotated[
        str | None,
        _o(
            "Campaign-level error control: auto | confirm | online | none (default auto: "
            "confirm on the test split when the dataset has one, else online).",
            "--error-control",
        ),
    ] = None,
    confirm_split: Annotated[
        str | None,
        _o(
            "test: confirm the best on the test split before it is published (the same as "
            "--error-control confirm).",
            "--confirm-split",
        ),
    ] = None,
    test_budget: Annotated[
        str | None,
        _o(
            "campaign | store (default campaign): the confirmation spends this campaign's "
            "alpha, or a share of the test split's budget in the store, so that over every "
            "store campaign on these test cases a no-gain publish is at most alpha.",
            "--test-budget",
        ),
    ] = None,
    focus: Annotated[
        str | None, _o("all | cyclic | hardest-first (default all).", "--focus")
    ] = None,
    feedback_split: Annotated[
        str | None,
        _o(
            "train | val (default train): whose results the optimizer sees; val makes val "
            "scores optimistic.",
            "--feedback-split",
        ),
    ] = None,
    protected: Annotated[
        list[str] | None, _o("Glob a candidate may not touch (repeatable).", "--protected")
    ] = None,
    pass_env: Annotated[
        list[str] | None,
        _o(
            "[ROLE=]NAME of an environment variable commands (with ROLE: replay, judge, "
            "optimizer, validator or check, that role's alone) may see (repeatable).",
            "--pass-env",
        ),
    ] = None,
    isolation: Annotated[
        str | None,
        _o(
            "auto | confined | namespace | process (default auto: confined where bwrap works).",
            "--isolation",
        ),
    ] = None,
    network: Annotated[
        bool | None,
        _o("Let confined commands use the network (default: none).", "--network/--no-network"),
    ] = None,
    network_for: Annotated[
        list[str] | None,
        _o("ROLE whose confined commands may use the network (repeatable).", "--network-for"),
    ] = None,
    host_network_for: Annotated[
        list[str] | None,
        _o(
            "ROLE whose confined commands share the host's network, loopback included "
            "(repeatable).",
            "--host-network-for",
        ),
    ] = None,
    expose: Annotated[
        list[str] | None,
        _o("[ROLE=]PATH confined commands (or ROLE's) may read (repeatable).", "--expose"),
    ] = None,
    expose_rw: Annotated[
        list[str] | None,
        _o("[ROLE=]PATH confined commands (or ROLE's) may write (repeatable).", "--expose-rw"),
    ] = None,
    cluster: Annotated[
        str, _o("local | local:N | dask://HOST:PORT (default local).", "--cluster")
    ] = "local",
    max_procs: Annotated[
        str | None,
        _o(
            "Processes per command tree, pids cgroup; 0 or none: no limit (default 512).",
            "--max-procs",
        ),
    ] = None,
    max_memory: Annotated[
        str | None,
        _o(
            "Memory per command tree (memory cgroup): 512M, 4G, bytes; 0 or none: no limit "
            "(default 4G).",
            "--max-memory",
        ),
    ] = None,
    max_file_size: Annotated[
        str | None,
        _o(
            "Largest file a command writes: bytes, 512M, 1G; 0 or none: no limit (default 1G).",
            "--max-file-size",
        ),
    ] = None,
    max_open_files: Annotated[
        str | None,
        _o(
            "Open files per command process; 0 or none: no limit (default 4096).",
            "--max-open-files",
        ),
    ] = None,
    rubric: Annotated[
        Path | None, _o("The rubric a model judge (--judge llm:MODEL) scores by.", "--rubric")
    ] = None,
    judge_samples: Annotated[
        int | None, _o("Answers a model judge averages (default 1).", "--judge-samples")
    ] = None,
    llm_base_url: Annotated[
        list[str] | None,
        _o("\\[judge=|optimizer=]URL of an OpenAI-compatible endpoint.", "--llm-base-url"),
    ] = None,
    llm_api_key_env: Annotated[
        list[str] | None,
        _o("[ROLE=]NAME of the variable holding the API key.", "--llm-api-key-env"),
    ] = None,
    llm_temperature: Annotated[
        list[str] | None, _o("[ROLE=]T sampling temperature.", "--llm-temperature")
    ] = None,
    llm_max_tokens: Annotated[
        list[str] | None, _o("[ROLE=]N tokens per answer.", "--llm-max-tokens")
    ] = None,
    llm_timeout: Annotated[
        list[str] | None, _o("[ROLE=]S seconds per request.", "--llm-timeout")
    ] = None,
    llm_retries: Annotated[
        list[str] | None, _o("[ROLE=]N retries of a failed request (default 2).", "--llm-retries")
    ] = None,
    llm_cache: Annotated[
        bool,
        _o(
            "Answer repeated model requests from a cache (development).",
            "--llm-cache/--no-llm-cache",
        ),
    ] = False,
    prices: Annotated[
        Path | None, _o("Dollars per million tokens per model (YAML or JSON).", "--prices")
    ] = None,
    unknown_price: Annotated[
        str | None,
        _o(
            "refuse | reserve: a model with no price under --max-cost-usd (default refuse).",
            "--unknown-price",
        ),
    ] = None,
    seed: Annotated[int | None, _o("Seed of everything (default 0).", "--seed")] = None,
    store: Annotated[
        str, _o("Durable state directory (default .evolane).", "--store")
    ] = ".evolane",
    progress: Annotated[
        str, _o("auto | rich | plain | jsonl | none (default auto).", "--progress")
    ] = "auto",
    observer: Annotated[
        list[str] | None,
        _o("An installed observer plugin that hears the run's events (repeatable).", "--observer"),
    ] = None,
    dry_run: Annotated[bool, _o("Print the estimate and stop.", "--dry-run")] = False,
    probe: Annotated[
        bool,
        _o(
            "With --dry-run: time one replay and one judge call first; draw the wall range "
            "from them.",
            "--probe",
        ),
    ] = False,
    resume: Annotated[str | None, _o("Continue an interrupted run.", "--resume")] = None,
    resume_campaign: Annotated[
        str | None, _o("Run the next cycle of a campaign.", "--resume-campaign")
    ] = None,
    from_run: Annotated[
        str | None, _o("Re-judge the stored replays of a run.", "--from-run")
    ] = None,
    rerun_evaluator: Annotated[
        bool, _o("With --from-run: judge again, replay nothing.", "--rerun-evaluator")
    ] = False,
    drain_pending: Annotated[
        bool, _o("Run the store's pending background jobs (as evolane drain).", "--drain-pending")
    ] = False,
    debug: Annotated[bool, _o("Show tracebacks.", "--debug")] = False,
) -> None:
    """Run a campaign: propose, gate, replay, judge, decide, under hard budgets."""
    flags = {k: v for k, v in locals().items()}
    _one_way_on(flags)
    if drain_pending and (dry_run or probe):
        fail_usage("--drain-pending runs the pending jobs: it takes no --dry-run or --probe")
    if flags.pop("probe"):  # one timed replay and judge call, then the estimate
        if not dry_run:
            fail_usage("--probe times one replay and judge call for an estimate: add --dry-run")
        from evolane.cli._doctor import estimate_probe

        raise typer.Exit(estimate_probe(flags))
    if drain_pending:  # the store's pending jobs instead of a new run
        from evolane.cli._drain import drain_with_config

        raise typer.Exit(drain_with_config(flags))
    from evolane.cli._session import run_optimize

    raise typer.Exit(run_optimize(flags, estimate_only=False))


def _one_way_on(flags: dict[str, Any]) -> None:
    """Exit 2 when two of ``--resume``, ``--resume-campaign``, ``--from-run`` and
    ``--drain-pending`` are given: each is a different invocation (found by hostile review:
    ``--resume-campaign C --from-run R`` re-judged R as a new campaign, and
    ``--drain-pending --resume R`` drained the jobs, the other flag silently dropped)."""
    names = ("resume", "resume_campaign", "from_run", "drain_pending")
    given = [
        f"--{name.replace('_', '-')}" for name in names if flags.get(name) not in (None, False)
    ]
    if len(given) > 1:
        fail_usage(f"{given[0]} and {given[1]}: give one of them")


use_flags(optimize)


def estimate(**flags: Any) -> None:
    """The cost and wall estimate for the same flags as `optimize`; nothing runs (with
    `--probe`: one replay and one judge call, timed, give the wall range)."""
    from evolane.cli._session import run_optimize

    if flags.pop("probe", False):
        from evolane.cli._doctor import estimate_probe

        raise typer.Exit(estimate_probe(flags))

    raise typer.Exit(run_optimize(flags, estimate_only=True))


def _estimate_signature() -> inspect.Signature:
    """``optimize``'s flags plus ``--json``: typer reads this signature to build the command."""
    signature = inspect.signature(optimize, eval_str=True)
    params = [
        p for p in signature.parameters.values() if p.name not in ("dry_run", "drain_pending")
    ]
    as_json = inspect.Parameter(
        "as_json",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[bool, _o("Print the estimate as JSON.", "--json")],
    )
    kinds = [
        p.replace(kind=inspect.Parameter.KEYWORD_ONLY)
        if p.name != "probe"
        else p.replace(
            kind=inspect.Parameter.KEYWORD_ONLY,
            annotation=Annotated[
                bool,
                _o("Time one replay and one judge call; draw the wall range from them.", "--probe"),
            ],
        )
        for p in params
    ]
    return inspect.Signature([*kinds, as_json])


estimate.__signature__ = _estimate_signature()  # type: ignore[attr-defined]


def doctor(**flags: Any) -> None:
    """Check the host, the inputs and the commands, and run one real replay and judge."""
    from evolane.cli._doctor import run_doctor

    raise typer.Exit(run_doctor(flags))


def _doctor_signature() -> inspect.Signature:
    """``optimize``'s flags without those only a run has (as ``estimate`` takes them)."""
    signature = inspect.signature(optimize, eval_str=True)
    dropped = ("dry_run", "resume", "from_run", "rerun_evaluator", "progress", "observer")
    dropped += ("drain_pending", "probe")
    kept = [p for p in signature.parameters.values() if p.name not in dropped]
    return inspect.Signature([p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in kept])


doctor.__signature__ = _doctor_signature()  # type: ignore[attr-defined]
