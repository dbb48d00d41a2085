"""The measurement's settings, each knob declared once, and the one place that derives the
scheduler's and the lanes' settings from them (plus the per-run context that is not settings).

`CampaignConfig` composes `MeasureSettings` and `CommandSettings`; a standalone pipeline
(tests, benchmarks, stress) takes them as they are.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Literal, cast
from urllib.parse import urlsplit

from pydantic import AfterValidator, Field, field_validator
from pydantic.json_schema import SkipJsonSchema

from evolane.inputs import (
    JUDGE_PLACEHOLDERS,
    OPTIMIZER_PLACEHOLDERS,
    REPLAY_PLACEHOLDERS,
    CommandTemplate,
    PriceTable,
    llm_model,
)
from evolane.measure._limits import CommandLimits
from evolane.messages import (
    ArtifactRef,
    MeasureEvent,
    Record,
    ReplayRecord,
    ShortText,
    Text,
    UnitEvent,
    UnitRecord,
)
from evolane.sandbox import (
    ENV_NAME_PATTERN,
    MAX_HIDDEN,
    EnvName,
    Isolation,
    View,
)

if TYPE_CHECKING:  # what a run's lanes and scheduler need (trio) loads where they are made
    from evolane.lanes import Backend, LaneSettings, OptimizerSettings
    from evolane.measure._journal import RunJournal
    from evolane.measure._scheduling import SchedulerSettings
    from evolane.store import TreeLimits

PathText = Annotated[str, Field(min_length=1, max_length=4096)]
MAX_TIMEOUT = 86_400.0
"""The longest deadline a setting accepts for one command (a day): longer is a typo."""
CommandRole = Literal["replay", "judge", "optimizer", "validator", "check"]
"""The commands of a run, by the flag that gives each; a grant (``--pass-env``,
``--expose``, ``--expose-rw``) written ``ROLE=VALUE`` reaches that role's commands only."""
COMMAND_ROLES: tuple[CommandRole, ...] = ("replay", "judge", "optimizer", "validator", "check")


def split_grant(text: str) -> tuple[CommandRole | None, str]:
    """``ROLE=VALUE`` as (ROLE, VALUE), anything else as (None, ``text``): every command's.
    What comes before the first ``=`` is a role unless it holds a ``/`` (``./a=b`` is a
    path); `ValueError` when it is no role (`COMMAND_ROLES`) or VALUE is empty."""
    head, sep, value = text.partition("=")
    if not sep or "/" in head:
        return None, text
    if head not in COMMAND_ROLES:
        raise ValueError(f"{head!r} is no command's role: choose from {', '.join(COMMAND_ROLES)}")
    if not value:
        raise ValueError(f"nothing given for {head}")
    return cast(CommandRole, head), value


def granted_to(role: CommandRole, grants: tuple[str, ...]) -> tuple[str, ...]:
    """The values of ``grants`` (``[ROLE=]VALUE`` each) that reach ``role``'s commands."""
    chosen = (split_grant(grant) for grant in grants)
    return tuple(dict.fromkeys(value for to, value in chosen if to in (None, role)))


def _known_role(text: str) -> str:
    split_grant(text)  # a ValueError is pydantic's error
    return text


GrantedName = Annotated[
    str,
    Field(pattern=f"^(?:(?:{'|'.join(COMMAND_ROLES)})=)?{ENV_NAME_PATTERN}$", max_length=140),
]
"""A variable's name, for every command (``NAME``) or one role's (``ROLE=NAME``)."""
GrantedPath = Annotated[str, Field(min_length=1, max_length=4096), AfterValidator(_known_role)]
"""A host path, for every command (``PATH``) or one role's (``ROLE=PATH``)."""


class CommandSettings(CommandLimits):
    """How every command of a run is run in the sandbox: replays, judges, the optimizer,
    the validator gate and the apply check (their resource limits: `CommandLimits`)."""

    kill_grace: float = Field(default=2.0, ge=0, le=600)
    """Seconds between SIGTERM and SIGKILL when a command's process tree is stopped."""
    isolation: Isolation = "auto"
    """How every command is confined: ``confined`` (a bubblewrap view; refuses to run
    without it), ``auto`` (confined where possible, else weaker with a warning),
    ``process``; ``namespace`` (pid and network namespaces only) is kept for old runs."""
    pass_env: tuple[GrantedName, ...] = Field(default=(), max_length=64)
    """Environment variables a command may see (evolane's own are never passed on), by
    name, ``ROLE=NAME`` for one role's commands (`COMMAND_ROLES`), ``NAME`` for every
    command: a value that is no variable's name (a key given in its place) is refused
    before the run (found by review: it was stored in run.json, and every command failed
    to start)."""
    network: bool = False
    """Whether every confined command may use the network (``--network``: an agent that
    calls an LLM API needs it)."""
    network_for: tuple[CommandRole, ...] = Field(default=(), max_length=len(COMMAND_ROLES))
    """The roles whose confined commands may use the network (``--network-for ROLE``): a
    coding-agent optimizer's, and no replay running a candidate's code (found by review:
    ``--network`` had no role, so every replay and judge reached what the optimizer did)."""
    host_network_for: tuple[CommandRole, ...] = Field(default=(), max_length=len(COMMAND_ROLES))
    """The roles whose confined commands share the host's network namespace (``--host-
    network-for ROLE``): an agent calling a model server on the host's loopback. The
    network of `network_for` is a namespace of the command's own behind an outbound NAT,
    where no loopback service of the host is reached."""
    expose: tuple[GrantedPath, ...] = Field(default=(), max_length=64)
    """Host paths a confined command is shown read-only besides those its template names
    (``ROLE=PATH``: one role's commands only; ``PATH``: every command)."""
    expose_rw: tuple[GrantedPath, ...] = Field(default=(), max_length=64)
    """Host paths a confined command may write (``ROLE=PATH`` or ``PATH``, as `expose`)."""
    hidden: SkipJsonSchema[tuple[PathText, ...]] = Field(
        default=(), max_length=MAX_HIDDEN, exclude=True
    )
    """Paths no command may see even under an exposed folder: a campaign fills in its
    store, target and dataset or trajectory files (derived, so never stored)."""

    def passed(self, role: CommandRole) -> tuple[str, ...]:
        """The variables ``role``'s commands may see: those given for every command and
        those given for ``role`` (a coding agent's key given ``optimizer=`` reaches no
        replay: found by review, every replay could read it)."""
        return granted_to(role, self.pass_env)

    def view(self, role: CommandRole, *templates: CommandTemplate | None) -> View:
        """What a confined command of ``role`` running ``templates`` sees: the folders of
        the absolute paths the templates name and the paths exposed to every command or to
        ``role``, minus the hidden ones."""
        words = [word for template in templates if template for word in template.literal_words()]
        from evolane.sandbox import folders_to_expose, template_paths

        named = folders_to_expose(template_paths(words))
        return View(
            read_only=tuple(dict.fromkeys((*named, *granted_to(role, self.expose)))),
            read_write=granted_to(role, self.expose_rw),
            hidden=self.hidden,
            network=self.network or role in (*self.network_for, *self.host_network_for),
            host_network=role in self.host_network_for,
        )


LLMRole = Literal["judge", "optimizer"]
"""Who a built-in model backend works for (each role may have its own endpoint)."""
UnknownPrice = Literal["refuse", "reserve"]
MAX_RUBRIC_CHARS = 32 << 10


class ModelSettings(Record):
    """Models in the loop: the price table, the built-in judge's rubric and samples, and the
    endpoint of each role's built-in model backend (``--judge``/``--optimizer llm:MODEL``).
    Only the NAME of the variable holding an API key is kept, never the key."""

    prices: PriceTable | None = None
    """Dollars per million tokens per model, frozen into run.json (``--prices FILE``)."""
    unknown_price: UnknownPrice = "refuse"
    """A model with no price while ``--max-cost-usd`` is set: refuse before the run, or
    ``reserve`` (its cost is unknown, charged at least its reservation)."""
    rubric: Annotated[str, Field(max_length=MAX_RUBRIC_CHARS)] | None = None
    """The built-in judge's rubric, as read from ``--rubric FILE`` (frozen with the run)."""
    judge_samples: int = Field(default=1, ge=1, le=16)
    """Answers the built-in judge averages per judgement."""
    llm_base_url: dict[LLMRole, ShortText] = Field(default_factory=dict, max_length=2)
    llm_api_key_env: dict[LLMRole, EnvName] = Field(default_factory=dict, max_length=2)
    llm_temperature: dict[LLMRole, Annotated[float, Field(ge=0, le=2)]] = Field(
        default_factory=dict, max_length=2
    )
    llm_max_tokens: dict[LLMRole, Annotated[int, Field(ge=1, le=1_000_000)]] = Field(
        default_factory=dict, max_length=2
    )
    llm_timeout: dict[LLMRole, Annotated[float, Field(gt=0, le=MAX_TIMEOUT)]] = Field(
        default_factory=dict, max_length=2
    )
    """Seconds per request (always cut at the phase's own deadline)."""
    llm_retries: dict[LLMRole, Annotated[int, Field(ge=0, le=10)]] = Field(
        default_factory=dict, max_length=2
    )
    llm_cache: bool = False
    """Answer repeated requests from a response cache in the store (development runs)."""

    @field_validator("llm_base_url")
    @classmethod
    def _plain_urls(cls, value: dict[str, str]) -> dict[str, str]:
        """http(s) URLs without a user or password, a query or a fragment (they would be
        stored: a key belongs in the variable ``--llm-api-key-env`` names; and the SDK puts
        a query before the request's path, so that every call failed: found by review)."""
        for url in value.values():
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"{url!r} is not an http(s) URL")
            if parts.username is not None or parts.password is not None:
                raise ValueError(
                    "a URL with a user or password would be stored: name the variable "
                    "holding the key with --llm-api-key-env"
                )
            if parts.query or parts.fragment or "?" in url or "#" in url:
                raise ValueError(
                    "a URL with a query or fragment ('?', '#') would be stored, and the SDK "
                    "puts it before the request's path: give the base URL alone, the key in "
                    "the variable --llm-api-key-env names"
                )
        return value


class MeasureSettings(Record):
    """How a run measures: the replay and judge commands, how many lanes run them, their
    deadlines, how often a judge that failed is asked again, and where replays run."""

    replay: Text
    """The replay command template (``{case_file}``, ``{candidate}``, ``{output_dir}``...)."""
    judge: Text | None = None
    """The judge command template; None: exact match against ``expected_output``."""
    replay_concurrency: int = Field(default=4, ge=1, le=256)
    judge_concurrency: int = Field(default=2, ge=1, le=256)
    replay_timeout: float = Field(default=600.0, gt=0, le=MAX_TIMEOUT)
    judge_timeout: float = Field(default=120.0, gt=0, le=MAX_TIMEOUT)
    judge_failure_retries: int = Field(default=2, ge=0, le=20)
    cluster: ShortText = "local"
    """Where replay lanes run: ``local``, ``local:N`` or ``dask://HOST:PORT``."""

    @field_validator("cluster")
    @classmethod
    def _known_cluster(cls, value: str) -> str:
        """``local``, ``local:N`` or ``dask://HOST:PORT`` (whether Dask is installed is
        checked when a run starts, so a stored run stays readable without it)."""
        from evolane.distributed import parse_cluster

        parse_cluster(value)  # a ClusterError is a ValueError: pydantic reports it
        return value


@dataclass(frozen=True)
class MeasureContext:
    """What one run's measurement works with that is not settings: where finished units are
    journaled, what an interrupted run's journal restored, who hears progress, and the
    in-process backends that stand in for the replay and judge commands."""

    journal: RunJournal | None = None
    restored: Mapping[str, UnitRecord] = field(default_factory=dict)  # by unit id
    restored_replays: Mapping[str, ReplayRecord] = field(default_factory=dict)  # judged next
    earlier: Mapping[bytes, UnitRecord | ReplayRecord] = field(default_factory=dict)  # by key
    on_progress: Callable[[MeasureEvent], object] | None = None  # a progress bus's publish
    on_unit: Callable[[UnitEvent], object] | None = None  # hears each unit that ended
    rejudge: bool = False  # --rerun-evaluator: stored replays are judged again, nothing replayed
    replay_backend: Backend | None = None
    judge_backend: Backend | None = None


@dataclass(frozen=True)
class CaseRefs:
    """The dataset as lanes see it: every case stored without its answers (for replays) and
    with them (for judges), and the case ids of each split."""

    replay: Mapping[str, ArtifactRef]
    judge: Mapping[str, ArtifactRef]
    splits: dict[str, tuple[str, ...]]
    clusters: Mapping[str, str] = field(default_factory=dict)
    """Per case id, the cluster it names (`inputs.case_clusters`); the others are their own."""


def scheduler_settings(
    cases: CaseRefs,
    context: MeasureContext,
    *,
    settings: MeasureSettings,
    fingerprint: str,
    seed: int,
    min_cases: int,
) -> SchedulerSettings:
    """The scheduler's settings: read from the settings models here and nowhere else."""
    from evolane.measure._scheduling import SchedulerSettings

    return SchedulerSettings(
        case_refs=cases.replay,
        judge_case_refs=cases.judge,
        splits=cases.splits,
        clusters=cases.clusters,
        fingerprint=fingerprint,
        replay_timeout=settings.replay_timeout,
        judge_timeout=settings.judge_timeout,
        min_cases=min_cases,
        seed=seed,
        journal=context.journal,
        restored=context.restored,
        restored_replays=context.restored_replays,
        earlier=context.earlier,
        on_progress=context.on_progress,
        on_unit=context.on_unit,
        rejudge=context.rejudge,
        replays_allowed=not context.rejudge,
        judge_costs=settings.judge is not None or context.judge_backend is not None,
    )


def lane_settings(
    settings: MeasureSettings,
    commands: CommandSettings,
    context: MeasureContext,
    prices: PriceTable | None = None,
) -> tuple[LaneSettings, LaneSettings]:
    """The replay lanes' and the judge lanes' settings (templates parsed: bad ones raise);
    usage documents are priced by ``prices``. A judge ``llm:MODEL`` and a plugin spec
    (``NAME:ARGS``, `evolane.lanes.plugin_spec`) have no template: the context's backend
    stands in for them."""
    from evolane.lanes import LaneSettings, plugin_spec

    replay = None
    if plugin_spec(settings.replay, "replay") is None:
        replay = CommandTemplate.parse(settings.replay, role="replay", allowed=REPLAY_PLACEHOLDERS)
    judge = None
    if (
        settings.judge
        and llm_model(settings.judge, "--judge") is None
        and plugin_spec(settings.judge, "judge") is None
    ):
        judge = CommandTemplate.parse(settings.judge, role="judge", allowed=JUDGE_PLACEHOLDERS)
    sandbox = {
        "kill_grace": commands.kill_grace,
        "isolation": commands.isolation,
        "limits": commands.sandbox_limits(),
        "prices": prices,
    }
    return (
        LaneSettings(
            template=replay,
            backend=context.replay_backend,
            pass_env=commands.passed("replay"),
            view=commands.view("replay", replay),
            **sandbox,
        ),
        LaneSettings(
            template=judge,
            pass_env=commands.passed("judge"),
            view=commands.view("judge", judge),
            retries=settings.judge_failure_retries,
            backend=context.judge_backend,
            **sandbox,
        ),
    )


def optimizer_settings(
    optimizer: str,
    commands: CommandSettings,
    backend: Backend | None = None,
    tree_limits: TreeLimits | None = None,
    prices: PriceTable | None = None,
) -> OptimizerSettings:
    """The optimizer lanes' settings for the command ``optimizer`` (parsed: a bad one raises),
    the coding-agent preset ``agent:NAME`` (resolved on PATH: `resolve_agent`) or
    ``llm:MODEL`` or a plugin's ``NAME:ARGS`` (no template: its ``backend`` stands in);
    ``tree_limits`` caps the workdir's walk (default: `TreeLimits()`)."""
    from evolane.lanes import OptimizerSettings, is_agent_spec, plugin_spec, resolve_agent
    from evolane.store import TreeLimits

    agent = resolve_agent(optimizer) if is_agent_spec(optimizer) else None
    template = None
    if agent is not None:
        template = agent.template()
    elif llm_model(optimizer, "--optimizer") is None and not plugin_spec(optimizer, "optimizer"):
        template = CommandTemplate.parse(
            optimizer, role="optimizer", allowed=OPTIMIZER_PLACEHOLDERS
        )
    return OptimizerSettings(
        template=template,
        agent=agent,
        kill_grace=commands.kill_grace,
        pass_env=commands.passed("optimizer"),
        isolation=commands.isolation,
        view=commands.view("optimizer", template),
        limits=commands.sandbox_limits(),
        backend=backend,
        tree_limits=tree_limits or TreeLimits(),
        prices=prices,
    )
