"""Builds a real measurement pipeline over the sleeper workload for tests and benchmarks."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from evolane.examples.sleeper.commands import main as sleeper
from evolane.inputs import Dataset, load_dataset
from evolane.measure import CommandSettings, Ledger, MeasureContext, MeasureSettings
from evolane.measure._journal import RunJournal
from evolane.measure._pipeline import Pipeline, open_pipeline
from evolane.messages import ArtifactRef, GateConfig, MeasureRequest
from evolane.sandbox import SandboxHost, open_sandbox
from evolane.store import BlobStore, snapshot_tree
from evolane.supervisors import open_runtime

PY = sys.executable
REPLAY = (
    f"{PY} -m evolane.examples.sleeper replay --case-file {{case_file}} "
    "--candidate {candidate} --output-dir {output_dir} --seed {seed}"
)
JUDGE = (
    f"{PY} -m evolane.examples.sleeper judge --case-file {{case_file}} "
    "--output-dir {output_dir} --seed {seed}"
)


@dataclass
class Bench:
    """A running pipeline plus the trees and store to drive it."""

    pipeline: Pipeline
    host: SandboxHost
    store: BlobStore
    dataset: Dataset
    root: Path

    def tree(self, effect: float, variant: str | None = None) -> ArtifactRef:
        """A candidate tree whose true effect is ``effect``."""
        folder = self.root / f"tree-{effect}-{variant}"
        if not folder.exists():
            shutil.copytree(self.root / "work" / "target", folder)
            data: dict[str, Any] = {"effect": effect}
            if variant is not None:
                data["variant"] = variant
            (folder / "effect.json").write_text(json.dumps(data))
        return snapshot_tree(self.store, folder)


@asynccontextmanager
async def _closing(journal: RunJournal | None) -> AsyncIterator[None]:
    try:
        yield
    finally:
        if journal is not None:
            journal.close()


@asynccontextmanager
async def sleeper_bench(
    root: Path,
    *,
    cases: int = 16,
    median: float = 0.05,
    spread: float = 0.0,
    sleeper_args: tuple[str, ...] = (),
    **config: Any,
) -> AsyncIterator[Bench]:
    """A sleeper dataset (all cases in ``val`` by moving them there) and a pipeline over it."""
    work = root / "work"
    assert (
        sleeper(
            [
                "init",
                str(work),
                "--cases",
                str(cases),
                "--median-seconds",
                str(median),
                "--spread",
                str(spread),
                *sleeper_args,
            ]
        )
        == 0
    )
    rows = [json.loads(line) for line in (work / "dataset.jsonl").read_text().splitlines()]
    for row in rows:
        row["split"] = "val"
    (work / "dataset.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    dataset = load_dataset(work / "dataset.jsonl")
    store = BlobStore(root / "store")
    journal_path = config.pop("journal_path", None)
    journal = RunJournal(journal_path) if journal_path is not None else None
    ledger = Ledger(**{k: config.pop(k) for k in ("ceilings", "cold_start") if k in config})
    seed = config.pop("seed", 0)
    settings = MeasureSettings(**{"replay": REPLAY, "judge": JUDGE, **config})
    commands, context = (
        CommandSettings(kill_grace=0.2, isolation="process"),
        MeasureContext(journal),
    )
    async with (
        _closing(journal),
        open_sandbox(root / "sandbox", store=store) as host,
        open_runtime() as runtime,
        open_pipeline(
            runtime,
            host,
            store,
            dataset,
            settings,
            commands=commands,
            context=context,
            ledger=ledger,
            seed=seed,
        ) as pipe,
    ):
        yield Bench(pipe, host, store, dataset, root)


@dataclass
class TwoTrees:
    """A pipeline over ``rows`` with two trees that differ by one file, and the request that
    measures one against the other with full evaluation."""

    pipeline: Pipeline
    host: SandboxHost
    store: BlobStore
    request: MeasureRequest


@asynccontextmanager
async def two_trees(
    root: Path,
    rows: list[dict[str, Any]],
    settings: MeasureSettings,
    context: MeasureContext,
    commands: CommandSettings | None = None,
) -> AsyncIterator[TwoTrees]:
    """``rows`` as ``root/d.jsonl``, trees ``root/t1`` and ``root/t2``, and a pipeline over
    them (sandbox under ``root/sb``, store under ``root/store``)."""
    (root / "d.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in rows))
    for arm in ("t1", "t2"):
        (root / arm).mkdir()
        (root / arm / "skill.md").write_text(f"rules of {arm}")
    store = BlobStore(root / "store")
    async with (
        open_sandbox(root / "sb", store=store) as host,
        open_runtime() as runtime,
        open_pipeline(
            runtime,
            host,
            store,
            load_dataset(root / "d.jsonl"),
            settings,
            commands=commands,
            context=context,
        ) as pipeline,
    ):
        request = MeasureRequest(
            measurement_id="m",
            baseline_ref=snapshot_tree(store, root / "t1"),
            candidate_ref=snapshot_tree(store, root / "t2"),
            gate=GateConfig(sequential=False),
        )
        yield TwoTrees(pipeline, host, store, request)
