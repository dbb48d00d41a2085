"""The frozen request of a run: every input and setting of a campaign (mirrors the CLI flags).

`CampaignConfig` composes one settings model per concern (`MeasureSettings`,
`CommandSettings`, `ProposeSettings`), each knob declared once. It is read and written flat,
as the CLI's flags and every stored ``run.json`` and ``report.json`` spell it: a flat key is
nested into its model on the way in, and the models are flattened on the way out (values,
errors and the JSON Schema alike).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import (
    Field,
    GetJsonSchemaHandler,
    ModelWrapValidatorHandler,
    SerializerFunctionWrapHandler,
    ValidationError,
    model_serializer,
    model_validator,
)
from pydantic.json_schema import JsonSchemaValue
from pydantic_core import CoreSchema, InitErrorDetails

from evolane.campaign._lock import lock_path
from evolane.inputs import (
    ALL_PLACEHOLDERS,
    CommandTemplate,
    TemplateError,
    llm_model,
    tree_program,
)
from evolane.measure import (
    MAX_TIMEOUT,
    STORED_LIMITS,
    CommandSettings,
    MeasureSettings,
    ModelSettings,
)
from evolane.messages import GateConfig, Name, Record, ShortText, Text

MAX_GROWTH_BYTES = 64 << 10
"""The default bound on how much a candidate may grow over its parent (``--max-growth-bytes``)."""
MAX_WALL_CLOCK_BUDGET = 365 * 86_400.0
"""The largest wall-clock budget a campaign accepts (a year): longer is a typo."""
MAX_CEILING = 10**15
"""The largest token or dollar ceiling a campaign accepts: what a `Usage` can count."""
ApplyPolicyName = Literal["proposal", "verified_only", "auto_verified"]
Focus = Literal["all", "cyclic", "hardest-first"]
FeedbackSplit = Literal["train", "val"]
"""The split whose results the optimizer is shown (``--feedback-split``)."""
LEGACY_FEEDBACK_SPLIT: FeedbackSplit = "val"
"""What a stored config without ``feedback_split`` ran with: runs before honest splits fed
the optimizer the val results."""
ErrorControlMode = Literal["auto", "confirm", "online", "none", "legacy"]
"""How a campaign bounds the chance that it publishes an edit with no true gain (see
`campaign._online`). ``legacy`` is not a flag value: it is what a run.json written before
the setting existed means (confirm when there are test cases, else none), so such a run
resumes as it ran."""
TestBudget = Literal["campaign", "store"]
"""Whose error budget a campaign's confirmation spends (``--test-budget``): its own alpha
(``campaign``), or a share of the test split's budget in the store (``store``,
`campaign._test_budget`), shared by every ``store`` campaign on the same test cases."""
PluginRole = Literal["replay", "judge", "optimizer"]
"""A role whose value may name a plugin (``--replay/--judge/--optimizer NAME:ARGS``)."""


class ProposeSettings(Record):
    """How the campaign proposes candidates: the optimizer command, how many run at once,
    and the bounds of one proposal."""

    optimizer: Text
    """The optimizer command template (``{workdir}``, ``{prompt_file}``, ``{seed}``...), or
    ``llm:MODEL`` for the built-in model optimizer."""
    optimizer_concurrency: int = Field(default=2, ge=1, le=64)
    optimizer_timeout: float = Field(default=600.0, gt=0, le=MAX_TIMEOUT)
    """The deadline of one proposal, in seconds."""
    optimizer_idle: float = Field(default=120.0, gt=0, le=MAX_TIMEOUT)
    """A proposal that prints nothing for this long is stopped."""


class CampaignConfig(Record):
    """Everything a run needs; stored as ``runs/<id>/run.json`` so a resume runs the same."""

    # Read and written flat: see the module docstring.
    parts: ClassVar[Mapping[str, type[Record]]] = {
        "measure": MeasureSettings,
        "commands": CommandSettings,
        "propose": ProposeSettings,
        "models": ModelSettings,
    }

    target: Text
    dataset: Text | None = None
    """The JSONL cases; for a run from trajectories, the cases derived from them (stored
    content-addressed under ``STORE/trajectories/``, so a resume replays exactly those)."""
    from_trajectory: tuple[Text, ...] = Field(default=(), max_length=256)
    """Trajectory files or folders to derive the cases from (instead of ``dataset``)."""
    group: Name | None = None
    """The task family of the trajectories to run on (default: the largest with failures)."""
    store: Text = ".evolane"
    measure: MeasureSettings
    commands: CommandSettings = CommandSettings()
    propose: ProposeSettings
    models: ModelSettings = ModelSettings()
    validator: Text | None = None  # malformed gate: exit 0 = well formed
    check: Text | None = None  # post-apply check for auto_verified
    apply: ApplyPolicyName = "proposal"
    iterations: int = Field(default=8, ge=1, le=10_000)
    population: int = Field(default=2, ge=1, le=64)
    max_improvement_cycles: int = Field(default=1, ge=1, le=10_000)
    stall: int = Field(default=4, ge=1, le=10_000)
    wall_clock_budget: float | None = Field(default=None, gt=0, le=MAX_WALL_CLOCK_BUDGET)
    max_tokens: int | None = Field(default=None, ge=0, le=MAX_CEILING)
    max_cost_usd: float | None = Field(default=None, ge=0, le=MAX_CEILING)
    baseline_replay_repetitions: int | None = Field(default=None, ge=1, le=100)
    candidate_replay_repetitions: int | None = Field(default=None, ge=1, le=100)
    gate: GateConfig = GateConfig()
    error_control: ErrorControlMode = "auto"
    """``confirm`` the best on the test split, ``online`` (alpha = 1 - confidence spent over
    the candidates), ``none``; ``auto``: confirm when the dataset has test cases, else online."""
    error_budget: float | None = Field(default=None, gt=0.0, lt=1.0)
    """The campaign's error budget alpha when it is not 1 - confidence (None): set by
    evolane, not a flag. An online job of the evolve service gets its share of the service's
    budget for its target (`embed._budget`), so that over all its jobs the service publishes
    an edit with no true gain with probability at most 1 - confidence. Written only when set."""
    test_budget: TestBudget = "campaign"
    """``campaign``: the confirmation spends this campaign's alpha; ``store``: a share of
    the test split's budget in the store, which every ``store`` campaign on the same test
    cases shares (its level becomes ``error_budget``). Written only when ``store``."""
    focus: Focus = "all"
    feedback_split: FeedbackSplit = "train"
    """Whose results the optimizer sees: ``train`` (honest; carved from val when the dataset
    has none, see `campaign._splits`) or ``val`` (the gate's own cases: val is optimistic)."""
    protected: tuple[ShortText, ...] = Field(default=(), max_length=64)
    required_files: tuple[ShortText, ...] = Field(default=(), max_length=64)
    max_growth_bytes: int = Field(default=MAX_GROWTH_BYTES, ge=0)
    screening: bool = False
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    campaign_id: Name | None = None
    example: Name | None = None
    plugins: dict[PluginRole, Name] = Field(default_factory=dict)
    """The roles whose value named an installed plugin when the run was laid out, with the
    plugin's name (``{"judge": "myjudge"}``): set by evolane, not a flag. A resume or
    re-judge refuses to run without them rather than read such a value as a command
    template (`campaign._models.check_recorded_plugins`). Empty in a run.json written
    before plugins were recorded."""

    @property
    def run_commands(self) -> CommandSettings:
        """`commands` as the run's commands get them: the store, the target and the dataset
        hidden from every one (`CommandSettings.hidden`), with the copies of the held-out
        cases found in their folders (`campaign._copies`: ``commands.hidden``)."""
        paths = (self.store, self.target, self.dataset, *self.from_trajectory)
        if self.target:  # the run's lock beside it (found by hostile review: a command given
            paths += (str(lock_path(Path(self.target))),)  # its folder unlinked it)
        paths += self.commands.hidden
        hidden = tuple(os.path.abspath(path) for path in paths if path)
        return self.commands.model_copy(update={"hidden": hidden})

    @property
    def guarded(self) -> tuple[str, ...]:
        """The protected globs in force: ``protected``, then the file of the target that the
        judge, the validator or the publish check runs as its program (``python3
        {candidate}/grade.py``): what scores or checks a candidate is not the candidate's to
        edit (found by review: an optimizer that rewrote ``grade.py`` to print a score of 1
        was accepted, confirmed on the test split and published)."""
        found = []
        checks = (self.measure.judge, "judge"), (self.validator, "validator"), (self.check, "check")
        for spec, role in checks:
            if not spec or role in self.plugins or llm_model(spec) is not None:
                continue
            with contextlib.suppress(TemplateError):
                template = CommandTemplate.parse(spec, role=role, allowed=ALL_PLACEHOLDERS)
                found.append(tree_program(template))
        extra = [glob for glob in found if glob is not None and glob not in self.protected]
        return (*self.protected, *dict.fromkeys(extra))

    @property
    def pass_fail(self) -> bool:
        """Whether every score is 0 or 1 by construction: no judge command or model (exact
        match, or a case's verification command). The test of "no true gain" then counts
        full gains against losses (`stats.full_gain_p_value`), else it bets on the means."""
        return self.measure.judge is None

    def identity(self) -> dict[str, object]:
        """What a campaign may not change between cycles: target, dataset, replay, judge
        (and a model judge's rubric, by its digest), its error control, confidence and
        test budget (its cycles share one level: a cycle run with ``none`` chose a best that
        a later ``online`` cycle published under a guarantee that never covered it, found by
        review), and its feedback split (a cycle fed val fitted the val cases that a later
        train cycle carved from and called honest, found by review)."""
        identity: dict[str, object] = {
            "target": self.target,
            "dataset": self.dataset,
            "replay": self.measure.replay,
            "judge": self.measure.judge,
            "error_control": self.error_control,
            "confidence": f"{self.gate.confidence:g}",
            "test_budget": self.test_budget,
            "feedback_split": self.feedback_split,
        }
        if self.models.rubric is not None:
            identity["rubric"] = hashlib.sha256(self.models.rubric.encode()).hexdigest()
        return identity

    @model_validator(mode="after")
    def _has_cases(self) -> Self:
        if not self.dataset and not self.from_trajectory:
            raise ValueError("give dataset or from_trajectory")
        if self.error_budget is not None and self.error_budget > 1.0 - self.gate.confidence:
            raise ValueError("error_budget must not exceed 1 - confidence")
        return self

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A validated copy; ``update`` may name flat keys or whole settings models."""
        flat = _flatten(dict(update), self.parts) if update else None
        return super().model_copy(update=flat, deep=deep)

    @model_validator(mode="wrap")
    @classmethod
    def _read_flat(cls, data: Any, handler: ModelWrapValidatorHandler[Self]) -> Self:
        if isinstance(data, Mapping):
            data = _nest(data, cls.parts)
        try:
            return handler(data)
        except ValidationError as error:
            raise _flat_errors(error, cls.parts, cls.__name__) from None

    @model_serializer(mode="wrap")
    def _write_flat(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        flat = _flatten(handler(self), self.parts)
        if not self.from_trajectory:  # written only when used: older records read the same
            flat.pop("from_trajectory", None)
            flat.pop("group", None)
        if self.error_budget is None:
            flat.pop("error_budget", None)
        if self.test_budget == "campaign":  # the default, as records before it ran
            flat.pop("test_budget", None)
        if self.commands.max_procs_asked is None:  # a share of the host's: this start's only
            flat.pop("max_procs_asked", None)
        return flat

    @classmethod
    def __get_pydantic_json_schema__(
        cls, core_schema: CoreSchema, handler: GetJsonSchemaHandler
    ) -> JsonSchemaValue:
        schema = handler(core_schema)
        body = handler.resolve_ref_schema(schema)
        properties, required = {}, list(body.get("required", []))
        for name, value in body["properties"].items():
            if name not in cls.parts:
                properties[name] = value
                continue
            part = handler.resolve_ref_schema(value)
            properties.update(part["properties"])
            required = [r for r in required if r != name] + list(part.get("required", []))
        body["properties"], body["required"] = properties, required
        return schema


STORED_DEFAULTS: dict[str, str | None] = {
    "feedback_split": LEGACY_FEEDBACK_SPLIT,
    "error_control": "legacy",
    **STORED_LIMITS,
}
"""What a stored config without each key ran with (it was written before the key existed):
a run from before the command limits ran its commands without any."""


def with_stored_defaults(data: Any, keys: tuple[str, ...] = tuple(STORED_DEFAULTS)) -> Any:
    """``data`` (a stored config) with each of ``keys`` it lacks set to what it ran with
    (`STORED_DEFAULTS`); anything else as given."""
    if not isinstance(data, Mapping):
        return data
    missing = {key: STORED_DEFAULTS[key] for key in keys if key not in data}
    return {**data, **missing} if missing else data


def _nest(data: Mapping[str, Any], parts: Mapping[str, type[Record]]) -> dict[str, Any]:
    """``data`` with each part's flat keys gathered under the part's name (a part given
    whole is taken as it is; giving it both ways is refused)."""
    nested = dict(data)
    for name, model in parts.items():
        flat = {key: nested.pop(key) for key in model.model_fields if key in nested}
        if name in nested:
            if flat:
                raise ValueError(f"give {name} whole or as its flat keys, not both")
            continue
        nested[name] = flat
    return nested


def _flatten(data: dict[str, Any], parts: Mapping[str, type[Record]]) -> dict[str, Any]:
    """``data`` with each part (a model or a dict) spread into flat keys, in place."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if key not in parts:
            flat[key] = value
        elif isinstance(value, Record):
            flat.update({name: getattr(value, name) for name in type(value).model_fields})
        else:
            flat.update(value)
    return flat


def _flat_errors(
    error: ValidationError, parts: Mapping[str, type[Record]], title: str
) -> ValidationError:
    """``error`` with every location inside a part made flat (``measure.replay_timeout``
    -> ``replay_timeout``), as the flags and the stored records name it."""
    details: list[InitErrorDetails] = []
    for line in error.errors():
        loc = line["loc"]
        if len(loc) > 1 and loc[0] in parts:
            loc = loc[1:]
        detail = InitErrorDetails(type=line["type"], loc=loc, input=line["input"])
        if "ctx" in line:
            detail["ctx"] = line["ctx"]
        details.append(detail)
    try:
        return ValidationError.from_exception_data(title, details)
    except (KeyError, TypeError, ValueError):  # an error type that cannot be rebuilt
        return error
