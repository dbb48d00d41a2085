"""The estimate made before any expensive work: how many subprocesses at most, how long.

Counts are upper bounds (every candidate measured in full, and again beside its parent
under online error control, no baseline reused across parents, every judge call retried to
the limit); when train feeds the optimizer
(`campaign._splits`), the parent of every iteration is also measured on train, and those
replays count too. The wall range runs from a lucky run (nothing accepted, so it stalls
after ``stall`` iterations, every candidate stopped early at the coverage floor) at the
typical unit time seen before in this store, to every unit running into its timeout and
its kill grace.

With a timing (`ProbeTiming`: one replay and one judge call timed by ``estimate --probe`` or
``doctor``, `campaign._probe`) the wall range is a realistic one: from the lucky run at the
probe's unit time to every planned unit (retries not counted: they are not certain spend)
at `PROBE_MARGIN` times it; the ceiling-based bound stays as ``wall_worst_seconds``.
"""

from __future__ import annotations

import math
import os
from typing import Any

from pydantic import Field

from evolane.campaign._config import CampaignConfig
from evolane.campaign._online import OnlineBudget, resolved_mode
from evolane.inputs import llm_model
from evolane.messages import MAX_PREFLIGHT_LINES, Name, Record, ShortText, Usage

PROBE_MARGIN = 3.0
"""How much slower than the probe a unit may run in the realistic upper bound: one timed
unit is a sample of one, and a busy host slows every lane."""
RUN_OVERHEAD_SECONDS = 5.0
"""Setting a run up and writing its report (snapshots, sandbox, report files) in the
realistic upper bound."""
STEP_OVERHEAD_SECONDS = 1.0
"""Per optimizer call in the realistic upper bound when no earlier run timed the optimizer:
spawning, the gates and snapshotting its candidate."""


class ProbeTiming(Record):
    """One replay's and one judge call's wall seconds, timed on this host before a run."""

    replay_seconds: float = Field(ge=0)
    judge_seconds: float = Field(ge=0)


class UnitHistory(Record):
    """What earlier runs in the store measured per replay unit (replay plus judge)."""

    seconds: float = Field(ge=0)
    tokens: float | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    optimizer_seconds: float | None = Field(default=None, ge=0)
    by_role: dict[Name, Usage] = Field(default_factory=dict, max_length=8)
    """Tokens and dollars per replay unit (``replay``, ``judge``) and per proposal
    (``optimizer``), where an earlier report says."""


class Estimate(Record):
    """Subprocess counts, the worst-case wall range, tokens and cost (DESIGN §10 ``estimate``)."""

    val_cases: int = Field(ge=0)
    test_cases: int = Field(ge=0)
    train_cases: int = Field(default=0, ge=0)
    """The train cases each parent is measured on (0 when val feeds the optimizer)."""
    baseline_repetitions: int = Field(ge=1)
    candidate_repetitions: int = Field(ge=1)
    replays_max: int = Field(ge=0)
    judge_calls_max: int = Field(ge=0)
    optimizer_calls_max: int = Field(ge=0)
    wall_low_seconds: float | None = Field(default=None, ge=0)
    wall_high_seconds: float = Field(ge=0)
    wall_worst_seconds: float | None = Field(default=None, ge=0)
    """Every unit into its timeout and every judge retried (set when the high end above is
    a realistic one, from a probe)."""
    judge_retries_max: int = Field(default=0, ge=0)
    """Judge retries at most, on top of one call per replay (not certain spend)."""
    judge_samples: int = Field(default=1, ge=1, le=16)
    """Model requests a judge call makes at least: ``--judge-samples`` for the built-in
    model judge (found by review: "84 judge calls" for 420 requests at 5 samples), else 1."""
    probe: ProbeTiming | None = None
    """The one-case timing the range is drawn from (``--probe``)."""
    tokens: float | None = Field(default=None, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)
    by_role: dict[Name, Usage] = Field(default_factory=dict, max_length=8)
    """The tokens and dollars each role (optimizer, replay, judge) is expected to spend, at
    the counts above and the per-unit spend of an earlier run."""
    basis: ShortText = ""
    min_gain: float | None = None
    """The smallest mean gain the gate can accept with pass/fail scores (preflight)."""
    preflight: tuple[ShortText, ...] = Field(default=(), max_length=MAX_PREFLIGHT_LINES)
    """What the gate can accept, in words, before anything runs (`campaign._preflight`)."""
    splits: ShortText = ""
    """Which split feeds the optimizer and each split's cases, in words (`campaign._splits`)."""
    campaign_used: Usage = Usage()
    """What the campaign's earlier cycles and sessions spent (tokens, dollars, wall seconds):
    the ceilings count the whole campaign, so this run gets only what is left of each."""


def repetitions_for(config: CampaignConfig, cases: int) -> tuple[int, int]:
    """The repetitions a measurement on ``cases`` cases will use (explicit flags win)."""
    adaptive = (1, 1) if cases >= config.gate.min_cases else (2, 3)
    return (
        config.baseline_replay_repetitions or adaptive[0],
        config.candidate_replay_repetitions or adaptive[1],
    )


def estimate_run(
    config: CampaignConfig,
    val_cases: int,
    test_cases: int,
    history: UnitHistory | None = None,
    *,
    train_cases: int = 0,
    probe: ProbeTiming | None = None,
    budgets: tuple[OnlineBudget | None, OnlineBudget | None] = (None, None),
    used: Usage | None = None,
    clusters: tuple[int | None, int | None] = (None, None),
) -> Estimate:
    """The estimate for one cycle of ``config`` on a dataset of this shape (``train_cases``:
    the cases each parent is measured on for the optimizer's feedback, besides val); with a
    ``probe``, a realistic wall range from its timing (`probe_range`); its preflight under a
    continued campaign's (online, confirmation) ``budgets``; ``used``: what the campaign's
    earlier cycles spent (its wall-clock budget caps the range at what is left of it);
    ``clusters``: the val and test cases' clusters, when clustered (`preflight`)."""
    used = used or Usage()
    config = _wall_left(config, used.wall_seconds or 0.0)
    b, c = repetitions_for(config, val_cases)
    iterations, population = config.iterations, config.population
    replays = _replays(config, val_cases, test_cases, train_cases)
    optimizer_calls = iterations * population
    measure = config.measure
    judges = replays * (1 + measure.judge_failure_retries) if measure.judge else replays
    high = _worst(config, replays)
    if config.wall_clock_budget is not None:
        high = min(high, config.wall_clock_budget + config.commands.kill_grace + 1.0)
    low = tokens = cost = None
    by_role: dict[str, Usage] = {}
    basis = "no earlier run in this store: the wall's lower end is unknown"
    if history is not None:
        lucky = _lucky(config, val_cases, test_cases, train_cases)
        optimizer = (history.optimizer_seconds or 0.0) * _lucky_steps(config)
        low = min(high, lucky * history.seconds / measure.replay_concurrency + optimizer)
        low = min(low, config.wall_clock_budget or low)  # a run stops at its budget
        tokens = history.tokens * replays if history.tokens is not None else None
        cost = history.cost_usd * replays if history.cost_usd is not None else None
        by_role = _role_spend(history, {"optimizer": optimizer_calls, "replay": replays,
                                        "judge": replays})  # fmt: skip
        if by_role:  # the roles add up to the whole (an old history: the whole per unit)
            tokens = _total(by_role, "tokens")
            cost = _total(by_role, "cost_usd")
            if not {"optimizer", "replay", *(["judge"] if measure.judge else [])} <= by_role.keys():
                tokens = cost = None  # a role no earlier run tells: the whole is unknown
        basis = f"typical unit {history.seconds:.2f} s from earlier runs in this store"
    worst = None
    if probe is None and history is not None:  # the unit time seen before paces the run
        timing = ProbeTiming(replay_seconds=history.seconds, judge_seconds=0.0)
        worst, high = high, max(low or 0.0, probe_range(config, replays, 0, timing)[1])
    if probe is not None:
        lucky_units = _lucky(config, val_cases, test_cases, train_cases)
        worst, (low, high) = high, probe_range(config, replays, lucky_units, probe)
        basis = (
            f"probe: one replay {probe.replay_seconds:.2f} s, one judge call "
            f"{probe.judge_seconds:.2f} s on this host"
        )
    from evolane.campaign._preflight import preflight  # the statistics (numpy)

    checked = preflight(config, val_cases, test_cases, (b, c), *budgets, clusters=clusters)
    return Estimate(
        wall_worst_seconds=worst,
        judge_retries_max=judges - replays if measure.judge else 0,
        judge_samples=config.models.judge_samples if llm_model(measure.judge) else 1,
        probe=probe,
        min_gain=checked.min_gain,
        preflight=checked.lines,
        val_cases=val_cases,
        test_cases=test_cases,
        train_cases=train_cases,
        baseline_repetitions=b,
        candidate_repetitions=c,
        replays_max=replays,
        judge_calls_max=replays,
        optimizer_calls_max=optimizer_calls,
        wall_low_seconds=low,
        wall_high_seconds=high,
        tokens=tokens,
        cost_usd=cost,
        by_role=by_role,
        basis=basis,
        campaign_used=used,
    )


def _wall_left(config: CampaignConfig, used: float) -> CampaignConfig:
    """``config`` with the wall-clock budget the campaign has left after ``used`` seconds."""
    budget = config.wall_clock_budget
    if budget is None or not used:
        return config
    return config.model_copy(update={"wall_clock_budget": max(1e-9, budget - used)})


def _replays(config: CampaignConfig, val_cases: int, test_cases: int, train_cases: int) -> int:
    """Replays at most: every parent on val (and train when it feeds the optimizer), every
    candidate in full (and screened), the final val and the test split."""
    b, c = repetitions_for(config, val_cases)
    # The test split is measured at the confirmation's repetitions (both arms alike) when the
    # best is confirmed, else at the run's own (adaptive on the test cases: 2/3 when few).
    from evolane.campaign._confirm import confirm_repetitions

    tb = confirm_repetitions(config, test_cases)
    test = max(2 * tb, sum(repetitions_for(config, test_cases)))
    iterations, population = config.iterations, config.population
    screening = (b + c) if config.screening else 0
    feedback = train_cases * repetitions_for(config, train_cases)[0]  # per parent
    baselines = iterations * (val_cases * b + feedback)
    # Online control measures a candidate it would accept again beside fresh replays of
    # its parent (`campaign._online.earlier_window`): at most once per candidate.
    again = b + c if resolved_mode(config.error_control, test_cases) == "online" else 0
    candidates = iterations * population * (val_cases * (c + again) + screening)
    return baselines + candidates + val_cases * (b + c) + test_cases * test


def _worst(config: CampaignConfig, replays: int) -> float:
    """The ceiling-based wall: every replay, every judge attempt and every optimizer call
    into its timeout and then its kill grace (a tree that ignores SIGTERM is killed only
    after it), the replays over their lanes and the judge attempts over theirs, one pool
    after the other (a judge pool narrower than the replays' paces its own), plus the
    run's set-up."""
    measure, propose = config.measure, config.propose
    grace = config.commands.kill_grace
    attempts = 1 + measure.judge_failure_retries
    replaying = math.ceil(replays / measure.replay_concurrency) * (measure.replay_timeout + grace)
    judging = math.ceil(replays / measure.judge_concurrency) * (measure.judge_timeout + grace)
    steps = config.iterations * math.ceil(config.population / propose.optimizer_concurrency)
    optimizing = steps * (propose.optimizer_timeout + grace)
    return replaying + judging * attempts + optimizing + RUN_OVERHEAD_SECONDS


def with_probe(estimate: Estimate, config: CampaignConfig, probe: ProbeTiming) -> Estimate:
    """``estimate`` (a dry run's: counts, spend from earlier runs, preflight, what the
    campaign used) with its wall range drawn from ``probe`` (`probe_range`), the
    ceiling-based bound kept as the worst case."""
    config = _wall_left(config, estimate.campaign_used.wall_seconds or 0.0)
    lucky = _lucky(config, estimate.val_cases, estimate.test_cases, estimate.train_cases)
    low, high = probe_range(config, estimate.replays_max, lucky, probe)
    worst = estimate.wall_worst_seconds
    basis = (
        f"probe: one replay {probe.replay_seconds:.2f} s, one judge call "
        f"{probe.judge_seconds:.2f} s on this host"
    )
    return estimate.model_copy(
        update={
            "wall_low_seconds": low,
            "wall_high_seconds": high,
            "wall_worst_seconds": estimate.wall_high_seconds if worst is None else worst,
            "probe": probe,
            "basis": basis,
        }
    )


def rejudge_estimate(estimate: Estimate, config: CampaignConfig, stored: int) -> Estimate:
    """A re-judge's estimate (``--from-run --rerun-evaluator``): no replay and no optimizer
    call, a judge call (and its retries) for each of the ``stored`` replays it judges again."""
    measure = config.measure
    retries = measure.judge_failure_retries if measure.judge else 0
    lanes = math.ceil(stored / measure.judge_concurrency)
    worst = lanes * (measure.judge_timeout + config.commands.kill_grace) * (1 + retries)
    return estimate.model_copy(
        update={
            "replays_max": 0,
            "judge_calls_max": stored,
            "judge_retries_max": stored * retries,
            "optimizer_calls_max": 0,
            "wall_low_seconds": None,
            "wall_high_seconds": worst + RUN_OVERHEAD_SECONDS,
            "wall_worst_seconds": None,
            "basis": f"a re-judge of {stored} stored replays: nothing is replayed",
        }
    )


def _lucky(config: CampaignConfig, val_cases: int, test_cases: int, train_cases: int) -> int:
    """Replays of a lucky run: nothing accepted, so the campaign stalls after `_lucky_steps`
    iterations, every candidate stopped at the coverage floor, and the test split measured
    with the seed on both arms, its replays shared (the lower end of the wall range)."""
    b, c = repetitions_for(config, val_cases)
    feedback = train_cases * repetitions_for(config, train_cases)[0]
    floor = min(val_cases, config.gate.min_cases)
    return (
        val_cases * b
        + feedback
        + _lucky_steps(config) * config.population * floor * c
        + test_cases * max(repetitions_for(config, test_cases))
    )


def _lucky_steps(config: CampaignConfig) -> int:
    """Iterations of a run that accepts nothing: ``--stall`` of them end the campaign."""
    return min(config.iterations, config.stall)


def probe_range(
    config: CampaignConfig, replays: int, lucky: int, probe: ProbeTiming
) -> tuple[float, float]:
    """The wall range from a probe: the ``lucky`` run's replays at the probed times, the
    replay and judge pools overlapping (the slower paces the run), to all ``replays``
    planned (retries not counted) at `PROBE_MARGIN` times the probed times, one after the
    other, spread over no more lanes than this host has CPUs (a unit timed alone runs
    slower beside others on a busy host), plus the optimizer calls and the run's set-up."""
    measure, propose = config.measure, config.propose
    replaying = math.ceil(lucky / measure.replay_concurrency) * probe.replay_seconds
    judging = math.ceil(lucky / measure.judge_concurrency) * probe.judge_seconds
    low = max(replaying, judging)
    parallel = max(1, min(measure.replay_concurrency, _free_cpus()))
    unit = probe.replay_seconds + probe.judge_seconds
    steps = config.iterations * math.ceil(config.population / propose.optimizer_concurrency)
    step = max(STEP_OVERHEAD_SECONDS, probe.replay_seconds)  # an optimizer is a process too
    high = PROBE_MARGIN * (math.ceil(replays / parallel) * unit + steps * step)
    high += RUN_OVERHEAD_SECONDS
    if config.wall_clock_budget is not None:
        cap = config.wall_clock_budget + config.commands.kill_grace + 1.0
        low, high = min(low, config.wall_clock_budget), min(high, cap)  # it stops at the budget
    return low, high


def _free_cpus() -> int:
    """The CPUs this process may use, or 1 when the host is already busier than that (a
    load average at or over the CPU count: the lanes will not run side by side)."""
    cpus = len(os.sched_getaffinity(0))
    return 1 if os.getloadavg()[0] >= cpus else cpus


def _role_spend(history: UnitHistory, counts: dict[str, int]) -> dict[str, Usage]:
    """Each role's expected spend: its per-unit (per-call) spend times its count."""
    spend = {}
    for role, count in counts.items():
        unit = history.by_role.get(role)
        if unit is None:
            continue
        tokens = unit.tokens * count if unit.tokens is not None else None
        cost = unit.cost_usd * count if unit.cost_usd is not None else None
        spend[role] = Usage(tokens=tokens, cost_usd=cost)
    return spend


def _total(by_role: dict[str, Usage], dimension: str) -> float | None:
    values = [getattr(usage, dimension) for usage in by_role.values()]
    known = [value for value in values if value is not None]
    return sum(known) if known else None


def per_unit_by_role(
    report: dict[str, Any], units: int, config: CampaignConfig
) -> dict[str, Usage]:
    """A report's spend by role, per replay unit (per proposal for the optimizer), for the
    roles whose command ``config`` runs as the report's run did (`_same_command`)."""
    by_stage = report.get("budget", {}).get("spent_by_stage", {})
    proposals = max(1, len(report.get("funnel", [])))
    from evolane.measure import ROLES  # the budget's module (trio)

    per_role = {}
    for role in ROLES:
        spent = by_stage.get(role)
        if not isinstance(spent, dict) or not _same_command(report, config, role):
            continue
        count = proposals if role == "optimizer" else units
        values = {d: spent.get(d) for d in ("tokens", "cost_usd")}
        per_role[role] = Usage(
            **{d: v / count if isinstance(v, int | float) else None for d, v in values.items()}
        )
    return per_role


def _same_command(report: dict[str, Any], config: CampaignConfig, role: str) -> bool:
    """Whether ``config`` runs ``role`` as the run of ``report`` did: another judge or
    optimizer spends otherwise (found by README review: after runs with a free judge, a
    model judge's estimate said ``--max-cost-usd $20.00 covers this run's ~$0.00``)."""
    ran = report.get("config", {})
    if role == "judge":
        samples = ran.get("judge_samples", 1) == config.models.judge_samples
        return samples and ran.get("judge") == config.measure.judge
    if role == "optimizer":
        return ran.get("optimizer") == config.propose.optimizer
    return True  # the replay: a report is read only when its replay is this run's
