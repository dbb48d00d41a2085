"""Honest splits (DESIGN §6): ``train`` feeds the optimizer, ``val`` decides, ``test`` confirms.

The optimizer is shown the parent's results on the *feedback* split only: its failing cases,
their reasons and the context folder. With ``--feedback-split train`` (the default) that is
the dataset's ``train`` split, so the gate decides on val cases the optimizer never saw.

A dataset without ``train`` cases gets one carved out of its val cases: `TRAIN_SHARE` of them
(one third, rounded down), chosen by a seeded hash of the case ids (`stats.case_order` under
a seed derived from the run's), so the carve depends only on the ids and the seed. The test
split is never touched. The carve is recorded (`SplitPlan`, in ``run.json`` and
``campaign.json``): a resume, and a later cycle of the campaign, use the same cases.

No carve is made when it would leave the optimizer fewer than `MIN_TRAIN_CASES` cases, or
leave val too small for the gate to ever accept (`stats.can_ever_accept`: the coverage
guard's minimum and the gate's bar). Then val feeds the optimizer, and the live view and the
report say that val scores are optimistic, as they say when ``--feedback-split val`` asks
for it. A run stored before this existed fed back val; it resumes that way.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from fractions import Fraction

import orjson
from pydantic import Field

from evolane.campaign._config import CampaignConfig, FeedbackSplit
from evolane.campaign._estimate import repetitions_for
from evolane.inputs import SPLITS, Dataset, quote
from evolane.messages import Record, ShortText, Text

TRAIN_SHARE = Fraction(1, 3)
"""The share of val cases a carve moves to train (rounded down): enough failures for the
optimizer to learn from, while val keeps two thirds of its power to decide."""
MIN_TRAIN_CASES = 4
"""The fewest cases a carve gives train: fewer rarely show the optimizer a failure at all."""
_MANY = 1_000_000
_SHARE_WORDS = {Fraction(1, 3): "one third"}


class SplitPlan(Record):
    """Which split fed the optimizer, how many cases each split has, and the carve (if any)."""

    requested: FeedbackSplit
    """What ``--feedback-split`` asked for."""
    feedback: FeedbackSplit
    """The split whose results the optimizer saw."""
    train_cases: int = Field(ge=0)
    val_cases: int = Field(ge=0)
    test_cases: int = Field(ge=0)
    carved: bool = False
    """Whether train was carved out of val (the dataset has no train cases)."""
    carve_seed: int | None = Field(default=None, ge=0)
    carve_share: ShortText = ""
    carved_ids: tuple[ShortText, ...] = Field(default=(), max_length=_MANY)
    """The val cases the carve moved to train, in file order."""
    note: Text = ""
    """The warning when val fed the optimizer (its scores are then optimistic)."""
    repeats: Text = ""
    """The warning when cases outside train repeat an input (`repeated_input`)."""

    @property
    def optimistic(self) -> bool:
        """Whether the optimizer saw the cases the gate decides on."""
        return self.feedback == "val"

    def splits(self, in_file: Mapping[str, Sequence[str]]) -> dict[str, tuple[str, ...]]:
        """The case ids of each split as measurements read them: the dataset's (``in_file``),
        with the carved cases moved from val to train."""
        out = {name: tuple(ids) for name, ids in in_file.items()}
        if self.carved:
            moved = set(self.carved_ids)
            out["train"] = tuple(self.carved_ids)
            out["val"] = tuple(i for i in out.get("val", ()) if i not in moved)
        return out

    def split_of(self, in_file: Mapping[str, Sequence[str]]) -> dict[str, str]:
        """Each case id's split as measurements read them (`splits`)."""
        return {case: name for name, ids in self.splits(in_file).items() for case in ids}

    def sentence(self) -> str:
        """The splits in one line, for the live view and the report (`note` says more)."""
        if self.carved:
            train = (
                f"train {self.train_cases} (carved from val: {self.carve_share}, "
                f"seed {self.carve_seed})"
            )
        else:
            train = f"train {self.train_cases}"
        return (
            f"{self.feedback} feeds the optimizer; {train}, val {self.val_cases} decides, "
            f"test {self.test_cases} confirms"
        )


def _in_clusters(why: str, grouped: bool) -> str:
    """The gate's refusal said of clusters when it counts them."""
    if not grouped:
        return why
    return why.replace(" val cases", " val clusters").replace(
        " comparable cases", " comparable clusters"
    )


def split_ids(dataset: Dataset) -> dict[str, tuple[str, ...]]:
    """The case ids of each split as the dataset file assigns them."""
    return {name: dataset.split_ids(name) for name in SPLITS}


def carve(
    val_ids: Sequence[str], seed: int, clusters: Mapping[str, str] | None = None
) -> tuple[str, ...]:
    """The val cases a carve under ``seed`` moves to train (`TRAIN_SHARE`, rounded down), in
    the order given: a function of the set of ids and ``seed`` alone. Clustered cases
    (``clusters``: case id -> cluster, `inputs.case_clusters`) move whole clusters, in a
    seeded order of the clusters, until the share is reached: a session split across train
    and val would show the optimizer the turns of a conversation the gate decides on."""
    from evolane.stats import case_order, clustered, seed_for  # numpy: where a carve is made

    count = int(len(val_ids) * TRAIN_SHARE)
    order = seed_for(seed, "train-carve")
    if not clustered(val_ids, clusters):
        chosen = set(case_order(val_ids, order)[:count])
        return tuple(case_id for case_id in val_ids if case_id in chosen)
    assert clusters is not None
    members: dict[str, list[str]] = {}
    for case_id in val_ids:
        members.setdefault(clusters.get(case_id, "case:" + case_id), []).append(case_id)
    chosen = set()
    for name in case_order(members, order):
        if len(chosen) >= count:
            break
        chosen.update(members[name])
    return tuple(case_id for case_id in val_ids if case_id in chosen)


def plan_splits(
    config: CampaignConfig,
    in_file: Mapping[str, Sequence[str]],
    *,
    seed: int,
    rows: Iterable[tuple[str, bytes]] = (),
    clusters: Mapping[str, str] | None = None,
) -> SplitPlan:
    """The splits of a new run of ``config`` on a dataset whose splits hold ``in_file`` (case
    ids by split); a carve uses ``seed`` and moves whole ``clusters`` (`carve`). The cases'
    ``rows`` (id and canonical JSON) are checked for repeated inputs (`repeated_input`:
    ``repeats``)."""
    plan = _plan(config, in_file, seed, clusters)
    warning = repeated_input(rows, plan.split_of(in_file))
    return plan.model_copy(update={"repeats": warning[:2048]}) if warning else plan


def _plan(
    config: CampaignConfig,
    in_file: Mapping[str, Sequence[str]],
    seed: int,
    clusters: Mapping[str, str] | None = None,
) -> SplitPlan:
    train, val = tuple(in_file.get("train", ())), tuple(in_file.get("val", ()))
    test = len(in_file.get("test", ()))
    counts = {"train_cases": len(train), "val_cases": len(val), "test_cases": test}
    requested = config.feedback_split
    if requested == "val":
        note = (
            "--feedback-split val: the optimizer saw the val cases the gate decides on, so val "
            "scores are optimistic (the test split is the honest one)"
        )
        return SplitPlan(requested="val", feedback="val", note=note, **counts)
    if train:
        return SplitPlan(requested="train", feedback="train", **counts)
    from evolane.stats import CLUSTERED_GATES, can_ever_accept, clustered, count_clusters

    carved = carve(val, seed, clusters)
    left = len(val) - len(carved)
    kept = [case_id for case_id in val if case_id not in set(carved)]
    units = left  # what the gate counts: clusters, for a gate with a level
    if config.gate.gate in CLUSTERED_GATES and clustered(kept, clusters):
        units = count_clusters(kept, clusters)
    possible, why = can_ever_accept(config.gate, units, repetitions_for(config, left))
    if len(carved) < MIN_TRAIN_CASES or not possible:
        reason = (
            f"it would give train {len(carved)} cases (fewer than {MIN_TRAIN_CASES})"
            if len(carved) < MIN_TRAIN_CASES
            else f"with {left} val cases left, {_in_clusters(why, units != left).rstrip('.')}"
        )
        note = (
            f"no train split, and carving one from {len(val)} val cases is not worth it "
            f"({reason}): val feeds the optimizer, so val scores are optimistic; add train cases"
        )
        return SplitPlan(requested="train", feedback="val", note=note[:2048], **counts)
    return SplitPlan(
        requested="train",
        feedback="train",
        train_cases=len(carved),
        val_cases=left,
        test_cases=test,
        carved=True,
        carve_seed=seed,
        carve_share=_SHARE_WORDS.get(TRAIN_SHARE, str(TRAIN_SHARE)),
        carved_ids=carved,
    )


def repeated_input(rows: Iterable[tuple[str, bytes]], split_of: Mapping[str, str]) -> str:
    """A warning when cases have the same ``input`` and are not all train cases ("" when
    none do); ``rows``: each case's id and canonical JSON, ``split_of``: each id's split
    once carved. A replay reads the input, so in two splits the optimizer would see a case
    the gate or the confirmation judges, and in one the gate would count one task twice
    (cases are the independent sample, DESIGN §6); unless the replay tells the cases apart
    by id (``EVOLANE_CASE_ID``), which is why this warns and does not refuse."""
    first: dict[bytes, tuple[str, str]] = {}
    pairs, shown = 0, ""
    for case_id, row in rows:
        text = orjson.dumps(orjson.loads(row).get("input"), option=orjson.OPT_SORT_KEYS)
        split = split_of[case_id]
        key = hashlib.blake2b(text, digest_size=16).digest()
        earlier, before = first.setdefault(key, (case_id, split))
        if earlier == case_id or before == split == "train":
            continue
        pairs += 1
        if not shown and before == split:
            shown = f"{split} cases {quote(earlier)} and {quote(case_id)} have the same input"
        elif not shown:
            shown = (
                f"{split} case {quote(case_id)} has the same input as {before} case "
                f"{quote(earlier)}"
            )
    if not pairs:
        return ""
    more = f" ({pairs} such cases)" if pairs > 1 else ""
    return (
        f"{shown}{more}: unless the replay tells them apart by id, the optimizer sees cases "
        "the gate judges or the gate counts a task twice; drop repeats or make them train"
    )


def legacy_plan(in_file: Mapping[str, Sequence[str]]) -> SplitPlan:
    """The splits of a run stored before honest splits existed: val fed the optimizer."""
    return SplitPlan(
        requested="val",
        feedback="val",
        train_cases=len(in_file.get("train", ())),
        val_cases=len(in_file.get("val", ())),
        test_cases=len(in_file.get("test", ())),
        note="this run began before honest splits: val fed the optimizer, so val is optimistic",
    )
