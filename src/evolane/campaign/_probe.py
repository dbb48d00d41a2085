"""The one-case probe of ``evolane doctor`` and ``evolane estimate --probe``: the request
checked as a dry run checks it, then the parent's replay and its judge run on ONE val case
through the real sandbox and lanes (the same settings, confinement and limits a campaign's
units get), timed, with the replay's output and the judge's verdict kept for showing.

Nothing is written but blobs in the store (the target's snapshot, the case, the outputs)
and the sandbox's own scratch, removed when it closes.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from evolane.campaign._config import CampaignConfig
from evolane.campaign._estimate import Estimate, ProbeTiming, with_probe
from evolane.campaign._models import model_backends, plugin_backends
from evolane.campaign._prepare import Prepared, prepare_run
from evolane.inputs import Case, case_json
from evolane.lanes import JudgeLane, ReplayLane
from evolane.measure import MeasureContext, lane_settings
from evolane.messages import ArtifactRef, JudgeJob, JudgeResult, ReplayJob, ReplayResult
from evolane.sandbox import SandboxHost, open_sandbox, resolve_isolation
from evolane.store import BlobStore, load_manifest

EXCERPT_BYTES = 400
"""Bytes of the replay's output, stderr and the judge's verdict kept for showing."""


@dataclass(frozen=True)
class HostReport:
    """What this host gives a run: the isolation level in force, why it is weaker than asked
    (None when it is not), and the host's kill/limit mechanisms."""

    isolation: str
    problem: str | None
    mechanisms: tuple[str, ...]
    cgroups: tuple[str, ...]
    confinable: str | None
    """Why ``confined`` cannot be had here (None: it can), whatever was asked."""


@dataclass(frozen=True)
class CaseProbe:
    """One val case, replayed on the parent's tree and judged: statuses, times, excerpts."""

    case_id: str
    replay: ReplayResult
    judge: JudgeResult | None
    output: str
    stderr: str
    verdict: str

    @property
    def ok(self) -> bool:
        """Both ran, and the judge gave a score."""
        return self.judge is not None and self.judge.score is not None

    @property
    def timing(self) -> ProbeTiming:
        """The replay's and the judge's wall seconds (the judge's 0 when it did not run)."""
        judge = self.judge.wall_seconds if self.judge is not None else 0.0
        return ProbeTiming(replay_seconds=self.replay.wall_seconds, judge_seconds=judge)


@dataclass(frozen=True)
class Probe:
    """The checked request (its dry-run estimate), the host, and the one-case probe, with
    the estimate redone from the probe's timing."""

    prepared: Prepared
    host: HostReport
    case: CaseProbe
    estimate: Estimate


async def probe_run(config: CampaignConfig, resume_campaign: str | None = None) -> Probe:
    """Check ``config`` as a dry run does (`InputError` on bad input), then replay and judge
    one val case of the parent (the seed, or the campaign's best) in the real sandbox."""
    prepared = await trio.to_thread.run_sync(prepare_run, config, None, resume_campaign)
    parent = prepared.campaign.best_ref
    case = prepared.dataset.by_id(prepared.dataset.split_ids("val")[0])
    store = prepared.store
    async with open_sandbox(prepared.layout.sandbox, store=store) as host:
        level, problem = resolve_isolation(config.run_commands.isolation)
        confinable = resolve_isolation("confined")[1]
        report = HostReport(level, problem, host.mechanisms, host.cgroups.mechanisms, confinable)
        probed = await _probe_case(config, host, store, case, parent)
    # The dry run's estimate (spend from earlier runs, what the campaign used, preflight),
    # its wall drawn from the probe; found by review: redone from the counts alone, it said
    # an earlier run's spend was unknown and set each ceiling against a fresh campaign.
    estimate = with_probe(prepared.estimate, prepared.config, probed.timing)
    return Probe(prepared, report, probed, estimate)


async def _probe_case(
    config: CampaignConfig, host: SandboxHost, store: BlobStore, case: Case, tree: ArtifactRef
) -> CaseProbe:
    judge_backend, _ = model_backends(config)
    plugins = await trio.to_thread.run_sync(plugin_backends, config, abandon_on_cancel=True)
    context = MeasureContext(
        replay_backend=plugins.get("replay"), judge_backend=judge_backend or plugins.get("judge")
    )
    replay_settings, judge_settings = lane_settings(
        config.measure, config.run_commands, context, config.models.prices
    )
    refs = await trio.to_thread.run_sync(_store_case, store, case)
    measure = config.measure
    replayed = await ReplayLane(host, store, replay_settings).receive(
        ReplayJob(
            unit_id="doctor-replay",
            case_id=case.id,
            case_ref=refs[0],
            tree_ref=tree,
            arm="baseline",
            repetition=0,
            seed=config.seed,
            timeout_seconds=measure.replay_timeout,
        )
    )
    judged = None
    if replayed.output_ref is not None:
        judged = await JudgeLane(host, store, judge_settings).receive(
            JudgeJob(
                unit_id="doctor-judge",
                case_id=case.id,
                case_ref=refs[1],
                output_ref=replayed.output_ref,
                tree_ref=tree,
                seed=config.seed,
                timeout_seconds=measure.judge_timeout,
            )
        )
    texts = await trio.to_thread.run_sync(_excerpts, store, replayed, judged)
    return CaseProbe(case.id, replayed, judged, *texts)


def _store_case(store: BlobStore, case: Case) -> tuple[ArtifactRef, ArtifactRef]:
    """The case as the replay sees it (no answers) and as the judge does."""
    media = "application/json"
    return (
        store.put_bytes(case_json(case, include_answers=False), media_type=media),
        store.put_bytes(case_json(case, include_answers=True), media_type=media),
    )


def _excerpts(
    store: BlobStore, replayed: ReplayResult, judged: JudgeResult | None
) -> tuple[str, str, str]:
    """The replay's ``output.json`` (else its file list), its stderr, the judge's verdict."""
    output = ""
    if replayed.output_ref is not None:
        entries = load_manifest(store, replayed.output_ref)
        answer = entries.get("output.json")
        digest = getattr(answer, "digest", None)
        output = _text(store, digest) if digest else f"files: {', '.join(sorted(entries))}"
    stderr = _text(store, replayed.stderr_ref.digest if replayed.stderr_ref else None)
    verdict = ""
    if judged is not None and judged.detail_ref is not None:
        verdict = _text(store, judged.detail_ref.digest)
    return output, stderr, verdict


def _text(store: BlobStore, digest: str | None) -> str:
    if not digest:
        return ""
    data = store.read_bytes(digest)
    return data[:EXCERPT_BYTES].decode("utf-8", "replace").strip()
