"""Trajectory conversations: turns are clustered by their messages whatever their session
ids say (API logs give every call its own id), a stock opening joins no conversations, and
near-duplicate inputs are one case; simulated logs show no held-out case inside train."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from evolane.campaign._markdown import trajectory_lines
from evolane.inputs import Case, ingest_trajectories

SYSTEM = {"role": "system", "content": "You are a helpful agent."}
GREETING = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello! How can I help?"},
]


def _write(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _calls(
    conversations: int, turns: int, seed: int, *, ids: bool, greeting: bool, branches: int = 1
) -> list[dict[str, Any]]:
    """API-call logs: each call logs the conversation so far, then its own request and
    answer (``ids``: every call its own session id; ``greeting``: every conversation opens
    with the same "Hi", logged as a call of its own; ``branches``: the last turn asked in
    that many ways, an edited message), shuffled."""
    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []

    def log(messages: list[dict[str, str]], status: str) -> None:
        row: dict[str, Any] = {"messages": [SYSTEM, *messages], "target": "agent"}
        row["outcome"] = {"status": status}
        if ids:
            row["session_id"] = f"chatcmpl-{rnd.getrandbits(64):016x}"
        rows.append(row)

    for c in range(conversations):
        history: list[dict[str, str]] = []
        if greeting:
            log(GREETING, "unknown")
            history += GREETING
        for t in range(turns):
            asks = range(branches) if t == turns - 1 else range(1)
            for b in asks:
                asked = f"conversation {c} step {t} way {b}: {rnd.random()}"
                ask = {"role": "user", "content": asked}
                said = {"role": "assistant", "content": f"ANSWER-{c}-{t}-{b}"}
                log([*history, ask, said], "failure" if rnd.random() < 0.3 else "success")
            history += [ask, said]
    rnd.shuffle(rows)
    return rows


def _texts(case: Case) -> list[str]:
    assert isinstance(case.input, dict) and isinstance(case.input["messages"], list)
    return [" ".join(str(m["content"]).split()).casefold() for m in case.input["messages"]]  # type: ignore[index]


def _leaks(cases: list[Case]) -> int:
    """Held-out (val or test) cases whose messages are a prefix of a train case's, or that
    extend one: the optimizer saw that case, or the conversation it goes on from."""
    train = [_texts(c) for c in cases if c.split == "train"]
    count = 0
    for case in cases:
        mine = _texts(case)
        if case.split != "train" and any(
            other[: len(mine)] == mine or mine[: len(other)] == other for other in train
        ):
            count += 1
    return count


@pytest.mark.parametrize("seed", range(3))
def test_calls_with_an_id_each_are_dealt_by_conversation(tmp_path: Path, seed: int) -> None:
    """Found by review: a recorder that gives every call its own id (OpenAI-style logs,
    LangSmith or Langfuse exports) made each call a session, so turn k+1 in train held
    turn k of val or test and its answer, or went on from it: 85 val and test cases of
    150 (seed 0)."""
    rows = _calls(30, 5, seed, ids=True, greeting=False)
    derived = ingest_trajectories([_write(tmp_path / "calls.jsonl", rows)], seed=seed)
    cases = list(derived.dataset)
    assert len(cases) == 150
    assert _leaks(cases) == 0
    clusters = Counter(str(c.metadata["cluster"]) for c in cases)
    assert len(clusters) == 30 and set(clusters.values()) == {5}
    assert {c.split for c in cases} == {"train", "val", "test"}
    assert derived.summary.clusters.startswith("30 conversations dealt whole")
    assert "; 120 sessions (or records without one) joined to an earlier one's" in (
        derived.summary.clusters
    )


@pytest.mark.parametrize("ids", [False, True])
def test_a_stock_greeting_opens_conversations_without_joining_them(
    tmp_path: Path, ids: bool
) -> None:
    """Found by review: keyed on the first user message, every conversation that opened
    with the same "Hi" was one cluster, dealt whole to val: no train, no test. The
    greeting's own call (its input and answer in every conversation) is left out."""
    rows = _calls(20, 3, 7, ids=ids, greeting=True)
    derived = ingest_trajectories([_write(tmp_path / "calls.jsonl", rows)])
    cases = list(derived.dataset)
    assert len(cases) == 60 and _leaks(cases) == 0
    assert len({c.metadata["cluster"] for c in cases}) == 20
    dealt = Counter(split for split, _ in {(c.split, c.metadata["cluster"]) for c in cases})
    assert dealt["val"] >= 6 and dealt["train"] >= 6 and dealt["test"] >= 3, dealt
    kept = derived.summary.shared[0]
    assert "stock opening (a greeting or template) of 20 conversations" in kept.reason
    assert len(derived.summary.shared) == 20  # each conversation's call of the greeting


def test_a_greeting_without_a_call_of_its_own_joins_nothing(tmp_path: Path) -> None:
    """The greeting shown by the interface, logged only ahead of the first real call:
    still no cluster of every conversation."""
    rows = [row for row in _calls(20, 3, 8, ids=False, greeting=True) if len(row["messages"]) > 3]
    cases = list(ingest_trajectories([_write(tmp_path / "calls.jsonl", rows)]).dataset)
    assert len({c.metadata["cluster"] for c in cases}) == 20 and _leaks(cases) == 0


def test_an_edited_last_turn_stays_in_its_conversation(tmp_path: Path) -> None:
    """Two ways of asking one turn (a message edited, a call retried) are near copies of
    each other: one conversation, not a stock opening."""
    rows = _calls(10, 3, 9, ids=True, greeting=False, branches=2)
    derived = ingest_trajectories([_write(tmp_path / "calls.jsonl", rows)])
    cases = list(derived.dataset)
    assert len(cases) == 40 and not derived.summary.shared
    assert Counter(Counter(str(c.metadata["cluster"]) for c in cases).values()) == {4: 10}


def test_sessions_opening_with_one_request_stay_apart(tmp_path: Path) -> None:
    """Sessions with ids of their own that each open with "Hi" (their turns not logging
    earlier ones) are as many clusters: the same first request joins no sessions."""
    rows = []
    for s in range(12):
        for t, text in enumerate(["Hi", f"task {s}", f"and then {s}"]):
            said = [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
            rows.append({"session_id": f"s{s}", "turn": t, "messages": said, "target": "T"})
            rows[-1]["outcome"] = {"status": "failure" if s % 3 == 0 else "success"}
    cases = list(ingest_trajectories([_write(tmp_path / "t.jsonl", rows)]).dataset)
    assert len({c.metadata["cluster"] for c in cases}) == 12
    assert {c.split for c in cases} == {"train", "val", "test"}


def test_dataset_from_trajectory_reports_the_clusters_and_warns_of_one_that_dominates(
    tmp_path: Path,
) -> None:
    rows = _calls(3, 2, 1, ids=True, greeting=False)
    rows += [{"task": f"alone {n}", "target": "agent", "outcome": {"status": "failure"}}
             for n in range(2)]  # fmt: skip
    long = [{"role": "user", "content": "step 0"}]
    for t in range(1, 12):  # one conversation of 12 calls
        rows.append({"messages": [*long], "target": "agent"})
        long += [{"role": "assistant", "content": f"a{t}"}]
        long += [{"role": "user", "content": f"step {t}"}]
    _write(tmp_path / "calls.jsonl", rows)
    command = [sys.executable, "-c", "from evolane.cli import main; main()", "dataset",
               "from-trajectory", "calls.jsonl", "-o", "cases.jsonl"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("clusters: ")]
    assert line.startswith("clusters: 6 conversations dealt whole (")
    assert "1-11 cases each (the largest: conversation:L" in line
    assert "; 13 sessions (or records without one) joined to an earlier one's" in line
    assert line.endswith("; warning: one conversation holds 11 of 19 cases")


def _tree(seed: int) -> list[dict[str, Any]]:
    """API-call logs of random conversation trees, an id per call: some open with a stock
    greeting, some turns are asked in two or three ways (edits), shuffled."""
    rnd = random.Random(seed)
    rows: list[dict[str, Any]] = []

    def grow(history: list[dict[str, str]], name: str, depth: int) -> None:
        ways = rnd.choice([1, 1, 1, 2, 3]) if depth else 1
        for way in range(ways):
            ask = {"role": "user", "content": f"{name} turn {depth} way {way}"}
            said = {"role": "assistant", "content": f"ANSWER {name} {depth} {way}"}
            row = {"session_id": f"call-{rnd.getrandbits(64):x}", "target": "agent"}
            row["outcome"] = {"status": rnd.choice(["success", "failure"])}
            rows.append(row | {"messages": [*history, ask, said]})
            if depth < rnd.randint(1, 4):
                grow([*history, ask, said], f"{name}.{way}", depth + 1)

    for c in range(rnd.randint(8, 30)):
        grow(list(GREETING) if rnd.random() < 0.5 else [], f"c{c}", 0)
    rnd.shuffle(rows)
    return rows


@pytest.mark.parametrize("seed", range(6))
def test_no_held_out_case_sits_in_a_train_input_on_random_conversation_trees(
    tmp_path: Path, seed: int
) -> None:
    rows = _tree(seed)
    cases = list(ingest_trajectories([_write(tmp_path / "t.jsonl", rows)], seed=seed).dataset)
    assert _leaks(cases) == 0
    assert {c.split for c in cases} == {"train", "val", "test"}


def test_the_report_lists_a_stock_opening_and_the_clusters(tmp_path: Path) -> None:
    rows = _calls(6, 2, 3, ids=True, greeting=True)
    summary = ingest_trajectories([_write(tmp_path / "calls.jsonl", rows)]).summary
    lines = trajectory_lines(summary)
    assert "Left out: a stock opening of many conversations (6):" in lines
    assert lines[-1].startswith("- clusters: 6 conversations dealt whole (")
