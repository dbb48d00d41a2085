"""`CampaignConfig` composes one settings model per concern and is read and written flat: the
CLI's keywords and the ``run.json`` of older stores load as they are, and what it writes (and
its JSON Schema) is the flat shape those stores hold."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError

from evolane.campaign import CampaignConfig, ProposeSettings, Report, RunRecord
from evolane.measure import CommandSettings, MeasureSettings, ModelSettings

DIGEST = "sha256:" + "ab" * 32

OLD_RUN_JSON: dict[str, Any] = {  # a run.json as evolane wrote it before the settings models
    "run_id": "r-20260101-000000-abcd",
    "campaign_id": "c-20260101-000000-abcd",
    "cycle": 0,
    "created": 1767225600.0,
    "config": {
        "target": "/work/skill",
        "dataset": "/work/dataset.jsonl",
        "store": "/work/.evolane",
        "replay": "agent --case {case_file} --out {output_dir}",
        "judge": "grade {case_file} {output_dir}",
        "optimizer": "improve {workdir} {prompt_file}",
        "validator": None,
        "check": None,
        "apply": "proposal",
        "iterations": 5,
        "population": 3,
        "max_improvement_cycles": 1,
        "stall": 4,
        "replay_concurrency": 6,
        "judge_concurrency": 3,
        "optimizer_concurrency": 1,
        "replay_timeout": 300.0,
        "judge_timeout": 60.0,
        "optimizer_timeout": 900.0,
        "optimizer_idle": 90.0,
        "kill_grace": 0.5,
        "wall_clock_budget": 3600.0,
        "max_tokens": None,
        "max_cost_usd": 2.5,
        "baseline_replay_repetitions": None,
        "candidate_replay_repetitions": None,
        "judge_failure_retries": 1,
        "gate": {"gate": "paired", "k_se": 1.0, "min_cases": 8, "seed": 0},
        "focus": "all",
        "protected": ["grader/**"],
        "required_files": [],
        "max_growth_bytes": 65536,
        "screening": False,
        "isolation": "process",
        "cluster": "local",
        "pass_env": ["OPENAI_API_KEY"],
        "seed": 7,
        "campaign_id": "c-20260101-000000-abcd",
        "example": None,
    },
    "dataset_digest": "ab" * 32,
    "seed_ref": {"digest": DIGEST, "size": 10, "media_type": "application/json"},
    "parent_ref": {"digest": DIGEST, "size": 10, "media_type": "application/json"},
    "status": "interrupted",
    "resumed": 1,
    "elapsed_seconds": 12.5,
}


def _minimal(**values: Any) -> CampaignConfig:
    return CampaignConfig(target="t", dataset="d", replay="r", optimizer="o", **values)


def test_an_old_flat_run_json_loads_into_the_settings_models() -> None:
    record = RunRecord.model_validate(OLD_RUN_JSON)
    config = record.config
    assert config.measure == MeasureSettings(
        replay="agent --case {case_file} --out {output_dir}",
        judge="grade {case_file} {output_dir}",
        replay_concurrency=6,
        judge_concurrency=3,
        replay_timeout=300.0,
        judge_timeout=60.0,
        judge_failure_retries=1,
        cluster="local",
    )
    no_limits = dict.fromkeys(("max_procs", "max_memory", "max_file_size", "max_open_files"))
    assert config.commands == CommandSettings(  # it ran before the command limits: none
        kill_grace=0.5, isolation="process", pass_env=("OPENAI_API_KEY",), **no_limits
    )
    assert config.propose == ProposeSettings(
        optimizer="improve {workdir} {prompt_file}",
        optimizer_concurrency=1,
        optimizer_timeout=900.0,
        optimizer_idle=90.0,
    )
    assert (config.iterations, config.population, config.seed) == (5, 3, 7)
    assert config.feedback_split == "val"  # what a run before honest splits fed back
    written = record.model_dump(mode="json")  # what run.json holds after a resume rewrites it
    assert config.error_control == "legacy"  # no key: it ran without online control
    assert written["config"] == {
        **OLD_RUN_JSON["config"],
        "gate": config.gate.model_dump(),
        "feedback_split": "val",
        "error_control": "legacy",
        **no_limits,
        "network": False,  # confinement's settings, at their defaults
        "network_for": [],
        "host_network_for": [],
        "expose": [],
        "expose_rw": [],
        **ModelSettings().model_dump(mode="json"),  # models in the loop: none, no prices
        "plugins": {},  # no role recorded as a plugin: each value as it was written
    }
    assert RunRecord.model_validate_json(record.model_dump_json()) == record


def test_flat_keywords_set_the_models_and_defaults_are_declared_once() -> None:
    config = _minimal(replay_timeout=5.0, kill_grace=0.1, optimizer_concurrency=3)
    assert config.measure.replay_timeout == 5.0
    assert config.commands.kill_grace == 0.1
    assert config.propose.optimizer_concurrency == 3
    defaults = _minimal()
    assert defaults.measure == MeasureSettings(replay="r")
    assert defaults.commands == CommandSettings()
    assert defaults.propose == ProposeSettings(optimizer="o")
    owners: dict[str, str] = {}
    for part in (CampaignConfig, MeasureSettings, CommandSettings, ProposeSettings):
        for name in part.model_fields:
            if name not in CampaignConfig.parts:
                assert name not in owners, f"{name} is declared by {owners[name]} and {part}"
                owners[name] = part.__name__


def test_an_invalid_value_is_named_by_its_flat_key() -> None:
    with pytest.raises(ValidationError) as raised:
        _minimal(replay_timeout=0)
    assert [e["loc"] for e in raised.value.errors()] == [("replay_timeout",)]
    with pytest.raises(ValidationError) as raised:
        CampaignConfig(target="t", dataset="d", optimizer="o", cluster="nowhere")
    assert {e["loc"] for e in raised.value.errors()} == {("replay",), ("cluster",)}
    broken = {**OLD_RUN_JSON, "config": {**OLD_RUN_JSON["config"], "kill_grace": -1}}
    with pytest.raises(ValidationError) as raised:
        RunRecord.model_validate(broken)
    assert [e["loc"] for e in raised.value.errors()] == [("config", "kill_grace")]


def test_a_copy_takes_flat_keys_or_whole_models_but_not_both() -> None:
    config = _minimal()
    assert config.model_copy(update={"judge": "j", "cluster": "local:2"}).measure == (
        MeasureSettings(replay="r", judge="j", cluster="local:2")
    )
    faster = config.model_copy(update={"commands": CommandSettings(kill_grace=0.2)})
    assert faster.commands.kill_grace == 0.2 and faster.measure == config.measure
    with pytest.raises(ValidationError, match="whole or as its flat keys"):
        CampaignConfig(
            target="t",
            dataset="d",
            optimizer="o",
            measure=MeasureSettings(replay="r"),
            replay_timeout=3.0,
        )


def test_the_report_schema_shows_the_config_flat() -> None:
    schema = Report.model_json_schema()
    config = schema["$defs"]["CampaignConfig"]
    every = {"error_budget": 0.01, "test_budget": "store", "max_procs_asked": 512}  # when set
    flat = set(_minimal(from_trajectory=("t.jsonl",), **every).model_dump())  # every key
    assert set(config["properties"]) == flat
    assert set(config["required"]) == {"target", "replay", "optimizer"}  # dataset: or trajectories
    assert not {"MeasureSettings", "CommandSettings", "ProposeSettings"} & set(schema["$defs"])
