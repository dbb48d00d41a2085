"""Models and plugins in the loop, as a run uses them: the built-in model backends a config
names (``--judge llm:MODEL``, ``--optimizer llm:MODEL``) with each role's endpoint, the check
that every model evolane will call has a price when a cost ceiling is set, and the plugin
backends a config names (``--replay/--judge/--optimizer NAME:ARGS``, `evolane.lanes.
plugin_spec`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from evolane.distributed import parse_cluster
from evolane.inputs import InputError, llm_model, plugin_words
from evolane.lanes import (
    BACKEND_GROUPS,
    LLM_EXTRA_HINT,
    Backend,
    Endpoint,
    ModelError,
    PluginSpec,
    api_key,
    check_plugin,
    llm_available,
    llm_judge,
    llm_optimizer,
    plugin_backend,
    plugin_spec,
)
from evolane.measure import ModelSettings

if TYPE_CHECKING:
    from evolane.campaign._config import CampaignConfig

LLM_CACHE_FOLDER = "llm-cache"
"""The response cache's folder in the store (``--llm-cache``)."""


def llm_models(config: CampaignConfig) -> dict[str, str]:
    """The models a run calls itself, by flag (``--judge``, ``--optimizer``)."""
    named = {
        "--judge": llm_model(config.measure.judge, "--judge"),
        "--optimizer": llm_model(config.propose.optimizer, "--optimizer"),
    }
    return {flag: model for flag, model in named.items() if model is not None}


def check_models(config: CampaignConfig) -> None:
    """Refuse (`InputError`, exit 2) what cannot run: a model judge without a rubric, a model
    without the ``evolane[llm]`` extra or without its API key, and a model with no price
    while ``--max-cost-usd`` is set (unless ``--unknown-price reserve``)."""
    models = config.models
    named = llm_models(config)
    if "--judge" in named and not models.rubric:
        raise InputError(f"--judge {config.measure.judge}: a model judge needs --rubric FILE")
    for flag, model in named.items():  # a missing key: now, not after the replays ran
        if not llm_available():  # nor a missing SDK (it failed every call, exit 1)
            raise InputError(f"{flag} llm:{model}: {LLM_EXTRA_HINT}")
        role = flag.removeprefix("--")
        try:
            api_key(endpoint(models, role, model, config.store))
        except ModelError as error:
            raise InputError(f"{flag} llm:{model}: {error}") from None
    if config.max_cost_usd is None or models.unknown_price == "reserve":
        return
    for flag, model in named.items():
        if models.prices is None or models.prices.get(model) is None:
            raise InputError(
                f"{flag} llm:{model}: no price for model {model!r} (--prices FILE) while "
                "--max-cost-usd is set; add it, or pass --unknown-price reserve"
            )


def model_warnings(config: CampaignConfig) -> list[str]:
    """What a person must know before the run: a model evolane calls with no price while
    ``--max-cost-usd`` is set (allowed by ``--unknown-price reserve``) spends unseen dollars."""
    if config.max_cost_usd is None:
        return []
    prices = config.models.prices
    return [
        f"{flag} llm:{model} has no price: its dollars are unknown and only what earlier "
        "units reported is charged for it; bound it with --max-tokens"
        for flag, model in llm_models(config).items()
        if prices is None or prices.get(model) is None
    ]


def endpoint(models: ModelSettings, role: str, model: str, store: str) -> Endpoint:
    """``role``'s endpoint for ``model``: its flags (``--llm-base-url judge=...``), the
    response cache under the store when ``--llm-cache``."""
    settings: dict[str, Any] = {"model": model}
    for field, values in (
        ("base_url", models.llm_base_url),
        ("api_key_env", models.llm_api_key_env),
        ("temperature", models.llm_temperature),
        ("max_tokens", models.llm_max_tokens),
        ("timeout", models.llm_timeout),
        ("retries", models.llm_retries),
    ):
        value = values.get(role)  # type: ignore[call-overload]
        if value is not None:
            settings[field] = value
    if models.llm_cache:
        settings["cache_dir"] = Path(store) / LLM_CACHE_FOLDER
    return Endpoint(**settings)


def model_backends(config: CampaignConfig) -> tuple[Backend | None, Backend | None]:
    """The built-in (judge, optimizer) backends ``config`` names (None: a command)."""
    named = llm_models(config)
    models = config.models
    judge = optimizer = None
    if "--judge" in named:
        judge_point = endpoint(models, "judge", named["--judge"], config.store)
        judge = llm_judge(judge_point, models.rubric or "", models.judge_samples)
    if "--optimizer" in named:
        optimizer = llm_optimizer(endpoint(models, "optimizer", named["--optimizer"], config.store))
    return judge, optimizer


def role_values(config: CampaignConfig) -> dict[str, str | None]:
    """The value of each role that may name a plugin (``replay``, ``judge``, ``optimizer``)."""
    return {
        "replay": config.measure.replay,
        "judge": config.measure.judge,
        "optimizer": config.propose.optimizer,
    }


def plugin_specs(config: CampaignConfig) -> dict[str, PluginSpec]:
    """The plugins ``config`` names, by role (``replay``, ``judge``, ``optimizer``)."""
    named = {role: plugin_spec(value, role) for role, value in role_values(config).items()}
    return {role: spec for role, spec in named.items() if spec is not None}


def with_recorded_plugins(config: CampaignConfig) -> CampaignConfig:
    """``config`` recording which of its roles name an installed plugin (its ``plugins``),
    as a new run freezes it into run.json."""
    named = {role: spec.name for role, spec in plugin_specs(config).items()}
    return config.model_copy(update={"plugins": named})


def check_recorded_plugins(
    config: CampaignConfig,
    flag: str,
    roles: tuple[str, ...] = ("replay", "judge", "optimizer"),
    recorded: Mapping[str, str] | None = None,
) -> None:
    """Refuse (`InputError`, exit 2, before any spend) to continue stored work (``flag``:
    ``--resume RUN_ID``...) when one of ``roles`` recorded as a plugin (``recorded``, by
    default ``config.plugins``) still names it but that plugin is no longer installed: the
    value would otherwise be read as a command template and every call of the role fail.
    A role whose value names another plugin or a command since (a re-judge's new
    ``--judge``) follows the usual rule."""
    values = role_values(config)
    for role, name in (config.plugins if recorded is None else recorded).items():
        words = plugin_words(values.get(role))
        if role not in roles or words is None or words[0] != name:
            continue
        if plugin_spec(values[role], role) is None:
            raise InputError(
                f"{flag}: the run's --{role} {values[role]} names the plugin {name!r}, which is "
                f"not installed (entry-point group {BACKEND_GROUPS[role]}); install it to go on"
            )


def check_plugins(config: CampaignConfig) -> None:
    """Refuse (`InputError`, exit 2) a plugin that does not load, and a plugin replay on a
    Dask cluster (Dask workers run replay commands, not in-process backends)."""
    specs = plugin_specs(config)
    for spec in specs.values():
        check_plugin(spec)
    replay = specs.get("replay")
    if replay is not None and parse_cluster(config.measure.cluster).uses_dask:
        raise InputError(
            f"{replay.where}: an in-process replay backend runs on --cluster local only"
        )


def plugin_backends(config: CampaignConfig) -> dict[str, Backend]:
    """The plugin backends ``config`` names, by role, each factory called once for this
    run (`evolane.lanes.plugin_backend`: a factory that raises is a `PluginError`)."""
    return {role: plugin_backend(spec) for role, spec in plugin_specs(config).items()}
